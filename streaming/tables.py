"""Click logs at rest in Parquet or Arrow files, replayed into Kafka by ``hetgmp produce``.

``--source file:PATH`` names files or directories; a path ending in ``.parquet``/``.pq``, or
``.arrow``/``.feather``/``.ipc`` (Arrow IPC files), or a directory of such files, is read with
``pyarrow.dataset`` a batch at a time (never the whole file in memory); other paths are
Criteo TSV text (:func:`hetgmp.streaming.producer.file_chunks`).

Each field of the schema (``--schema``) is read from the column of its own name, or from the one
``--column-map FIELD=COLUMN,...`` names. A weighted field's weights are read from the column the
schema's ``weights`` names (``<column>_weights`` by default), or from the one
``--column-map <field>_weights=COLUMN`` names. Before anything is sent, every path is opened and
every column checked: a missing column (a weighted field's weights included: a field the
schema weighs never trains with weights nobody sent), or one whose type the consumer could not
read (a dense field that is not numbers, a label that is not a number), stops with an error that
names the field, the column, the file and the columns it has.

Values are sent as they are in the file, for the consumer to hash: an integer categorical column
(user ids, item ids) becomes the text of its values, so that a user id of 5 and an item id of 5
stay different features and a record decodes to the same ids from Parquet as from its TSV line.
The messages are Arrow record batches (``--format arrow``) or TSV lines (``--format tsv``), both
built column by column with pyarrow's compute functions, with no loop over records. A value is
sent as it is, whatever it holds (a NaN, 1e300, bytes that are not UTF-8), for the consumer to
dead-letter by reason: a record never stops a replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from hetgmp.streaming.arrow import ipc_message
from hetgmp.streaming.types import Schema, segment_positions

__all__ = ["ColumnError", "TableSource", "arrow_messages", "is_table_path", "parse_column_map",
           "tsv_messages"]

PARQUET_SUFFIXES = (".parquet", ".pq")
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")


class ColumnError(ValueError):
    """A field of the schema has no column in the files, or one of a type it cannot be read as."""


def is_table_path(path: str) -> bool:
    """A Parquet or Arrow file, or a directory (of such files)."""
    p = Path(path)
    return p.is_dir() or p.suffix.lower() in PARQUET_SUFFIXES + ARROW_SUFFIXES


def parse_column_map(spec: str, schema: Schema) -> dict[str, str]:
    """``"label=click,C1=user_id"`` as ``{field: column}``; every key must be a schema field,
    or a weighted field's weights (``<field>_weights``, or the name its ``weights`` gives)."""
    weights = [name for f in schema.sparse_fields if f.weighted
               for name in dict.fromkeys((f"{f.name}_weights", f.weights))]
    fields = (*schema.labels, *schema.dense, *schema.sparse, *weights)
    out: dict[str, str] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, sep, column = (x.strip() for x in item.partition("="))
        if not sep or not name or not column:
            raise ValueError(f"--column-map {spec!r}: expected FIELD=COLUMN pairs separated by "
                             f"commas, got {item!r}")
        if name not in fields:
            raise ValueError(f"--column-map {spec!r}: {name!r} is not a field of the schema "
                             f"(fields: {', '.join(fields[:6])}, ...)")
        out[name] = column
    return out


def _files_of(paths: list[str]) -> list[Path]:
    """The files the paths name: themselves, or those below a directory (hidden ones and
    ``_``-prefixed metadata files left out, as Spark and pyarrow write them)."""
    return [f for p in map(Path, paths)
            for f in (sorted(p.rglob("*")) if p.is_dir() else [p])
            if f.is_file() and not f.name.startswith((".", "_"))]


def _format_of(files: list[Path], paths: list[str]) -> str:
    kinds = set()
    for f in files:
        s = f.suffix.lower()
        if s in PARQUET_SUFFIXES:
            kinds.add("parquet")
        elif s in ARROW_SUFFIXES:
            kinds.add("ipc")
    if not kinds:
        raise FileNotFoundError(f"no Parquet or Arrow file in {', '.join(paths)}")
    if len(kinds) > 1:
        raise ValueError(f"{', '.join(paths)} mix Parquet and Arrow files: replay them apart")
    return kinds.pop()


@dataclass(frozen=True)
class _Field:
    name: str  # the schema's
    column: str  # the file's
    kind: str  # label, dense, sparse, list (a multi-valued sparse field), weights
    weights_of: str = ""  # a weights column's field


class TableSource:
    """The records of Parquet or Arrow files, as batches with the schema's column names."""

    def __init__(self, paths: list[str], schema: Schema, column_map: dict[str, str] | None = None
                 ) -> None:
        """Open the files and check every column (nothing is read yet).

        Raises:
            FileNotFoundError: a path does not exist, or holds no Parquet or Arrow file.
            ColumnError: a field's column is missing or of a type it cannot be read as.
        """
        import pyarrow.dataset as ds

        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            raise FileNotFoundError(f"replay file not found: {', '.join(missing)}")
        self.paths = paths
        self.schema = schema
        files = _files_of(paths)
        self.dataset = ds.dataset([str(f) for f in files], format=_format_of(files, paths))
        mapping = column_map or {}
        self.fields = [_Field(n, mapping.get(n, n), "label") for n in schema.labels]
        self.fields += [_Field(n, mapping.get(n, n), "dense") for n in schema.dense]
        for f in schema.sparse_fields:
            column = mapping.get(f.name, f.name)
            self.fields.append(_Field(f.name, column, "list" if f.multi_valued else "sparse"))
            if f.weighted:
                # Named by the map, else by the schema, else after the field's own column.
                named = f.weights != f"{f.name}_weights"
                weights = mapping.get(f.weights, mapping.get(
                    f"{f.name}_weights", f.weights if named else f"{column}_weights"))
                self.fields.append(_Field(f.weights, weights, "weights", f.name))
        self._check(self.dataset.schema)

    def _check(self, have: pa.Schema) -> None:
        where = ", ".join(self.paths)
        names = have.names
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        absent = [f for f in self.fields if f.column not in names]
        if absent:  # all of them at once: a renamed file misses several
            said = "; ".join(f"no column {f.column!r} for the schema's {f.kind} field {f.name!r}"
                             + (f" (the weights of its weighted field {f.weights_of!r})"
                                if f.weights_of else "")
                             + ("" if f.column == f.name else " (--column-map)") for f in absent)
            raise ColumnError(f"{said} in {where} (its columns: {shown}). --column-map "
                              f"{absent[0].name}=COLUMN,... names the column a field is in; "
                              f"--schema gives other fields")
        for f in self.fields:
            t = have.field(f.column).type
            listed = pat.is_list(t) or pat.is_large_list(t)
            inner = t.value_type if listed else t
            ok = {"label": pat.is_integer(t) or pat.is_boolean(t) or pat.is_floating(t),
                  "dense": pat.is_integer(t) or pat.is_floating(t),
                  "sparse": _is_value(t),
                  "list": _is_value(inner),
                  "weights": listed and (pat.is_integer(inner) or pat.is_floating(inner))
                  }[f.kind]
            if not ok:
                want = {"label": "a number or boolean (0/1)", "dense": "numbers",
                        "sparse": "integer or string values (a list is for max_len > 1)",
                        "list": "integer or string values, or lists of them",
                        "weights": "lists of numbers"}[f.kind]
                raise ColumnError(f"column {f.column!r} (the schema's {f.kind} field {f.name!r}) "
                                  f"in {where} is {t}; the consumer reads {want}")

    def count(self) -> int:
        """Records in the files (from their metadata where the format keeps it)."""
        return int(self.dataset.count_rows())

    def batches(self, chunk: int, count: int = 0) -> Iterator[pa.RecordBatch]:
        """Record batches of up to ``chunk`` rows, columns named and typed for the consumer;
        ``count`` > 0 stops after that many records."""
        sent = 0
        columns = list(dict.fromkeys(f.column for f in self.fields))  # one column, two fields
        for raw in self.dataset.to_batches(columns=columns, batch_size=chunk):
            if count and sent + raw.num_rows > count:
                raw = raw.slice(0, count - sent)
            if raw.num_rows:
                yield self._shape(raw)
                sent += raw.num_rows
            if count and sent >= count:
                return

    def _shape(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        arrays, fields = [], []
        for f in self.fields:
            a = raw.column(f.column)
            listed = pat.is_list(a.type) or pat.is_large_list(a.type)
            if f.kind in ("label", "dense") and pat.is_float16(a.type):
                a = pc.cast(a, pa.float32())  # compute functions take few half floats
            elif f.kind == "list" and not listed:
                a = _one_each(a)  # a field of many values sent as lists, one value each
            elif f.kind == "sparse" and pat.is_integer(a.type):
                a = pc.cast(a, pa.string())  # a raw value, hashed by the consumer per field
            if f.kind == "list" and pat.is_integer(a.type.value_type):
                a = pc.cast(a, pa.list_(pa.string()))
            elif f.kind == "weights":
                # Unchecked: a weight past float32 becomes an infinity the consumer refuses.
                a = pc.cast(a, pa.list_(pa.float32()), safe=False)
            arrays.append(a)
            fields.append(pa.field(f.name, a.type, metadata={_WEIGHTS_OF: f.weights_of}
                                   if f.weights_of else None))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# A weights column's metadata key: the field whose values it weighs.
_WEIGHTS_OF = b"hetgmp.weights_of"


def _one_each(a: pa.Array) -> pa.Array:
    """A column of values as lists of one (a null: an empty list)."""
    lengths = (~np.asarray(a.is_null().to_numpy(zero_copy_only=False), bool)).astype(np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, a.drop_null())


def _is_value(t: pa.DataType) -> bool:
    return pat.is_integer(t) or pat.is_string(t) or pat.is_large_string(t) or \
        pat.is_binary(t) or pat.is_large_binary(t)


def _text(a: pa.Array) -> pa.Array:
    """Values as the bytes of their text (binary: bytes that are not UTF-8 are sent as they
    are, for the consumer to refuse the line)."""
    if not (pat.is_string(a.type) or pat.is_large_string(a.type) or pat.is_binary(a.type)
            or pat.is_large_binary(a.type)):
        a = pc.cast(a, pa.string())
    return pc.cast(a, pa.binary())


def _joined(values: pa.Array, weights: pa.Array | None, separator: str) -> pa.Array:
    """A list column as TSV text: its values joined by ``separator``, each ``id:weight`` with
    weights. A null or empty value is no value (its weight goes with it); a row whose weights
    are not one a value is sent without them, a null weight as none, for the consumer to
    dead-letter (``bad_weight``)."""
    flat = pc.fill_null(_text(pc.list_flatten(values)), b"")
    lengths = pc.fill_null(pc.list_value_length(values), 0).to_numpy().astype(np.int64)
    if weights is not None:
        wlen = pc.fill_null(pc.list_value_length(weights), 0).to_numpy().astype(np.int64)
        same = np.flatnonzero(wlen == lengths)
        # Value k of a matching row takes the weight at the same place in the row's weights.
        at = np.full(len(flat), -1, np.int64)
        at[segment_positions(_indptr(lengths), same)] = segment_positions(_indptr(wlen), same)
        text = pc.take(_text(pc.list_flatten(weights)), pa.array(at, mask=at < 0))
        text = pc.if_else(pc.equal(pc.binary_length(flat), 0), pa.scalar(None, pa.binary()), text)
        flat = pc.binary_join_element_wise(flat, text, pa.scalar(b":"), null_handling="skip")
    offsets = pa.array(_indptr(lengths).astype(np.int32))
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, flat),
                            pa.scalar(separator.encode()))
    return pc.fill_null(joined, b"")


def _indptr(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def arrow_messages(batch: pa.RecordBatch, per_message: int) -> list[bytes]:
    """One Arrow IPC stream (schema and one record batch) per ``per_message`` rows."""
    return [ipc_message(batch.slice(lo, per_message))
            for lo in range(0, batch.num_rows, per_message)]


def tsv_messages(batch: pa.RecordBatch, per_message: int, separator: str = ",",
                 labels: int = 1) -> list[bytes]:
    """Criteo TSV lines (labels, dense..., sparse..., tab separated; null = empty field), joined
    ``per_message`` to a message by newlines. A list column's values are joined by
    ``separator``, each ``id:weight`` when its weights column comes with it (marked so by
    :class:`TableSource`, or named ``<name>_weights``). The first ``labels`` columns are the
    labels."""
    texts = []
    names = batch.schema.names
    weights_of = {}
    for i, f in enumerate(batch.schema):
        of = (f.metadata or {}).get(_WEIGHTS_OF, b"").decode() or (
            f.name[:-len("_weights")] if f.name.endswith("_weights") else "")
        if of in names and of != f.name:
            weights_of[of] = i
    written_with_values = set(weights_of.values())
    for i, a in enumerate(batch.columns):
        if i in written_with_values:
            continue
        if pat.is_list(a.type) or pat.is_large_list(a.type):
            w = weights_of.get(names[i])
            texts.append(_joined(a, None if w is None else batch.column(w), separator))
            continue
        if i < labels and pat.is_boolean(a.type):
            a = pc.cast(a, pa.int8())
        elif i < labels and pat.is_floating(a.type):
            # 1.0 -> "1"; any other label (2.0, 0.5, NaN, 1e300) stays as it is, for the
            # consumer to reject.
            zero_one = pc.all(pc.or_(pc.equal(a, 0), pc.equal(a, 1))).as_py() is not False
            a = pc.cast(a, pa.int8()) if zero_one else a
        texts.append(pc.fill_null(_text(a), b""))
    lines = pc.binary_join_element_wise(*texts, pa.scalar(b"\t"))
    ended = pc.binary_join_element_wise(lines, pa.scalar(b""), pa.scalar(b"\n"))  # line + "\n"
    ended = ended.combine_chunks() if isinstance(ended, pa.ChunkedArray) else ended
    offsets_buf, data_buf = ended.buffers()[1], ended.buffers()[2]
    offsets = np.frombuffer(offsets_buf, np.int32)[ended.offset : ended.offset + len(ended) + 1]
    data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
    bounds = offsets[::per_message].tolist()
    if bounds[-1] != int(offsets[-1]):
        bounds.append(int(offsets[-1]))
    # Each message without its last newline, as the text producer packs lines.
    return [bytes(data[lo : hi - 1]) for lo, hi in zip(bounds[:-1], bounds[1:])]
