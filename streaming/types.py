"""Values and small interfaces of the streaming package: record schema, columnar batches, rejects."""

from __future__ import annotations

import difflib
import re
import reprlib
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

import numpy as np

__all__ = [
    "MAX_DIM",
    "MAX_FIELDS",
    "MAX_LEN",
    "DenseField",
    "Schema",
    "SchemaError",
    "SparseField",
    "ClickBatch",
    "Reject",
    "RejectReason",
    "dense_features",
]


POOLINGS = ("sum", "mean", "none")
TRANSFORMS = ("log1p", "none")
OVERFLOWS = ("truncate", "reject")
# Values one record may carry in one field. The decoders hold max_len as int64 and a bag's
# length as int32, and a million values is past what any sane --consumer-max-record-bytes lets
# a record carry (64 KiB by default: 32,768 one-digit values); 10**20 was accepted and then
# overflowed the decoder's int64.
MAX_LEN = 1_000_000
# Dense fields, and sparse fields, a schema may have (of each): a decoder lays out
# [batch, fields] arrays, and counts ('13,26' form) were unbounded, so a typo of a few digits
# asked for names until memory ran out. Criteo has 39 fields; large production models hundreds.
MAX_FIELDS = 10_000
# Labels (tasks) a schema may name: multi-task CTR models train a handful (click, conversion,
# like, share); each is a logit column and an AUC.
MAX_LABELS = 16
# Widest row a table may ask for (``dim``): FBGEMM's TBE kernels take up to 1,024 columns, and a
# typo of a few digits would otherwise ask for rows of gigabytes.
MAX_DIM = 4096
# Names a message lists before "and N more" (a duplicate among 10,000 fields was reported as an
# 89,047-character line).
_LISTED = 5


class SchemaError(ValueError):
    """A schema refused: the message is one line saying what and, where known, where.

    Attributes:
        kind: ``dense`` or ``sparse``: the kind of field it is about ("" if none).
        field: That field's name ("" if none).
        key: The setting it is about (``max_len``, ``table``, ...; "" if none).
    """

    def __init__(self, message: str, kind: str = "", field: str = "", key: str = "") -> None:
        super().__init__(message)
        self.kind, self.field, self.key = kind, field, key


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters, for messages: a name or a value from
    a file can be megabytes long, nested thousands deep, or an int too long for ``str``."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {int(value.bit_length() * 0.30103) + 1:,} digits"
    cut = reprlib.Repr()
    cut.maxstring = cut.maxother = limit
    cut.maxlevel, cut.maxdict, cut.maxlist = 2, 4, 4
    return cut.repr(value)


def listed(names: Sequence[str]) -> str:
    """The first few of ``names`` and how many more: ``'a', 'b', ... and 9,990 more``."""
    head = ", ".join(shown(n) for n in names[:_LISTED])
    return head if len(names) <= _LISTED else f"{head} and {len(names) - _LISTED:,} more"


@dataclass(frozen=True)
class SparseField:
    """A categorical field: the table its values look up, and how many a record may carry.

    Attributes:
        name: The field's name in the log.
        table: The embedding table its values name rows of; fields that share a table give the
            same id to the same value. Defaults to the field's name. A table no other field
            looks up is refused when it looks like a typo (:func:`table_typo`).
        max_len: Values a record may carry (1: exactly one, as in Criteo).
        pooling: How a record's values make one vector: ``sum`` or ``mean``; ``none`` keeps
            them a sequence of rows, padded to ``max_len`` (a model reads it from
            ``features.sequences``: DIN's history, a two-tower's clicks).
        weighted: Whether each value carries a weight (``id:weight``).
        weights: A weighted field's JSON key and Arrow/Parquet column of weights (defaults
            to ``<name>_weights``).
        on_overflow: Past ``max_len``: ``truncate`` (keep the first, count the rest) or
            ``reject`` (dead-letter the record).
        own_table: The table is this field's alone on purpose, however close its name is to
            another's: no typo check.
        dim: Width of the table's rows (0: ``--embed-dim``); the fields of a table agree on
            it, or all but one leave it out.
        first_order: Whether the table's rows carry a first-order (linear) weight besides
            their vector (None: as the model wants, which is on for ``deepfm`` and
            ``widedeep``); the fields of a table agree on it.
    """

    name: str
    table: str = ""
    max_len: int = 1
    pooling: str = "sum"
    weighted: bool = False
    on_overflow: str = "truncate"
    weights: str = ""
    own_table: bool = False
    dim: int = 0
    first_order: bool | None = None

    def __post_init__(self) -> None:
        def refuse(key: str, what: str) -> SchemaError:
            return SchemaError(what, "sparse", self.name, key)

        if not self.name:
            raise SchemaError("a sparse field needs a name", "sparse")
        if self.weights and not self.weighted:
            raise refuse("weights", "weights names a weighted field's weights: set weighted = true")
        if self.weighted and not self.weights:
            object.__setattr__(self, "weights", f"{self.name}_weights")
        if not self.table:
            object.__setattr__(self, "table", self.name)
        if not 1 <= self.max_len <= MAX_LEN:
            raise refuse("max_len", f"max_len must be from 1 to {MAX_LEN:,}, "
                                    f"not {shown(self.max_len)}")
        if self.pooling not in POOLINGS:
            raise refuse("pooling", f"pooling must be sum, mean or none, "
                                    f"not {shown(self.pooling)}")
        if self.weighted and self.pooling != "sum":
            raise refuse("pooling", "a weighted field pools by sum (weights scale the rows summed)")
        if self.on_overflow not in OVERFLOWS:
            raise refuse("on_overflow", f"on_overflow must be truncate or reject, "
                                        f"not {shown(self.on_overflow)}")
        if not 0 <= self.dim <= MAX_DIM:
            raise refuse("dim", f"dim must be from 1 to {MAX_DIM:,} (0: --embed-dim), "
                                f"not {shown(self.dim)}")

    @property
    def multi_valued(self) -> bool:
        """Whether a record may carry other than exactly one unweighted value."""
        return self.max_len > 1 or self.weighted


@dataclass(frozen=True)
class DenseField:
    """A numeric field and the transform its values go through (``log1p`` of the value
    clipped at 0, Criteo's counts; or ``none``)."""

    name: str
    transform: str = "log1p"

    def __post_init__(self) -> None:
        if not self.name:
            raise SchemaError("a dense field needs a name", "dense")
        if self.transform not in TRANSFORMS:
            raise SchemaError(f"transform must be log1p or none, not {shown(self.transform)}",
                              "dense", self.name, "transform")


@dataclass(frozen=True)
class Schema:
    """A click log's fields: its labels, ``dense`` numeric features, ``sparse`` categoricals.

    The default is Criteo's: ``label``, ``I1..I13``, ``C1..C26``. Feature ids hash a sparse
    field's *table* (its name unless the field says otherwise) with the value, so renaming a
    field changes its ids, reordering fields does not, and fields sharing a table share ids.
    ``dense`` and ``sparse`` are the names; ``dense_fields`` and ``sparse_fields`` the settings
    (one ``log1p`` value, and one value in a table of the field's name, unless given).
    ``label`` is the first task's label column; ``extra_labels`` name the columns of further
    tasks (a record's labels are ``labels``, 0 or 1 each, in that order; a multi-task model
    returns one logit column per label).

    Raises:
        SchemaError: More than :data:`MAX_FIELDS` dense or sparse fields, a name given twice,
            no sparse field, a weights column named as a field or another field's weights,
            or a table that looks like a typo (:func:`table_typo`).
    """

    label: str = "label"
    dense: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
    sparse: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
    dense_fields: tuple[DenseField, ...] = field(default=(), repr=False)
    sparse_fields: tuple[SparseField, ...] = field(default=(), repr=False)
    extra_labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for kind, given in (("dense", self.dense), ("sparse", self.sparse)):
            if len(given) > MAX_FIELDS:
                raise SchemaError(f"{len(given):,} {kind} fields: a schema has at most "
                                  f"{MAX_FIELDS:,} of each kind", kind)
        if len(self.extra_labels) >= MAX_LABELS:
            raise SchemaError(f"{len(self.labels):,} labels: a schema has at most "
                              f"{MAX_LABELS} tasks", "label")
        names = (*self.labels, *self.dense, *self.sparse)
        again = [n for n, count in Counter(names).items() if count > 1]
        if again:
            # Located at the second use of the first name given twice (a file's line).
            second = names.index(again[0], names.index(again[0]) + 1)
            raise SchemaError(f"field names must be unique: {listed(again)} given more than "
                              "once", "label" if second < self.tasks else
                              "dense" if second < self.tasks + len(self.dense) else "sparse",
                              again[0])
        if not self.sparse:
            raise SchemaError("a schema needs at least one sparse (categorical) field", "sparse")
        fields = set(names)
        columns = Counter(f.weights for f in self.sparse_fields if f.weighted)
        for f in self.sparse_fields:
            if f.weighted and (f.weights in fields or columns[f.weights] > 1):
                # A weights column that is also a field's (or another field's weights) would
                # be read twice, as two things.
                raise SchemaError(f"weights {shown(f.weights)} is the name of another field or "
                                  "weights column: name the weights apart", "sparse", f.name,
                                  "weights")
        if not self.dense_fields:
            object.__setattr__(self, "dense_fields", tuple(DenseField(n) for n in self.dense))
        if not self.sparse_fields:
            object.__setattr__(self, "sparse_fields", tuple(SparseField(n) for n in self.sparse))
        if tuple(f.name for f in self.dense_fields) != self.dense or \
                tuple(f.name for f in self.sparse_fields) != self.sparse:
            raise SchemaError("the fields' settings must name the schema's fields, in order")
        _check_table_settings(self.sparse_fields)
        typo = table_typo(self.sparse_fields)
        if typo is not None:
            f, meant = typo
            raise SchemaError(f"table {shown(f.table)} is looked up by no other field, so "
                              f"{shown(f.name)} shares no rows: did you mean {shown(meant)}? "
                              "(own_table = true if not)",
                              "sparse", f.name, "table")

    @classmethod
    def of(cls, label: str | Sequence[str], dense: Sequence[DenseField],
           sparse: Sequence[SparseField]) -> Schema:
        """A schema from its fields' settings (``label``: one name, or each task's in order)."""
        labels = (label,) if isinstance(label, str) else tuple(label)
        return cls(labels[0], tuple(f.name for f in dense), tuple(f.name for f in sparse),
                   tuple(dense), tuple(sparse), labels[1:])

    @property
    def labels(self) -> tuple[str, ...]:
        """Every task's label column, the first task's first."""
        return (self.label, *self.extra_labels)

    @property
    def tasks(self) -> int:
        """Labels a record carries (the logit columns a model returns)."""
        return 1 + len(self.extra_labels)

    @property
    def tables(self) -> tuple[str, ...]:
        """The table each sparse field looks up, in field order (what its ids are hashed with)."""
        return tuple(f.table for f in self.sparse_fields)

    def table_settings(self) -> tuple[tuple[int, bool | None], ...]:
        """Each sparse field's table's ``(dim, first_order)``, as the table's fields give
        them (0 and None where none does), in field order."""
        dims: dict[str, int] = {}
        first: dict[str, bool] = {}
        for f in self.sparse_fields:
            if f.dim:
                dims[f.table] = f.dim
            if f.first_order is not None:
                first[f.table] = f.first_order
        return tuple((dims.get(f.table, 0), first.get(f.table)) for f in self.sparse_fields)

    @property
    def multi_valued(self) -> tuple[str, ...]:
        """The sparse fields that may carry other than one unweighted value."""
        return tuple(f.name for f in self.sparse_fields if f.multi_valued)

    @property
    def log1p(self) -> np.ndarray:
        """bool ``[D]``: which dense fields go through ``log1p``."""
        return np.array([f.transform == "log1p" for f in self.dense_fields], dtype=bool)

    @classmethod
    def from_counts(cls, n_dense: int, n_sparse: int) -> Schema:
        """Criteo-style names (``I1..``, ``C1..``) for the given counts (at most
        :data:`MAX_FIELDS` each, checked before a name is made)."""
        if not (0 <= n_dense <= MAX_FIELDS and 1 <= n_sparse <= MAX_FIELDS):
            raise SchemaError(f"{shown(n_dense)} dense and {shown(n_sparse)} sparse fields: "
                              f"a schema has 0 to {MAX_FIELDS:,} dense and 1 to "
                              f"{MAX_FIELDS:,} sparse")
        return cls(
            dense=tuple(f"I{i}" for i in range(1, n_dense + 1)),
            sparse=tuple(f"C{i}" for i in range(1, n_sparse + 1)),
        )

    @property
    def num_fields(self) -> int:
        """Fields in a TSV line: labels + dense + sparse."""
        return self.tasks + len(self.dense) + len(self.sparse)


def _check_table_settings(fields: Sequence[SparseField]) -> None:
    """Refuse a table whose fields give it two widths, or first-order weights and none."""
    seen: dict[tuple[str, str], tuple[object, str]] = {}
    for f in fields:
        for key, value in (("dim", f.dim or None), ("first_order", f.first_order)):
            if value is None:
                continue
            other = seen.setdefault((f.table, key), (value, f.name))
            if other[0] != value:
                raise SchemaError(f"table {shown(f.table)} has {key} {shown(other[0])} in field "
                                  f"{shown(other[1])} and {shown(value)} here: a table's rows "
                                  "have one shape", "sparse", f.name, key)


def table_typo(fields: Sequence[SparseField]) -> tuple[SparseField, str] | None:
    """The first field whose table looks like a typo, and the table it was likely meant to be.

    A field shares rows with every field of its table. A table that no other field looks up,
    and that is not the field's own name (the default), is legal: a field renamed in the log
    keeps its ids with its old name as its table. It is taken for a typo of a table that other
    fields do share, or that a field looks up under its own name, when

    * it is another field's name and that field looks up another table (meant: that table);
    * it is one edit from such a table (a character added, dropped, changed, or two swapped;
      letter case aside), ``difflib`` finds them at least 0.8 similar (so short names such as
      ``C1`` and ``C2`` are not taken for each other), and they differ by more than their
      numbers (``f_v1`` beside ``f_v2`` is a series). Names past 64 characters are not
      compared.

    ``table = "movies"`` beside a field ``movie`` shares nothing, and was meant to. A field
    with ``own_table`` set is not checked."""
    users = Counter(f.table for f in fields)
    lone = [f for f in fields
            if f.table != f.name and users[f.table] == 1 and not f.own_table]
    if not lone:
        return None
    by_name = {f.name: f for f in fields}
    targets = {t for t, n in users.items() if n > 1} | {f.table for f in fields if f.table == f.name}
    # One deletion from each side meets for any single edit: an index of every target's
    # deletions finds the candidates in time linear in the names (difflib over 10,000 names,
    # once for each of 10,000 lone tables, took minutes).
    near: dict[str, set[str]] = {}
    for target in targets:
        for variant in _deletions(target.casefold()):
            near.setdefault(variant, set()).add(target)
    for f in lone:
        if f.table in by_name:
            return f, by_name[f.table].table
        key = f.table.casefold()
        found = {c for v in _deletions(key) for c in near.get(v, ())} - {f.name}
        close = [c for c in sorted(found) if key == c.casefold() or (
                 _numbered(c) != _numbered(key)
                 and difflib.SequenceMatcher(None, key, c.casefold()).ratio() >= 0.8)]
        if close:
            return f, close[0]
    return None


def _numbered(name: str) -> str:
    """``name`` with each run of digits as ``#``: the names of one series come out alike."""
    return re.sub(r"[0-9]+", "#", name.casefold())


def _deletions(word: str) -> set[str]:
    """``word`` and every string one character shorter (none for a word past 64 characters,
    where the index would grow as the square of its length)."""
    if len(word) > 64:
        return set()
    return {word, *(word[:i] + word[i + 1:] for i in range(len(word)))}


def dense_features(raw: np.ndarray, log1p: np.ndarray | None = None) -> np.ndarray:
    """A batch's dense features ``[B, D]`` from the raw values: float32 ``log(1 + max(x, 0))``
    (missing values arrive as 0 or negative) for the fields ``log1p`` marks (all by default),
    the value itself for the others. Every record format decodes through this."""
    values = np.asarray(raw, dtype=np.float64)  # the decoders' values are float64 already
    out = np.log1p(np.maximum(values, 0))
    if log1p is not None and not log1p.all():
        out[:, ~log1p] = values[:, ~log1p]
    return out.astype(np.float32)


@dataclass(frozen=True)
class ClickBatch:
    """A columnar batch of decoded click records (numpy arrays, one row per record).

    The sparse values are jagged, as in TorchRec's ``KeyedJaggedTensor`` but ordered by sample
    (samples are what gets sliced, routed and held back): sample ``b``'s values of field ``s``
    are the next ``lengths[b, s]`` of ``values``, sample after sample, field after field. A
    Criteo-shaped log is the case where every length is 1 (:meth:`of_ids`, :attr:`ids`).

    Attributes:
        labels: float32 ``[B]``, 0 or 1; ``[B, T]`` when the schema has ``T > 1`` labels.
        dense: float32 ``[B, D]``, the dense features after their transforms (missing = 0).
        values: int64 ``[nnz]`` feature ids (see :mod:`hetgmp.streaming.hashing`), non-negative.
        lengths: int32 ``[B, S]`` values of each (sample, field); 0 is an empty bag.
        partitions: int32 ``[B]`` Kafka partition of each record (-1 when not from Kafka).
        offsets: int64 ``[B]`` Kafka offset of the message holding each record (-1 if none).
        timestamps_ms: int64 ``[B]`` Kafka append time of that message (-1 if unknown).
        weights: float32 ``[nnz]`` per-value weights, or None (every weight 1).
    """

    labels: np.ndarray
    dense: np.ndarray
    values: np.ndarray
    lengths: np.ndarray
    partitions: np.ndarray
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    weights: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def of_lists(cls, values: np.ndarray, lengths: np.ndarray) -> ClickBatch:
        """A batch of the sparse values alone (``lengths`` ``[B, S]``): labels 0, no dense
        feature, no position: what the access graph reads of records."""
        n = int(lengths.shape[0])
        unknown = np.full(n, -1, np.int64)
        return cls(labels=np.zeros(n, np.float32), dense=np.zeros((n, 0), np.float32),
                   values=np.asarray(values, np.int64), lengths=np.asarray(lengths, np.int32),
                   partitions=unknown.astype(np.int32), offsets=unknown, timestamps_ms=unknown)

    @classmethod
    def of_ids(cls, labels: np.ndarray, dense: np.ndarray, ids: np.ndarray,
               partitions: np.ndarray | None = None, offsets: np.ndarray | None = None,
               timestamps_ms: np.ndarray | None = None) -> ClickBatch:
        """A batch of one value a field: ``ids`` int64 ``[B, S]`` (positions default to -1)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        n = ids.shape[0]
        unknown = np.full(n, -1, np.int64)
        return cls(labels=labels, dense=dense, values=ids.reshape(-1),
                   lengths=np.ones(ids.shape, np.int32),
                   partitions=unknown.astype(np.int32) if partitions is None else partitions,
                   offsets=unknown if offsets is None else offsets,
                   timestamps_ms=unknown if timestamps_ms is None else timestamps_ms)

    @classmethod
    def empty(cls, schema: Schema) -> ClickBatch:
        """A batch with no rows and the schema's widths."""
        labels = np.zeros((0,) if schema.tasks == 1 else (0, schema.tasks), np.float32)
        return cls.of_ids(labels, np.zeros((0, len(schema.dense)), np.float32),
                          np.zeros((0, len(schema.sparse)), np.int64))

    @property
    def fields(self) -> int:
        """Sparse fields ``S``."""
        return int(self.lengths.shape[1])

    @property
    def one_value(self) -> bool:
        """Whether every (sample, field) carries exactly one unweighted value."""
        return (self.weights is None and self.values.size == self.lengths.size
                and bool((self.lengths == 1).all()))

    @property
    def ids(self) -> np.ndarray:
        """int64 ``[B, S]``: the values of a one-value batch (a view). Raises on a batch with
        lists or weights, whose values do not make a rectangle."""
        if not self.one_value:
            raise ValueError("this batch has lists or weights: read values and lengths")
        return self.values.reshape(self.lengths.shape)

    @property
    def indptr(self) -> np.ndarray:
        """int64 ``[B + 1]``: sample ``b``'s values are ``values[indptr[b]:indptr[b + 1]]``
        (the batch as a CSR matrix of samples by rows, for routing and the window)."""
        out = np.zeros(len(self) + 1, np.int64)
        np.cumsum(self.lengths.sum(axis=1, dtype=np.int64), out=out[1:])
        return out

    @classmethod
    def concat(cls, batches: list[ClickBatch]) -> ClickBatch:
        """Rows of several batches, in order (at least one batch)."""
        if len(batches) == 1:
            return batches[0]
        weighted = any(b.weights is not None for b in batches)
        joined = {f: np.concatenate([getattr(b, f) for b in batches])
                  for f in _PER_SAMPLE_AND_VALUE}
        return cls(**joined, weights=np.concatenate([b.value_weights() for b in batches])
                   if weighted else None)

    def value_weights(self) -> np.ndarray:
        """float32 ``[nnz]``: the weights, ones when the batch has none."""
        return self.weights if self.weights is not None else np.ones(self.values.size, np.float32)

    def take(self, rows: np.ndarray | slice) -> ClickBatch:
        """A batch of the selected rows (a slice, indices or a mask), in that order."""
        picked = {f: getattr(self, f)[rows] for f in _PER_SAMPLE}
        if self.one_value:
            return ClickBatch(values=self.ids[rows].reshape(-1), **picked)
        if isinstance(rows, slice) and rows.step in (None, 1):
            lo, hi, _ = rows.indices(len(self))
            indptr = self.indptr
            positions: np.ndarray | slice = slice(int(indptr[lo]), int(indptr[max(hi, lo)]))
        else:
            positions = segment_positions(self.indptr, np.arange(len(self))[rows])
        return ClickBatch(values=self.values[positions],
                          weights=None if self.weights is None else self.weights[positions],
                          **picked)

    @property
    def nbytes(self) -> int:
        """Bytes of the batch's arrays."""
        arrays = [getattr(self, f) for f in _PER_SAMPLE_AND_VALUE]
        return sum(int(a.nbytes) for a in arrays) + (
            0 if self.weights is None else int(self.weights.nbytes))


_PER_SAMPLE = ("labels", "dense", "lengths", "partitions", "offsets", "timestamps_ms")
_PER_SAMPLE_AND_VALUE = ("labels", "dense", "values", "lengths", "partitions", "offsets",
                         "timestamps_ms")


def segment_positions(indptr: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Positions of the values of samples ``index`` (in that order) in a CSR of ``indptr``."""
    starts = indptr[index]
    sizes = indptr[index + 1] - starts
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    # Each output position is its segment's start plus its place within the segment.
    first = np.cumsum(sizes) - sizes
    return np.repeat(starts - first, sizes) + np.arange(total, dtype=np.int64)


class RejectReason(str, Enum):
    """Why a record could not be decoded; the value is what goes into the dead-letter header."""

    EMPTY_MESSAGE = "empty_message"
    TOO_LARGE = "too_large"
    INVALID_UTF8 = "invalid_utf8"
    WRONG_FIELD_COUNT = "wrong_field_count"
    BAD_LABEL = "bad_label"
    MISSING_LABEL = "missing_label"
    BAD_DENSE = "bad_dense"
    BAD_JSON = "bad_json"
    BAD_ARROW = "bad_arrow"
    ARROW_SCHEMA = "arrow_schema"
    BAD_ID = "bad_id"
    BAD_WEIGHT = "bad_weight"
    TOO_MANY_VALUES = "too_many_values"


@dataclass(frozen=True)
class Reject:
    """One record (or a whole empty message) that could not be decoded."""

    reason: RejectReason
    payload: bytes
    partition: int = -1
    offset: int = -1
    detail: str = ""
