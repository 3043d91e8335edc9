"""Arrow record batches as a message format: one Arrow IPC stream (a schema and one record batch)
per Kafka message.

A message carries a block of records column by column, so decoding is a handful of array
operations per message, whatever its number of records, and no text is parsed:

* ``label``: any integer, boolean or floating column, every value 0 or 1;
* each dense field: an integer or float column (null = missing, as an empty TSV field; NaN or
  an infinity dead-letters the record, as does a magnitude over
  :data:`~hetgmp.streaming.lists.MAX_MAGNITUDE` on a ``transform = "none"`` field), through the
  field's transform exactly as the TSV decoder does (``log(1 + max(x, 0))`` by default);
* each sparse field either a string or binary column of the raw values, hashed as the TSV decoder
  hashes them (so a record decodes to the same ids in either format; null = empty), or an integer
  column of feature ids already hashed (non-negative; taken as they are, without a copy until the
  fields are stacked into the batch's ``[B, S]`` matrix), or a list of either for a field of
  many values;
* a weighted field's weights: a list column of numbers named by the field's ``weights``
  (``<field>_weights`` by default), one weight a value.

Columns are found by the schema's field names; other columns are ignored. What cannot be decoded is
dead-lettered like a bad TSV line: bytes that are not an Arrow IPC stream, or stop short, as
``bad_arrow`` (the whole message); a missing column or one of a wrong type as ``arrow_schema``
(the whole message, with the column named in the detail; a weighted field's weights column
too: a field the schema weighs never trains with weights nobody sent); a record whose label is
not 0/1 as ``bad_label``, one whose pre-hashed id is null or negative as ``bad_id`` and one
whose weights are not one a value, each a number in range, as ``bad_weight`` (that record only,
as a one-row Arrow message, so it can be replayed).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from hetgmp.streaming.hashing import field_seeds, hash_spans
from hetgmp.streaming.lists import MAX_MAGNITUDE, arrange, in_range, select_rows
from hetgmp.streaming.types import (
    ClickBatch,
    Reject,
    RejectReason,
    Schema,
    dense_features,
)

__all__ = ["ArrowDecoder", "batch_to_arrow", "encode_arrow", "ipc_message", "sparse_columns"]


def encode_arrow(
    schema: Schema,
    labels: np.ndarray,
    dense: np.ndarray,
    ids: np.ndarray,
    rows_per_message: int,
    lengths: np.ndarray | None = None,
) -> list[bytes]:
    """Messages of ``rows_per_message`` records each (the last may hold fewer).

    Args:
        schema: field names of the columns.
        labels: ``[B]`` 0/1 labels (written as int8), ``[B, T]`` for a schema of T labels.
        dense: ``[B, D]`` raw integer features, negative where missing (written as int32
            when they fit).
        ids: int64 ``[B, S]`` feature ids, already hashed (see :mod:`hetgmp.streaming.hashing`);
            with ``lengths``, the batch's jagged values (``ClickBatch.values``).
        rows_per_message: records per message.
        lengths: int32 ``[B, S]`` values of each (record, field), or None (one each); a
            multi-valued field of the schema is then a ``list<int64>`` column.
    """
    if lengths is not None:
        listed = sparse_columns(schema, np.asarray(ids, np.int64), lengths, None)
        head = pa.RecordBatch.from_pydict({
            **_label_columns(schema, labels),
            **{name: pa.array(np.asarray(dense[:, j], np.int64))
               for j, name in enumerate(schema.dense)}, **listed})
        return [ipc_message(head.slice(lo, rows_per_message))
                for lo in range(0, head.num_rows, rows_per_message)]
    n = int(labels.shape[0])
    dense = np.asarray(dense, dtype=np.int64)
    # Counts are small: int32 where they fit (52 of a record's ~317 bytes saved on the wire).
    narrow = dense.size == 0 or (dense.min() >= -(2**31) and dense.max() < 2**31)
    dense_type = pa.int32() if narrow else pa.int64()
    fields = [pa.field(name, pa.int8(), nullable=False) for name in schema.labels]
    fields += [pa.field(name, dense_type, nullable=False) for name in schema.dense]
    fields += [pa.field(name, pa.int64(), nullable=False) for name in schema.sparse]
    arrow_schema = pa.schema(fields)
    # Column-major copies once, so that every message's columns are contiguous slices of them.
    columns = list(np.ascontiguousarray(_two_d(np.asarray(labels, np.int8)).T))
    columns += list(np.ascontiguousarray(dense.T, dtype=np.int32 if narrow else np.int64))
    columns += list(np.ascontiguousarray(np.asarray(ids, dtype=np.int64).T))
    out = []
    for lo in range(0, n, rows_per_message):
        hi = min(lo + rows_per_message, n)
        batch = pa.RecordBatch.from_arrays([pa.array(c[lo:hi]) for c in columns], schema=arrow_schema)
        out.append(ipc_message(batch))
    return out


def _label_columns(schema: Schema, labels: np.ndarray, dtype: type | None = np.int8
                   ) -> dict[str, pa.Array]:
    """Each label's column (``labels``: ``[B]``, or ``[B, T]`` for T labels)."""
    table = np.asarray(labels if dtype is None else np.asarray(labels, dtype))
    table = _two_d(table)
    return {name: pa.array(np.ascontiguousarray(table[:, t]))
            for t, name in enumerate(schema.labels)}


def _two_d(a: np.ndarray) -> np.ndarray:
    """``[B]`` as ``[B, 1]``; ``[B, T]`` as it is."""
    return a if a.ndim == 2 else a[:, None]


def sparse_columns(schema: Schema, values: np.ndarray, lengths: np.ndarray,
                   weights: np.ndarray | None) -> dict[str, pa.Array]:
    """A jagged batch's sparse part as Arrow columns: ``int64`` for a one-value field,
    ``list<int64>`` for one of many, and ``list<float>`` weights for a weighted one, in the
    column its ``weights`` names (ones where ``weights`` is None: a batch without weights
    weighs every value 1)."""
    b, s = lengths.shape
    # Value k belongs to field field_of[k]; a stable sort groups them by field keeping each
    # record's order.
    field_of = np.repeat(np.tile(np.arange(s), b), lengths.reshape(-1))
    order = np.argsort(field_of, kind="stable")
    by_field = values[order]
    by_weight = (np.ones(values.size, np.float32) if weights is None else weights)[order]
    per_field = lengths.T  # [S, B]
    ends = np.cumsum(per_field.sum(axis=1))
    out: dict[str, pa.Array] = {}
    for i, spec in enumerate(schema.sparse_fields):
        lo, hi = (int(ends[i - 1]) if i else 0), int(ends[i])
        if not spec.multi_valued:
            out[spec.name] = pa.array(by_field[lo:hi])
            continue
        offsets = pa.array(np.concatenate([[0], np.cumsum(per_field[i])]).astype(np.int32))
        out[spec.name] = pa.ListArray.from_arrays(offsets, pa.array(by_field[lo:hi]))
        if spec.weighted:
            out[spec.weights] = pa.ListArray.from_arrays(offsets, pa.array(by_weight[lo:hi]))
    return out


def batch_to_arrow(batch: ClickBatch, schema: Schema) -> pa.RecordBatch:
    """A decoded batch as a ``pyarrow.RecordBatch`` with one column per schema field (an
    ``int64`` column for a one-value field, ``list<int64>`` and a weighted field's
    ``list<float>`` weights for a field of many; see :func:`sparse_columns`), then its Kafka
    positions. (Was ``ClickBatch.to_arrow``: the values module imports nothing above it.)"""
    columns = {**_label_columns(schema, batch.labels, None),
               **{name: pa.array(batch.dense[:, i]) for i, name in enumerate(schema.dense)},
               **sparse_columns(schema, batch.values, batch.lengths, batch.weights)}
    columns.update({"kafka_partition": pa.array(batch.partitions),
                    "kafka_offset": pa.array(batch.offsets),
                    "kafka_timestamp_ms": pa.array(batch.timestamps_ms)})
    return pa.RecordBatch.from_pydict(columns)


def ipc_message(batch: pa.RecordBatch) -> bytes:
    """``batch`` as one message: an Arrow IPC stream of its schema and that one batch."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


class _Unusable(Exception):
    """The message as a whole cannot be decoded."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        # Column names are the sender's text: UTF-8 for the dead letter's header, whatever.
        self.reason = reason
        self.detail = detail.encode("utf-8", "backslashreplace").decode("utf-8")


class ArrowDecoder:
    """Decodes Arrow IPC messages into a :class:`ClickBatch` plus rejects."""

    def __init__(self, schema: Schema, max_record_bytes: int) -> None:
        self.schema = schema
        self.max_record_bytes = max_record_bytes
        self._seeds = field_seeds(schema.tables)
        self._log1p = schema.log1p
        self._jagged = bool(schema.multi_valued)
        self.truncated: dict[str, int] = {}  # of the last decode: list values past max_len

    def decode(
        self,
        payloads: Sequence[bytes],
        message: np.ndarray,
        meta: list[np.ndarray],
        rejects: list[Reject],
    ) -> ClickBatch:
        """Decode non-empty ``payloads``; ``message[i]`` is payload ``i``'s index in ``meta``.

        The messages of a poll that share a schema (all of them, usually) are checked once and
        decoded as one table: the cost per column is paid once a poll, not once a message.
        """
        self.truncated = {}
        # Grouped by equal schemas (compared, not hashed: hashing a schema costs a millisecond).
        Member = tuple[pa.RecordBatch, int, bytes]
        groups: list[tuple[pa.Schema, list[Member]]] = []
        for payload, m in zip(payloads, message):
            try:
                batch = _read(payload)
                if len(payload) > self.max_record_bytes * max(batch.num_rows, 1):
                    raise _Unusable(RejectReason.TOO_LARGE, f"{len(payload):,} bytes for "
                                    f"{batch.num_rows:,} records")
            except _Unusable as bad:
                rejects.append(Reject(bad.reason, payload, int(meta[0][m]), int(meta[1][m]),
                                      bad.detail))
                continue
            same = next((g for g in reversed(groups) if g[0].equals(batch.schema)), None)
            if same is None:
                members: list[Member] = []
                groups.append(same := (batch.schema, members))
            same[1].append((batch, int(m), payload))
        parts = []
        for arrow_schema, members in groups:
            try:
                kinds = self._check(arrow_schema)
            except _Unusable as bad:
                rejects.extend(Reject(bad.reason, payload, int(meta[0][m]), int(meta[1][m]),
                                      bad.detail) for _, m, payload in members)
                continue
            parts.append(self._decode_group(kinds, members, meta, rejects))
        if not parts:
            return ClickBatch.empty(self.schema)
        return ClickBatch.concat(parts)

    def _check(self, arrow_schema: pa.Schema) -> list[str]:
        """Each sparse field's kind (``ids`` or ``values``), or why the schema cannot be read."""
        s = self.schema
        types = dict(zip(arrow_schema.names, arrow_schema.types))

        def typed(name: str, what: str = "") -> pa.DataType:
            if name not in types:
                have = ", ".join(arrow_schema.names[:8]) + (", ..." if len(types) > 8 else "")
                raise _Unusable(RejectReason.ARROW_SCHEMA, f"no column {name!r}{what} "
                                f"(columns: {have})")
            if len(arrow_schema.get_all_field_indices(name)) > 1:
                raise _Unusable(RejectReason.ARROW_SCHEMA, f"column {name!r} appears more than "
                                "once")
            return types[name]

        for name in s.labels:
            if not (pat.is_integer(t := typed(name)) or pat.is_boolean(t)
                    or pat.is_floating(t)):
                raise _Unusable(RejectReason.ARROW_SCHEMA, f"column {name!r} is {t}, expected "
                                "an integer, boolean or float label")
        for name in s.dense:
            if not (pat.is_integer(t := typed(name)) or pat.is_floating(t)):
                raise _Unusable(RejectReason.ARROW_SCHEMA,
                                f"dense column {name!r} is {t}, expected integers or floats")
        kinds = []
        for spec in s.sparse_fields:
            name = spec.name
            t = typed(name)
            listed = pat.is_list(t) or pat.is_large_list(t)
            if listed and not spec.multi_valued:
                raise _Unusable(RejectReason.ARROW_SCHEMA, f"sparse column {name!r} is {t}, a "
                                "list, and the schema gives the field one value (max_len 1)")
            inner = t.value_type if listed else t
            if pat.is_integer(inner):
                kind = "ids"
            elif _is_text(inner):
                kind = "values"
            else:
                raise _Unusable(RejectReason.ARROW_SCHEMA, f"sparse column {name!r} is {t}, "
                                "expected integer ids or string values (or lists of them)")
            kinds.append(kind + ("_list" if listed else ""))
            if spec.weighted:
                weights = spec.weights
                w = typed(weights, f" of weights for the weighted field {name!r}")
                if not ((pat.is_list(w) or pat.is_large_list(w)) and (
                        pat.is_floating(w.value_type) or pat.is_integer(w.value_type))):
                    raise _Unusable(RejectReason.ARROW_SCHEMA, f"column {weights!r} is {w}, "
                                    "expected a list of numbers")
        return kinds

    def _decode_group(self, kinds: list[str], members: list[tuple[pa.RecordBatch, int, bytes]],
                      meta: list[np.ndarray], rejects: list[Reject]) -> ClickBatch:
        s = self.schema
        table = pa.Table.from_batches([b for b, _, _ in members])
        n = table.num_rows
        rows_of = np.array([b.num_rows for b, _, _ in members], np.int64)
        msg = np.repeat(np.array([m for _, m, _ in members], np.int64), rows_of)

        def column(name: str, null: int, to: pa.DataType = _FLOAT64) -> np.ndarray:
            chunks = table.column(name).chunks
            if any(c.null_count for c in chunks):
                # A boolean label cannot hold the fill 2, an unsigned id not -1: those take
                # ``to`` first (unchecked: an id past int64 wraps negative and is refused).
                chunks = [(pc.cast(c, to, safe=False) if pat.is_boolean(c.type) or (
                    null < 0 and pat.is_unsigned_integer(c.type)) else c).fill_null(null)
                    for c in chunks]
            parts = [c.to_numpy(zero_copy_only=False) for c in chunks]
            return parts[0] if len(parts) == 1 else np.concatenate(parts)

        # A null label is a missing one; the fill 2 keeps it out of the good ones.
        missing = np.zeros(n, dtype=bool)
        for name in s.labels:
            missing |= table.column(name).is_null().to_numpy(zero_copy_only=False)
        labels = column(s.label, 2) if s.tasks == 1 else \
            np.stack([column(name, 2) for name in s.labels], axis=1)
        good = np.asarray(_two_d((labels == 0) | (labels == 1)).all(axis=1), dtype=bool)
        # Column-major first (each field a contiguous write), one transpose into [B, F] after.
        dense_t = np.empty((len(s.dense), n), np.float64)
        for j, name in enumerate(s.dense):
            dense_t[j] = column(name, 0)
        bad_dense = good & ~(np.isfinite(dense_t).all(axis=0)
                             & in_range(dense_t[~self._log1p]).all(axis=0))
        if self._jagged:
            return self._decode_lists(table, kinds, labels, good, missing, dense_t, bad_dense,
                                      msg, rows_of, members, meta, rejects)
        ids_t = np.empty((len(s.sparse), n), np.int64)
        for j, (name, kind) in enumerate(zip(s.sparse, kinds)):
            if kind == "ids":
                ids_t[j] = column(name, -1, pa.int64())
            else:
                ids_t[j] = np.concatenate([self._hash(c, j) for c in table.column(name).chunks])
        bad_id = good & ~bad_dense & (ids_t < 0).any(axis=0)
        keep = good & ~bad_dense & ~bad_id
        if not keep.all():
            _reject_records(((RejectReason.MISSING_LABEL, missing, _MISSING_LABEL),
                             (RejectReason.BAD_LABEL, ~good & ~missing, "label must be 0 or 1"),
                             (RejectReason.BAD_DENSE, bad_dense, _BAD_DENSE),
                             (RejectReason.BAD_ID, bad_id, _BAD_ID)),
                            rows_of, msg, members, meta, rejects)
            labels, dense_t, ids_t, msg = labels[keep], dense_t[:, keep], ids_t[:, keep], msg[keep]
        return ClickBatch.of_ids(
            labels=labels.astype(np.float32),
            dense=dense_features(dense_t.T, self._log1p),
            ids=np.ascontiguousarray(ids_t.T),
            partitions=meta[0][msg].astype(np.int32),
            offsets=meta[1][msg],
            timestamps_ms=meta[2][msg],
        )

    def _decode_lists(self, table: pa.Table, kinds: list[str], labels: np.ndarray,
                      good: np.ndarray, missing: np.ndarray, dense_t: np.ndarray,
                      bad_dense: np.ndarray,
                      msg: np.ndarray, rows_of: np.ndarray, members: list, meta: list[np.ndarray],
                      rejects: list[Reject]) -> ClickBatch:
        """:meth:`_decode_group` for a schema with list fields: every field's values as
        ``(record, field, id, weight)`` entries, laid out by :func:`hetgmp.streaming.lists.arrange`."""
        s, n = self.schema, table.num_rows
        recs, flds, ids, weights, weight_ok = [], [], [], [], []
        bad_id = np.zeros(n, dtype=bool)
        bad_weight_rows = np.zeros(n, dtype=bool)
        for j, (spec, kind) in enumerate(zip(s.sparse_fields, kinds)):
            col = table.column(spec.name).combine_chunks()
            if kind.endswith("_list"):
                lengths = pc.list_value_length(col).fill_null(0).to_numpy().astype(np.int64)
                flat = pc.list_flatten(col)
            else:
                lengths, flat = np.ones(n, np.int64), col
            rec = np.repeat(np.arange(n), lengths)
            if kind.startswith("ids"):
                got = pc.cast(flat, pa.int64(), safe=False).fill_null(-1).to_numpy(
                    zero_copy_only=False)
                bad_id[rec[got < 0]] = True
                present = np.ones(got.size, dtype=bool)
            else:
                got = self._hash(flat, j)
                # An empty or null value in a list is no value (as between two TSV commas).
                present = (pc.binary_length(flat).fill_null(0).to_numpy() > 0
                           if kind.endswith("_list") else np.ones(got.size, dtype=bool))
            w = np.ones(got.size, np.float32)
            ok = np.ones(got.size, dtype=bool)
            if spec.weighted:  # _check made sure the column is there
                wcol = table.column(spec.weights).combine_chunks()
                wlen = pc.list_value_length(wcol).fill_null(0).to_numpy().astype(np.int64)
                values = pc.cast(pc.list_flatten(wcol), pa.float64(), safe=False).fill_null(
                    np.nan).to_numpy(zero_copy_only=False)
                same = wlen == lengths
                bad_weight_rows |= ~same  # weights not one a value (an empty bag's included)
                wrec = np.repeat(np.arange(n), wlen)
                pick = same[wrec]
                fine = in_range(values[pick])
                # Out-of-range weights are not cast (float32 would overflow): they reject.
                w[same[rec]] = np.where(fine, values[pick], 1.0)
                ok[same[rec]] = fine
            recs.append(rec[present])
            flds.append(np.full(int(present.sum()), j, np.int64))
            ids.append(got[present])
            weights.append(w[present])
            weight_ok.append(ok[present])
        weighted = any(f.weighted for f in s.sparse_fields)
        jag = arrange(np.concatenate(recs), np.concatenate(flds), np.concatenate(ids),
                      np.concatenate(weights) if weighted else None,
                      np.concatenate(weight_ok) if weighted else None, n, s)
        for name, count in jag.truncated.items():
            self.truncated[name] = self.truncated.get(name, 0) + count
        bad_id &= good & ~bad_dense
        too_many = jag.too_many & good & ~bad_dense & ~bad_id
        bad_weight = (jag.bad_weight | bad_weight_rows) & good & ~bad_dense & ~bad_id & ~too_many
        keep = good & ~bad_dense & ~bad_id & ~too_many & ~bad_weight
        _reject_records(((RejectReason.MISSING_LABEL, missing, _MISSING_LABEL),
                         (RejectReason.BAD_LABEL, ~good & ~missing, "label must be 0 or 1"),
                         (RejectReason.BAD_DENSE, bad_dense, _BAD_DENSE),
                         (RejectReason.BAD_ID, bad_id, _BAD_ID),
                         (RejectReason.TOO_MANY_VALUES, too_many,
                          "a field has more values than its max_len"),
                         (RejectReason.BAD_WEIGHT, bad_weight,
                          f"a weighted field's values come with their weights (a list "
                          f"column as long as the values) of magnitude at most "
                          f"{MAX_MAGNITUDE:g}")),
                        rows_of, msg, members, meta, rejects)
        rows = np.flatnonzero(keep)
        kept_values, kept_lengths, kept_weights = select_rows(jag, rows)
        msg = msg[rows]
        return ClickBatch(labels=labels[rows].astype(np.float32),
                          dense=dense_features(dense_t[:, rows].T, self._log1p),
                          values=kept_values, lengths=kept_lengths, weights=kept_weights,
                          partitions=meta[0][msg].astype(np.int32), offsets=meta[1][msg],
                          timestamps_ms=meta[2][msg])

    def _hash(self, col: pa.Array, j: int) -> np.ndarray:
        """Ids of a string column, hashed from its data buffer (null = empty)."""
        col = col.fill_null(b"" if pat.is_binary(col.type) or pat.is_large_binary(col.type) else "")
        large = pat.is_large_string(col.type) or pat.is_large_binary(col.type)
        offsets_buf, data_buf = col.buffers()[1], col.buffers()[2]
        offsets = np.frombuffer(offsets_buf, np.int64 if large else np.int32)
        offsets = offsets[col.offset : col.offset + len(col) + 1].astype(np.int64)
        # The hash reads whole 8-byte words: a copy with slack after the last value.
        data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        buf = np.concatenate([data[: offsets[-1]], np.zeros(8, np.uint8)])
        return hash_spans(buf, offsets[:-1], offsets[1:], self._seeds[j : j + 1], slack=True)


_BAD_DENSE = (f"dense values must be finite numbers (of magnitude at most {MAX_MAGNITUDE:g} "
              "where the transform is none)")
_BAD_ID = "ids must be non-negative"
_MISSING_LABEL = "a label the schema requires is missing (null or no column value)"
_FLOAT64 = pa.float64()


def _reject_records(reasons: Sequence[tuple[RejectReason, np.ndarray, str]],
                    rows_of: np.ndarray, msg: np.ndarray, members: list,
                    meta: list[np.ndarray], rejects: list[Reject]) -> None:
    """Dead-letter each record a ``(reason, mask, detail)`` marks: its row alone as an Arrow
    message (records of a group are its members' batches one after the other)."""
    first_row = np.concatenate([[0], np.cumsum(rows_of)[:-1]])
    for reason, rows, detail in reasons:
        for r in np.flatnonzero(rows):
            k = int(np.searchsorted(first_row, r, side="right") - 1)
            m = msg[r]
            rejects.append(Reject(reason, _one_row(members[k][0], int(r - first_row[k])),
                                  int(meta[0][m]), int(meta[1][m]), detail))


def _is_text(t: pa.DataType) -> bool:
    return pat.is_string(t) or pat.is_binary(t) or pat.is_large_string(t) or \
        pat.is_large_binary(t)


def _read(payload: bytes) -> pa.RecordBatch:
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(payload))
        batches = list(reader)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _Unusable(RejectReason.BAD_ARROW, f"not an Arrow IPC stream: {exc}"[:200]) from None
    if len(batches) != 1:
        raise _Unusable(RejectReason.BAD_ARROW,
                        f"expected one record batch in the message, found {len(batches)}")
    batch = batches[0]
    try:
        batch.validate(full=True)  # offsets inside their buffers, before anything reads them
    except (pa.ArrowException, ValueError) as exc:
        raise _Unusable(RejectReason.BAD_ARROW, f"invalid record batch: {exc}"[:200]) from None
    return batch


def _one_row(batch: pa.RecordBatch, row: int) -> bytes:
    return ipc_message(batch.slice(row, 1))
