"""Values and small interfaces of the streaming package: record schema, columnar batches, rejects."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

__all__ = [
    "Schema",
    "ClickBatch",
    "Reject",
    "RejectReason",
    "dense_features",
]


@dataclass(frozen=True)
class Schema:
    """Names of a click log's fields: one label, ``dense`` integer features, ``sparse`` categoricals.

    The default is Criteo's: ``label``, ``I1..I13``, ``C1..C26``. Feature ids hash the sparse field
    *name* with the value, so renaming a field changes its ids and reordering fields does not.
    """

    label: str = "label"
    dense: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
    sparse: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))

    def __post_init__(self) -> None:
        names = (self.label, *self.dense, *self.sparse)
        if len(set(names)) != len(names):
            raise ValueError(f"schema field names must be unique, got {names}")
        if not self.sparse:
            raise ValueError("a schema needs at least one sparse (categorical) field")

    @classmethod
    def from_counts(cls, n_dense: int, n_sparse: int) -> Schema:
        """Criteo-style names (``I1..``, ``C1..``) for the given counts."""
        return cls(
            dense=tuple(f"I{i}" for i in range(1, n_dense + 1)),
            sparse=tuple(f"C{i}" for i in range(1, n_sparse + 1)),
        )

    @classmethod
    def parse(cls, spec: str) -> Schema:
        """Parse ``"13,26"`` (counts) or ``"label=y;dense=a,b;sparse=c,d,e"`` (names)."""
        spec = spec.strip()
        if not spec or spec.lower() == "criteo":
            return cls()
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


def dense_features(raw: np.ndarray) -> np.ndarray:
    """A batch's dense features from the raw integer counts: float32 ``log(1 + max(x, 0))``
    (missing values arrive as 0 or negative). Every record format decodes through this."""
    return np.log1p(np.maximum(raw, 0).astype(np.float64)).astype(np.float32)


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
