"""List fields: TSV, JSON and Arrow read the same records to the same jagged ids, with weights,
shared tables, truncation counted and bad records dead-lettered by reason."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from hetgmp.streaming.arrow import batch_to_arrow, ipc_message
from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.hashing import feature_id
from hetgmp.streaming.tables import TableSource, arrow_messages, tsv_messages
from hetgmp.streaming.types import ClickBatch, DenseField, RejectReason, Schema, SparseField

SCHEMA = Schema.of("y", [DenseField("price", "none")], [
    SparseField("item", table="items"),
    SparseField("history", table="items", max_len=3, pooling="mean"),
    SparseField("tags", max_len=2, pooling="sum", weighted=True, on_overflow="reject"),
])

# item, history (truncated past 3), tags with weights; an empty record; a record whose tags
# overflow (rejected); one with a weight that is not a number (rejected).
LINES = [b"1\t2.5\ta\tb,c,d,e\tx:0.5,y:2",
         b"0\t1\t\t\t",
         b"1\t0\tq\tr\tz,y,x",
         b"1\t0\tq\tr\tz:abc",
         b"0\t-3.5\tb\ta,,a\ty:1"]


def bags(batch: ClickBatch) -> list[list[list[int]]]:
    """Each record's values, field by field."""
    out, at = [], 0
    for row in batch.lengths.tolist():
        record = []
        for n in row:
            record.append(batch.values[at:at + n].tolist())
            at += n
        out.append(record)
    return out


def test_tsv_lists_weights_shared_tables_and_bad_records() -> None:
    decoded = Decoder(SCHEMA).decode([b"\n".join(LINES)], offsets=[7])
    b = decoded.batch
    item = lambda v: feature_id("items", v)  # noqa: E731 (item and history share the table)
    assert bags(b) == [
        [[item("a")], [item("b"), item("c"), item("d")],
         [feature_id("tags", "x"), feature_id("tags", "y")]],
        [[item("")], [], []],  # an empty one-value field is today's "missing" id; lists: none
        [[item("b")], [item("a"), item("a")], [feature_id("tags", "y")]],  # ",," is no value
    ]
    assert b.weights is not None and b.weights.tolist() == [1, 1, 1, 1, 0.5, 2, 1, 1, 1, 1, 1]
    assert b.dense[:, 0].tolist() == [2.5, 1.0, -3.5]  # transform none: floats as they are
    assert [(r.reason, r.payload) for r in decoded.rejects] == [
        (RejectReason.TOO_MANY_VALUES, LINES[2]), (RejectReason.BAD_WEIGHT, LINES[3])]
    assert decoded.truncated == {"history": 1}


def test_the_value_separator_is_configurable_and_checked() -> None:
    line = b"1\t2\ta\tb|c\tx:1"
    b = Decoder(SCHEMA, DecodeConfig(value_separator="|")).decode([line]).batch
    assert b.lengths.tolist() == [[1, 2, 1]]
    with pytest.raises(ValueError, match="value separator"):
        DecodeConfig(value_separator=":")


def test_json_arrays_decode_to_the_tsv_decoders_batch() -> None:
    records = [
        {"y": 1, "price": 2.5, "item": "a", "history": ["b", "c", "d", "e"], "tags": ["x", "y"],
         "tags_weights": [0.5, 2]},
        {"y": 0, "price": 1, "item": "", "history": [], "tags": None},
        {"y": 1, "price": 0, "item": "q", "history": "r", "tags": ["z", "y", "x"]},
        {"y": 1, "price": 0, "item": "q", "history": ["r"], "tags": ["z"], "tags_weights": ["abc"]},
        {"y": 0, "price": -3.5, "item": "b", "history": ["a", "", "a"], "tags": ["y"],
         "tags_weights": [1]},
    ]
    got = Decoder(SCHEMA, DecodeConfig(format="json")).decode(
        [b"\n".join(json.dumps(r).encode() for r in records)])
    want = Decoder(SCHEMA).decode([b"\n".join(LINES)])
    assert bags(got.batch) == bags(want.batch)
    assert np.array_equal(got.batch.weights, want.batch.weights)
    assert [r.reason for r in got.rejects] == [r.reason for r in want.rejects]
    assert got.truncated == {"history": 1}


def _table() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "y": pa.array([1, 0, 1, 1, 0], pa.int8()),
        "price": pa.array([2.5, 1.0, 0.0, 0.0, -3.5]),
        "item": pa.array(["a", "", "q", "q", "b"]),
        "history": pa.array([["b", "c", "d", "e"], [], ["r"], ["r"], ["a", "", "a"]]),
        "tags": pa.array([["x", "y"], None, ["z", "y", "x"], ["z"], ["y"]]),
        "tags_weights": pa.array([[0.5, 2.0], None, [1.0, 1.0, 1.0], [float("nan")], [1.0]]),
    })


def test_arrow_list_columns_decode_to_the_tsv_decoders_batch() -> None:
    got = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode([ipc_message(_table())])
    want = Decoder(SCHEMA).decode([b"\n".join(LINES)])
    assert bags(got.batch) == bags(want.batch)
    assert np.array_equal(got.batch.weights, want.batch.weights)
    assert [r.reason for r in got.rejects] == [r.reason for r in want.rejects]
    assert got.truncated == {"history": 1}


def test_a_weights_column_that_does_not_match_its_values_is_a_bad_weight() -> None:
    t = _table().slice(0, 1)
    bad = pa.RecordBatch.from_pydict({**{n: t.column(n) for n in t.schema.names},
                                      "tags_weights": pa.array([[0.5]])})
    decoded = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode([ipc_message(bad)])
    assert len(decoded.batch) == 0
    assert [r.reason for r in decoded.rejects] == [RejectReason.BAD_WEIGHT]


def test_a_parquet_file_with_lists_replays_as_tsv_and_arrow_to_the_same_batch(tmp_path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "log.parquet"
    table = pa.Table.from_batches([_table()])
    # Integer ids in a list column are sent as their text, hashed by the consumer per field.
    table = table.set_column(table.schema.get_field_index("history"), "history",
                             pa.array([[1, 2], [], [3], [3], [4, 4]]))
    pq.write_table(table, path)
    source = TableSource([str(path)], SCHEMA)
    [batch] = list(source.batches(chunk=100))
    via_tsv = Decoder(SCHEMA).decode(tsv_messages(batch, per_message=2))
    via_arrow = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode(
        arrow_messages(batch, per_message=2))
    assert bags(via_tsv.batch) == bags(via_arrow.batch)
    assert len(via_tsv.batch) == 3 and bags(via_tsv.batch)[0][1] == [
        feature_id("items", "1"), feature_id("items", "2")]
    assert [r.reason for r in via_tsv.rejects] == [r.reason for r in via_arrow.rejects] == [
        RejectReason.TOO_MANY_VALUES, RejectReason.BAD_WEIGHT]


def test_a_jagged_batch_slices_and_writes_list_columns() -> None:
    b = Decoder(SCHEMA).decode([b"\n".join(LINES)]).batch
    assert bags(b.take(np.array([2, 0]))) == [bags(b)[2], bags(b)[0]]
    assert bags(b.take(slice(1, 3))) == bags(b)[1:]
    assert bags(ClickBatch.concat([b.take(slice(0, 1)), b.take(slice(1, None))])) == bags(b)
    arrow = batch_to_arrow(b, SCHEMA)
    assert arrow.column("history").to_pylist() == [row[1] for row in bags(b)]
    assert arrow.column("tags_weights").to_pylist() == [[0.5, 2.0], [], [1.0]]
    assert arrow.column("item").to_pylist() == [row[0][0] for row in bags(b)]
