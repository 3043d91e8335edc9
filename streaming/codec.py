"""Decoding click-log messages into columnar :class:`~hetgmp.streaming.types.ClickBatch` values.

A Kafka message holds one record or many newline-separated records; both decode the same way,
because every message of a poll is joined into one buffer and split into lines together. The
whole batch is decoded with numpy over that buffer (field boundaries from the positions of tabs
and newlines, integers parsed digit column by digit column, categoricals hashed by
:func:`hetgmp.streaming.hashing.hash_spans`), so the cost per record is a handful of vector operations,
not a Python loop over records and fields. Python touches single lines only on the error path
(non-ASCII bytes to validate, JSON lines that fail to parse).

A record that cannot be decoded becomes a :class:`~hetgmp.streaming.types.Reject` with its reason; the
records around it decode as usual. Empty lines are not records (a trailing newline is common);
a message with no record at all is rejected as ``empty_message``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np

from hetgmp.streaming.hashing import field_seeds, hash_spans
from hetgmp.streaming.lists import (
    DEFAULT_SEPARATOR,
    MAX_MAGNITUDE,
    Jagged,
    in_range,
    jagged_ids,
    select_rows,
)
from hetgmp.streaming.types import ClickBatch, Reject, RejectReason, Schema, dense_features

__all__ = ["FORMATS", "Decoder", "Decoded", "DecodeConfig"]

FORMATS = ("tsv", "json", "arrow")

_NL, _CR, _TAB, _MINUS, _ZERO = 10, 13, 9, 45, 48
# An int64 holds any 18-digit decimal; longer dense values are rejected rather than wrapped.
_MAX_DIGITS = 18
# Longer dense values than this are rejected before a float parse looks at them.
_MAX_NUMBER_BYTES = 40
_SLACK = 8
_MISSING_LABEL = "a label the schema requires is missing (empty or absent)"
_BAD_DENSE = (f"dense values must be finite numbers (of magnitude at most {MAX_MAGNITUDE:g} "
              "where the transform is none)")
_BAD_WEIGHT = {
    "tsv": "every value of a weighted field carries its weight (id:weight), a number of "
           f"magnitude at most {MAX_MAGNITUDE:g}",
    "json": "a weighted field's values come with their weights (an array under the field's "
            f"weights key, as long as the values) of magnitude at most {MAX_MAGNITUDE:g}",
}


@dataclass(frozen=True)
class DecodeConfig:
    """How records are decoded.

    Attributes:
        format: ``tsv`` (Criteo: label, dense..., sparse..., tab separated), ``json`` (one
            object per line, keys = schema field names) or ``arrow`` (one Arrow IPC record
            batch per message, see :mod:`hetgmp.streaming.arrow`).
        max_record_bytes: longer records are rejected as ``too_large`` before any parsing (an
            Arrow message: more than this many bytes a record).
        value_separator: TSV: the character between a list field's values (see
            :mod:`hetgmp.streaming.lists`).
    """

    format: Literal["tsv", "json", "arrow"] = "tsv"
    max_record_bytes: int = 65536
    value_separator: str = DEFAULT_SEPARATOR

    def __post_init__(self) -> None:
        sep = self.value_separator
        if len(sep) != 1 or not sep.isascii() or sep in "\t\n\r:" or sep.isalnum():
            raise ValueError(f"value separator {sep!r}: one ASCII character that is not a "
                             "letter, a digit, a colon, a tab or a newline")


@dataclass(frozen=True)
class Decoded:
    """What :meth:`Decoder.decode` returns: the good records, and the rejected ones."""

    batch: ClickBatch
    rejects: list[Reject] = field(default_factory=list)
    truncated: dict[str, int] = field(default_factory=dict)  # values past max_len, by field


@dataclass
class _Lines:
    """Lines of the joined buffer, after the checks common to every format."""

    buf: np.ndarray  # uint8 view of the joined messages
    starts: np.ndarray  # int64 [L] start of each surviving line
    ends: np.ndarray  # int64 [L] end (exclusive, without \r\n)
    message: np.ndarray  # int64 [L] index of the message each line came from


class Decoder:
    """Decodes lists of message payloads into a :class:`ClickBatch` plus rejects."""

    def __init__(self, schema: Schema | None = None, config: DecodeConfig | None = None) -> None:
        self.schema = schema or Schema()
        self.config = config or DecodeConfig()
        if self.config.format not in FORMATS:
            raise ValueError(f"unknown record format {self.config.format!r} "
                             f"({', '.join(FORMATS)})")
        self._seeds = field_seeds(self.schema.tables)
        self._jagged = bool(self.schema.multi_valued)
        self._separator = ord(self.config.value_separator)
        self._truncated: dict[str, int] = {}
        self._log1p = self.schema.log1p
        self._arrow = None
        if self.config.format == "arrow":
            from hetgmp.streaming.arrow import ArrowDecoder  # pyarrow is heavy: loaded when used

            self._arrow = ArrowDecoder(self.schema, self.config.max_record_bytes)

    def decode(
        self,
        payloads: Sequence[bytes | None],
        partitions: Sequence[int] | np.ndarray | None = None,
        offsets: Sequence[int] | np.ndarray | None = None,
        timestamps_ms: Sequence[int] | np.ndarray | None = None,
    ) -> Decoded:
        """Decode messages; the Kafka coordinates of message ``i`` apply to all its records.

        Args:
            payloads: message values (``None``, a tombstone, counts as an empty message).
            partitions: Kafka partition of each message, or None (-1).
            offsets: Kafka offset of each message, or None (-1).
            timestamps_ms: Kafka timestamp of each message, or None (-1).
        """
        n = len(payloads)
        meta = [
            np.full(n, -1, np.int64) if a is None else np.asarray(a, dtype=np.int64)
            for a in (partitions, offsets, timestamps_ms)
        ]
        rejects: list[Reject] = []
        kept: list[int] = []
        for i, p in enumerate(payloads):
            if not p or p.isspace():
                rejects.append(Reject(RejectReason.EMPTY_MESSAGE, p or b"", int(meta[0][i]), int(meta[1][i])))
            else:
                kept.append(i)
        if not kept:
            return Decoded(ClickBatch.empty(self.schema), rejects)
        kept_idx = np.asarray(kept, dtype=np.int64)
        self._truncated = {}
        if self._arrow is not None:
            good = [payloads[i] for i in kept]
            batch = self._arrow.decode(good, kept_idx, meta, rejects)  # type: ignore[arg-type]
            return Decoded(batch, rejects, self._arrow.truncated)
        lines = self._split([payloads[i] for i in kept], kept_idx, meta, rejects)  # type: ignore[misc]
        if self.config.format == "tsv":
            batch = self._decode_tsv(lines, meta, rejects)
        else:
            batch = self._decode_json(lines, meta, rejects)
        return Decoded(batch, rejects, self._truncated)

    # -- common line handling ------------------------------------------------------------------

    def _split(
        self,
        payloads: list[bytes],
        kept_idx: np.ndarray,
        meta: list[np.ndarray],
        rejects: list[Reject],
    ) -> _Lines:
        # Eight zero bytes of slack after the last newline let the hashing read whole words.
        joined = b"\n".join(payloads) + b"\n" + bytes(_SLACK)
        buf = np.frombuffer(joined, dtype=np.uint8)
        sizes = np.array(list(map(len, payloads)), dtype=np.int64) + 1
        msg_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        nl = np.flatnonzero(buf == _NL)
        starts = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)
        ends = nl.astype(np.int64)
        has_cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == _CR)
        ends = ends - has_cr
        message = kept_idx[np.searchsorted(msg_starts, starts, side="right") - 1]
        nonempty = ends > starts
        bad = np.zeros(starts.size, dtype=np.int8)  # 0 = ok, else index into reasons below
        reasons = [None, RejectReason.TOO_LARGE, RejectReason.INVALID_UTF8]
        bad[(ends - starts) > self.config.max_record_bytes] = 1
        high = np.flatnonzero(buf >= 0x80)
        if high.size:
            # Only lines holding non-ASCII bytes need a real UTF-8 check; Criteo logs have none.
            for line in np.unique(np.searchsorted(nl, high)):
                if bad[line] == 0:
                    try:
                        joined[starts[line] : ends[line]].decode("utf-8")
                    except UnicodeDecodeError:
                        bad[line] = 2
        for line in np.flatnonzero(bad):
            m = message[line]
            rejects.append(
                Reject(
                    reasons[bad[line]],  # type: ignore[arg-type]
                    joined[starts[line] : ends[line]],
                    int(meta[0][m]),
                    int(meta[1][m]),
                )
            )
        keep = nonempty & (bad == 0)
        return _Lines(buf, starts[keep], ends[keep], message[keep])

    def _reject_rows(
        self,
        lines: _Lines,
        rows: np.ndarray,
        reason: RejectReason,
        meta: list[np.ndarray],
        rejects: list[Reject],
        detail: str = "",
    ) -> None:
        data = lines.buf
        # The detail travels in a Kafka header: text that UTF-8 can carry (a JSON record may
        # hold a lone surrogate, quoted in a parse error's message).
        detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")
        for r in rows:
            m = lines.message[r]
            rejects.append(
                Reject(
                    reason,
                    data[lines.starts[r] : lines.ends[r]].tobytes(),
                    int(meta[0][m]),
                    int(meta[1][m]),
                    detail,
                )
            )

    def _sparse(self, lines: _Lines, rows: np.ndarray, buf: np.ndarray, starts: np.ndarray,
                ends: np.ndarray, meta: list[np.ndarray], rejects: list[Reject],
                separator: int | None = None, bad_rows: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """The ids of ``[R, S]`` sparse spans: ``(rows kept, ids [R, S])`` for a schema of one
        value a field, else ``(rows kept, (values, lengths, weights))``, the records over a
        ``max_len`` that rejects or with a bad weight dead-lettered (``bad_rows``: bool ``[R]``
        records whose weights the format's own parse found wrong)."""
        if not self._jagged:
            return rows, hash_spans(buf, starts, ends, self._seeds, slack=True)
        j: Jagged = jagged_ids(buf, starts, ends, self.schema, self._seeds,
                               self._separator if separator is None else separator, _parse_floats)
        for name, n in j.truncated.items():
            self._truncated[name] = self._truncated.get(name, 0) + n
        self._reject_rows(lines, rows[j.too_many], RejectReason.TOO_MANY_VALUES, meta, rejects,
                          "a field has more values than its max_len")
        bad_weight = (j.bad_weight if bad_rows is None else j.bad_weight | bad_rows) & ~j.too_many
        self._reject_rows(lines, rows[bad_weight], RejectReason.BAD_WEIGHT, meta, rejects,
                          _BAD_WEIGHT[self.config.format])
        keep = np.flatnonzero(~(j.too_many | bad_weight))
        return rows[keep], select_rows(j, keep)

    def _assemble(
        self,
        lines: _Lines,
        rows: np.ndarray,
        labels: np.ndarray,
        dense_raw: np.ndarray,
        sparse: np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray | None],
        meta: list[np.ndarray],
    ) -> ClickBatch:
        msg = lines.message[rows]
        dense = dense_features(dense_raw, self._log1p)
        where = dict(partitions=meta[0][msg].astype(np.int32), offsets=meta[1][msg],
                     timestamps_ms=meta[2][msg])
        if isinstance(sparse, np.ndarray):
            return ClickBatch.of_ids(labels.astype(np.float32), dense, sparse, **where)
        values, lengths, weights = sparse
        return ClickBatch(labels=labels.astype(np.float32), dense=dense, values=values,
                          lengths=lengths, weights=weights, **where)

    # -- TSV ---------------------------------------------------------------------------------------

    def _decode_tsv(
        self, lines: _Lines, meta: list[np.ndarray], rejects: list[Reject]
    ) -> ClickBatch:
        buf, starts, ends = lines.buf, lines.starts, lines.ends
        n_fields = self.schema.num_fields
        n_dense = len(self.schema.dense)
        tabs = np.flatnonzero(buf == _TAB)
        n = starts.size
        t = None
        if tabs.size == n * (n_fields - 1):
            # Fast path: if every line has exactly F-1 tabs, row r of this reshape is line r's tabs;
            # a row whose first/last tab falls outside its line proves some line's count is off.
            t = tabs.reshape(n, n_fields - 1)
            if not ((t[:, 0] >= starts).all() and (t[:, -1] < ends).all()):
                t = None
        if t is None:
            # Tabs inside line r are tabs[first[r]:first[r] + count[r]] (both sorted).
            first = np.searchsorted(tabs, starts)
            counts = np.searchsorted(tabs, ends) - first
            wrong = counts != n_fields - 1
            self._reject_rows(
                lines,
                np.flatnonzero(wrong),
                RejectReason.WRONG_FIELD_COUNT,
                meta,
                rejects,
                f"expected {n_fields} tab-separated fields",
            )
            rows = np.flatnonzero(~wrong)
            if rows.size == 0:
                return ClickBatch.empty(self.schema)
            t = tabs[first[rows, None] + np.arange(n_fields - 1)]
        else:
            rows = np.arange(n)
        f_starts = np.concatenate([starts[rows, None], t + 1], axis=1)
        f_ends = np.concatenate([t, ends[rows, None]], axis=1)

        tasks = self.schema.tasks  # the first columns: one label a task
        label_len = f_ends[:, :tasks] - f_starts[:, :tasks]
        label_byte = buf[f_starts[:, :tasks]]
        missing = (label_len == 0).any(axis=1)
        label_ok = ((label_len == 1) & ((label_byte == _ZERO) | (label_byte == _ZERO + 1))
                    ).all(axis=1)
        dense_raw, dense_ok = _parse_numbers(buf, f_starts[:, tasks : tasks + n_dense],
                                             f_ends[:, tasks : tasks + n_dense])
        if not self._log1p.all():  # values trained as they are: within float32's reach
            dense_ok &= in_range(dense_raw[:, ~self._log1p]).all(axis=1)
        self._reject_rows(lines, rows[missing], RejectReason.MISSING_LABEL, meta, rejects,
                          _MISSING_LABEL)
        self._reject_rows(lines, rows[~label_ok & ~missing], RejectReason.BAD_LABEL, meta,
                          rejects, "label must be 0 or 1")
        bad_dense = label_ok & ~dense_ok
        self._reject_rows(lines, rows[bad_dense], RejectReason.BAD_DENSE, meta, rejects, _BAD_DENSE)
        good = label_ok & dense_ok
        if not good.all():
            rows, f_starts, f_ends = rows[good], f_starts[good], f_ends[good]
            dense_raw, label_byte = dense_raw[good], label_byte[good]
        kept, sparse = self._sparse(lines, rows, buf, f_starts[:, tasks + n_dense:],
                                    f_ends[:, tasks + n_dense:], meta, rejects)
        if kept.size < rows.size:
            at = np.searchsorted(rows, kept)
            dense_raw, label_byte = dense_raw[at], label_byte[at]
        labels = (label_byte - _ZERO).astype(np.float32)
        if tasks == 1:
            labels = labels[:, 0]
        return self._assemble(lines, kept, labels, dense_raw, sparse, meta)

    # -- JSON lines ------------------------------------------------------------------------------

    def _decode_json(
        self, lines: _Lines, meta: list[np.ndarray], rejects: list[Reject]
    ) -> ClickBatch:
        # Each line is parsed by the json module; what follows (integer checks, hashing) is
        # vectorised like the TSV path, over one buffer holding every categorical value.
        schema = self.schema
        n = lines.starts.size
        labels = np.zeros((n, schema.tasks), np.float32)
        dense = np.zeros((n, len(schema.dense)), np.float64)
        missing = np.zeros(n, dtype=bool)
        values: list[bytes] = []
        ok = np.ones(n, dtype=bool)
        bad_weights = np.zeros(n, dtype=bool)  # weights missing, or not one a value
        for r in range(n):
            raw = lines.buf[lines.starts[r] : lines.ends[r]].tobytes()
            try:
                obj = json.loads(raw)
                if not isinstance(obj, dict):
                    raise ValueError("a record must be a JSON object")
                row_labels = [obj.get(name) for name in schema.labels]
                if any(v is None for v in row_labels):
                    missing[r] = True
                    continue
                for label in row_labels:
                    if label not in (0, 1) or isinstance(label, float) and label not in (0., 1.):
                        raise ValueError(f"label must be 0 or 1, got {label!r}")
                row_dense = [_json_number(obj.get(name), not log1p)
                             for name, log1p in zip(schema.dense, self._log1p)]
                row_values: list[bytes] = []
                for f in schema.sparse_fields:
                    if not f.multi_valued:
                        row_values.append(_json_str(obj.get(f.name)))
                        continue
                    joined, weights_ok = _json_list(obj.get(f.name), obj.get(f.weights)
                                                    if f.weighted else None, f.weighted)
                    row_values.append(joined)
                    bad_weights[r] |= not weights_ok
            except (ValueError, TypeError, RecursionError) as exc:
                # RecursionError: nesting deeper than the json module parses ('[' * 30000).
                detail = ("nested too deeply" if isinstance(exc, RecursionError)
                          else str(exc)[:200])
                ok[r] = False
                self._reject_rows(lines, np.array([r]), RejectReason.BAD_JSON, meta, rejects,
                                  detail)
                continue
            labels[r] = row_labels
            dense[r] = row_dense
            values.extend(row_values)
        self._reject_rows(lines, np.flatnonzero(missing), RejectReason.MISSING_LABEL, meta,
                          rejects, _MISSING_LABEL)
        ok &= ~missing
        if schema.tasks == 1:
            labels = labels[:, 0]
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return ClickBatch.empty(schema)
        sizes = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
        v_ends = np.cumsum(sizes).reshape(rows.size, len(schema.sparse))
        v_starts = v_ends - sizes.reshape(v_ends.shape)
        vbuf = np.frombuffer(b"".join(values) + bytes(_SLACK), dtype=np.uint8)
        kept, sparse = self._sparse(lines, rows, vbuf, v_starts, v_ends, meta, rejects,
                                    _JSON_SEPARATOR, bad_weights[rows])
        return self._assemble(lines, kept, labels[kept], dense[kept], sparse, meta)


def _json_number(v: object, bounded: bool) -> float:
    """A dense value of a JSON record: a number, or a string of one; missing is 0. A
    ``bounded`` one (trained as it is) is at most :data:`MAX_MAGNITUDE` in magnitude."""
    if v is None or v == "":
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"dense value must be a number, got {v!r}")
    if isinstance(v, str) and len(v) > _MAX_NUMBER_BYTES:
        raise ValueError(f"dense value longer than {_MAX_NUMBER_BYTES} characters: {v[:40]}")
    try:
        value = float(v)
    except OverflowError:  # an integer past a float's range
        raise ValueError(f"dense value out of range: {str(v)[:40]}") from None
    if not math.isfinite(value):
        raise ValueError(f"dense value must be finite, got {v!r}")
    if bounded and abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"dense value of magnitude over {MAX_MAGNITUDE:g} (transform none): "
                         f"{str(v)[:40]}")
    return value


# JSON list values are joined by a byte that a JSON value carries only escaped, if ever.
_JSON_SEPARATOR = 0x1F


def _json_list(v: object, weights: object, weighted: bool) -> tuple[bytes, bool]:
    """A list field of a JSON record (an array of scalars, or one scalar), its values joined
    by :data:`_JSON_SEPARATOR`, each ``value:weight`` in a weighted field; and whether the
    weights (an array as long as the values; a scalar is an array of one) came one a value.
    Empty values are no values, and their weights go with them."""
    items = [] if v is None else v if isinstance(v, list) else [v]
    values = [_json_str(x) for x in items]
    if any(_JSON_SEPARATOR in x for x in values):
        raise ValueError("a list value holds the byte 0x1f")
    given = [] if weights is None else weights if isinstance(weights, list) else [weights]
    if not weighted or len(given) != len(values):  # weights missing, or not one a value
        # Values alone: the list parse counts them (max_len) and finds no weights.
        return bytes([_JSON_SEPARATOR]).join(values), not weighted
    # Each weight as text, for the list parse to read and check as it does a TSV one.
    return bytes([_JSON_SEPARATOR]).join(x + b":" + _json_weight(w)
                                         for x, w in zip(values, given) if x), True


def _json_weight(w: object) -> bytes:
    """A JSON weight as the text the list parse reads: a number (an integer too long for a
    float included: the parse refuses it), or a string of one; anything else, or a string
    that could end the value early, is text that no number parse takes."""
    if isinstance(w, (int, float)) and not isinstance(w, bool):
        return repr(w).encode()
    if isinstance(w, str) and ":" not in w and chr(_JSON_SEPARATOR) not in w:
        return w.encode("utf-8")
    return b"?"


def _json_str(v: object) -> bytes:
    if v is None:
        return b""
    if isinstance(v, (dict, list)):
        raise ValueError(f"categorical value must be a scalar, got {type(v).__name__}")
    return str(v).encode("utf-8")


def _parse_numbers(buf: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse the dense values of ``[rows, D]`` byte spans; returns float64 ``(values, row_ok)``.

    Integers (Criteo's counts) take :func:`_parse_ints`; only the spans it refuses are parsed
    again as decimal floats (``2.5``, ``-1e-3``), so a log of integers costs what it did.
    Empty spans are 0; NaN, infinities and anything else make the row's values bad.
    """
    ints, ok = _parse_ints(buf, starts, ends)
    values = ints.astype(np.float64)
    retry = ~ok
    if retry.any():
        floats, float_ok = _parse_floats(buf, starts[retry], ends[retry])
        values[retry] = floats
        ok[retry] = float_ok
    return values, np.asarray(ok.all(axis=1))


def _parse_floats(buf: np.ndarray, starts: np.ndarray,
                  ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decimal floats in 1-D byte spans; returns ``(values, ok)``. One gather of every span
    into a fixed-width byte string, then numpy's own parse of the lot (span by span only when
    the lot holds a bad one)."""
    lengths = ends - starts
    ok = (lengths > 0) & (lengths <= _MAX_NUMBER_BYTES)
    values = np.zeros(starts.shape, np.float64)
    if not ok.any():
        return values, ok
    width = int(lengths[ok].max())
    cols = np.arange(width)
    index = np.minimum(starts[:, None] + cols, buf.size - 1)
    chars = np.where(cols < lengths[:, None], buf[index], 0).astype(np.uint8)
    text = np.ascontiguousarray(chars).view(f"S{width}").ravel()
    try:
        parsed = text[ok].astype(np.float64)
    except ValueError:
        parsed = np.array([_float_or_nan(t) for t in text[ok]], np.float64)
    values[ok] = parsed
    ok[ok] = np.isfinite(parsed)
    values[~ok] = 0.0
    return values, ok


def _float_or_nan(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _parse_ints(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse decimal integers in byte spans; returns ``(values, ok)``, both of the spans' shape.
    Empty spans are 0.

    Values of up to 8 digits (nearly all of them in click logs) are parsed eight bytes at a time:
    one unaligned 64-bit gather per span, then SWAR arithmetic (pairs, quads, octets of digits).
    ``buf`` must have 8 readable bytes after the last span. Longer values take a digit-column
    loop over just those spans. No loop runs over records or fields.
    """
    if starts.size == 0:
        return np.zeros(starts.shape, np.int64), np.ones(starts.shape, dtype=bool)
    lengths = ends - starts
    neg = (lengths > 0) & (buf[starts] == _MINUS)
    pos = starts + neg
    digits = lengths - neg
    ok = ~(neg & (digits == 0)) & (digits <= _MAX_DIGITS)
    words_at = np.ndarray(shape=(buf.size - 7,), dtype="<u8", buffer=buf.data, strides=(1,))
    short = np.minimum(digits, 8)
    word = words_at[np.minimum(pos, buf.size - 8)]
    # Keep the first `short` bytes of each word (the digits); the rest become '0' characters
    # shifted in at the top, which is the same as leading zeros once the digits are right-aligned.
    keep_bits = (short * 8).astype(np.uint64)
    keep = np.where(short >= 8, np.uint64(_M64), (np.uint64(1) << (keep_bits & np.uint64(63))) - np.uint64(1))
    word &= keep
    # Every kept byte must be an ASCII digit: fill the dropped bytes with '0', then each byte's
    # high nibble must be 3 and its low nibble + 6 must not carry into the high nibble.
    filled = word | (np.uint64(_ASCII_ZEROS) & ~keep)
    high_ok = (filled & np.uint64(0xF0F0F0F0F0F0F0F0)) == np.uint64(_ASCII_ZEROS)
    low_ok = ((filled & np.uint64(0x0F0F0F0F0F0F0F0F)) + np.uint64(0x0606060606060606)) & np.uint64(
        0xF0F0F0F0F0F0F0F0
    ) == 0
    ok &= high_ok & low_ok
    # Subtract '0' from the digit bytes only (no borrow: each is >= '0' once validated); invalid
    # spans are rejected whole, so their garbage values do not matter.
    with np.errstate(over="ignore"):
        d = word - (np.uint64(_ASCII_ZEROS) & keep)
        shift = ((8 - short) * 8).astype(np.uint64)
        d = np.where(short > 0, d << (shift & np.uint64(63)), np.uint64(0))
        d = (d * np.uint64(10) + (d >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
        d = (d * np.uint64(100) + (d >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
        d = (d * np.uint64(10000) + (d >> np.uint64(32))) & np.uint64(0x00000000FFFFFFFF)
    value = d.astype(np.int64)
    longer = np.flatnonzero((digits > 8).ravel() & ok.ravel())
    if longer.size:
        flat, flat_ok = value.ravel(), ok.ravel()
        flat[longer], flat_ok[longer] = _parse_long(buf, pos.ravel()[longer], digits.ravel()[longer])
        value, ok = flat.reshape(value.shape), flat_ok.reshape(ok.shape)
    value = np.where(neg, -value, value)
    return value, ok


def _parse_long(buf: np.ndarray, pos: np.ndarray, digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values of 9..18 digits, one digit column at a time; returns ``(values, ok)``."""
    value = np.zeros(pos.shape, np.int64)
    ok = np.ones(pos.shape, dtype=bool)
    for p in range(int(digits.max())):
        active = digits > p
        d = buf[pos + np.minimum(p, digits - 1)].astype(np.int64) - _ZERO
        ok &= ~active | ((d >= 0) & (d <= 9))
        value = np.where(active, value * 10 + d, value)
    return value, ok


_M64 = (1 << 64) - 1
_ASCII_ZEROS = 0x3030303030303030
