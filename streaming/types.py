"""Values and small interfaces of the streaming package: record schema, columnar batches, rejects."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

import numpy as np

__all__ = [
    "DenseField",
    "Schema",
    "SparseField",
    "ClickBatch",
    "Reject",
    "RejectReason",
    "dense_features",
    "refuse_multi_valued",
]


POOLINGS = ("sum", "mean")
TRANSFORMS = ("log1p", "none")
OVERFLOWS = ("truncate", "reject")


@dataclass(frozen=True)
class SparseField:
    """A categorical field: the table its values look up, and how many a record may carry.

    Attributes:
        name: The field's name in the log.
        table: The embedding table its values name rows of; fields that share a table give the
            same id to the same value. Defaults to the field's name.
        max_len: Values a record may carry (1: exactly one, as in Criteo).
        pooling: How a record's values make one vector: ``sum`` or ``mean``.
        weighted: Whether each value carries a weight (``id:weight``).
        on_overflow: Past ``max_len``: ``truncate`` (keep the first, count the rest) or
            ``reject`` (dead-letter the record).
    """

    name: str
    table: str = ""
    max_len: int = 1
    pooling: str = "sum"
    weighted: bool = False
    on_overflow: str = "truncate"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a sparse field needs a name")
        if not self.table:
            object.__setattr__(self, "table", self.name)
        if self.max_len < 1:
            raise ValueError(f"max_len must be at least 1, not {self.max_len}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be sum or mean, not {self.pooling!r}")
        if self.weighted and self.pooling != "sum":
            raise ValueError("a weighted field pools by sum (weights scale the rows summed)")
        if self.on_overflow not in OVERFLOWS:
            raise ValueError(f"on_overflow must be truncate or reject, not {self.on_overflow!r}")

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
            raise ValueError("a dense field needs a name")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"transform must be log1p or none, not {self.transform!r}")


@dataclass(frozen=True)
class Schema:
    """A click log's fields: one label, ``dense`` numeric features, ``sparse`` categoricals.

    The default is Criteo's: ``label``, ``I1..I13``, ``C1..C26``. Feature ids hash a sparse
    field's *table* (its name unless the field says otherwise) with the value, so renaming a
    field changes its ids, reordering fields does not, and fields sharing a table share ids.
    ``dense`` and ``sparse`` are the names; ``dense_fields`` and ``sparse_fields`` the settings
    (one ``log1p`` value, and one value in a table of the field's name, unless given).
    """

    label: str = "label"
    dense: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
    sparse: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
    dense_fields: tuple[DenseField, ...] = field(default=(), repr=False)
    sparse_fields: tuple[SparseField, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        names = (self.label, *self.dense, *self.sparse)
        if len(set(names)) != len(names):
            raise ValueError(f"schema field names must be unique, got {names}")
        if not self.sparse:
            raise ValueError("a schema needs at least one sparse (categorical) field")
        if not self.dense_fields:
            object.__setattr__(self, "dense_fields", tuple(DenseField(n) for n in self.dense))
        if not self.sparse_fields:
            object.__setattr__(self, "sparse_fields", tuple(SparseField(n) for n in self.sparse))
        if tuple(f.name for f in self.dense_fields) != self.dense or \
                tuple(f.name for f in self.sparse_fields) != self.sparse:
            raise ValueError("the fields' settings must name the schema's fields, in order")

    @classmethod
    def of(cls, label: str, dense: Sequence[DenseField], sparse: Sequence[SparseField]) -> Schema:
        """A schema from its fields' settings."""
        return cls(label, tuple(f.name for f in dense), tuple(f.name for f in sparse),
                   tuple(dense), tuple(sparse))

    @property
    def tables(self) -> tuple[str, ...]:
        """The table each sparse field looks up, in field order (what its ids are hashed with)."""
        return tuple(f.table for f in self.sparse_fields)

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
        """Criteo-style names (``I1..``, ``C1..``) for the given counts."""
        return cls(
            dense=tuple(f"I{i}" for i in range(1, n_dense + 1)),
            sparse=tuple(f"C{i}" for i in range(1, n_sparse + 1)),
        )

    @classmethod
    def parse(cls, spec: str) -> Schema:
        """Parse ``"13,26"`` (counts), ``"label=y;dense=a,b;sparse=c,d,e"`` (names) or the path
        of a schema file (``*.toml``, see :mod:`streaming.schema_file`)."""
        spec = spec.strip()
        if not spec or spec.lower() == "criteo":
            return cls()
        if spec.endswith(".toml"):
            from streaming.schema_file import load_schema

            return load_schema(spec)
        if "=" not in spec:
            try:
                n_dense, n_sparse = (int(x) for x in spec.split(","))
            except ValueError:
                raise ValueError(
                    f"schema {spec!r}: expected 'DENSE,SPARSE' counts or 'label=NAME;dense=A,B;sparse=C,D'"
                ) from None
            return cls.from_counts(n_dense, n_sparse)
        parts: dict[str, str] = {}
        for item in spec.split(";"):
            key, _, value = item.partition("=")
            parts[key.strip()] = value.strip()
        unknown = set(parts) - {"label", "dense", "sparse"}
        if unknown:
            raise ValueError(f"schema {spec!r}: unknown keys {sorted(unknown)}")
        split = lambda v: tuple(x.strip() for x in v.split(",") if x.strip())  # noqa: E731
        return cls(
            label=parts.get("label", "label"),
            dense=split(parts.get("dense", "")),
            sparse=split(parts.get("sparse", "")),
        )

    @property
    def num_fields(self) -> int:
        """Fields in a TSV line: label + dense + sparse."""
        return 1 + len(self.dense) + len(self.sparse)


def refuse_multi_valued(schema: Schema) -> None:
    """Raise unless every sparse field of ``schema`` carries exactly one unweighted value: the
    decoders do not read lists and weights yet (docs/schemas.md, the plan)."""
    if schema.multi_valued:
        raise ValueError(f"fields {', '.join(schema.multi_valued)}: lists and weights "
                         f"(max_len > 1, weighted) are not read yet; shared tables and dense "
                         f"transforms are")


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

    Attributes:
        labels: float32 ``[B]``, 0 or 1.
        dense: float32 ``[B, D]``, ``log(1 + max(x, 0))`` of the integer features (missing = 0).
        ids: int64 ``[B, S]`` feature ids (see :mod:`streaming.hashing`), non-negative.
        partitions: int32 ``[B]`` Kafka partition of each record (-1 when not from Kafka).
        offsets: int64 ``[B]`` Kafka offset of the message holding each record (-1 if none).
        timestamps_ms: int64 ``[B]`` Kafka append time of that message (-1 if unknown).
    """

    labels: np.ndarray
    dense: np.ndarray
    ids: np.ndarray
    partitions: np.ndarray
    offsets: np.ndarray
    timestamps_ms: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def empty(cls, schema: Schema) -> ClickBatch:
        """A batch with no rows and the schema's widths."""
        return cls(
            labels=np.zeros(0, np.float32),
            dense=np.zeros((0, len(schema.dense)), np.float32),
            ids=np.zeros((0, len(schema.sparse)), np.int64),
            partitions=np.zeros(0, np.int32),
            offsets=np.zeros(0, np.int64),
            timestamps_ms=np.zeros(0, np.int64),
        )

    @classmethod
    def concat(cls, batches: list[ClickBatch]) -> ClickBatch:
        """Rows of several batches, in order (at least one batch)."""
        if len(batches) == 1:
            return batches[0]
        return cls(*(np.concatenate([getattr(b, f) for b in batches]) for f in cls.__dataclass_fields__))

    def take(self, rows: np.ndarray | slice) -> ClickBatch:
        """A batch of the selected rows."""
        return ClickBatch(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))

    @property
    def nbytes(self) -> int:
        """Bytes of the batch's arrays."""
        return sum(int(getattr(self, f).nbytes) for f in self.__dataclass_fields__)

    def to_arrow(self, schema: Schema):  # -> pyarrow.RecordBatch (import kept lazy: it is heavy)
        """The batch as a ``pyarrow.RecordBatch`` with one column per schema field."""
        import pyarrow as pa

        columns = {
            schema.label: pa.array(self.labels),
            **{name: pa.array(self.dense[:, i]) for i, name in enumerate(schema.dense)},
            **{name: pa.array(self.ids[:, i]) for i, name in enumerate(schema.sparse)},
            "kafka_partition": pa.array(self.partitions),
            "kafka_offset": pa.array(self.offsets),
            "kafka_timestamp_ms": pa.array(self.timestamps_ms),
        }
        return pa.RecordBatch.from_pydict(columns)


class RejectReason(str, Enum):
    """Why a record could not be decoded; the value is what goes into the dead-letter header."""

    EMPTY_MESSAGE = "empty_message"
    TOO_LARGE = "too_large"
    INVALID_UTF8 = "invalid_utf8"
    WRONG_FIELD_COUNT = "wrong_field_count"
    BAD_LABEL = "bad_label"
    BAD_DENSE = "bad_dense"
    BAD_JSON = "bad_json"
    BAD_ARROW = "bad_arrow"
    ARROW_SCHEMA = "arrow_schema"
    BAD_ID = "bad_id"


@dataclass(frozen=True)
class Reject:
    """One record (or a whole empty message) that could not be decoded."""

    reason: RejectReason
    payload: bytes
    partition: int = -1
    offset: int = -1
    detail: str = ""
