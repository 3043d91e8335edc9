"""Poison pills: one record that used to stop the pipeline at every restart (a value past
float32, a weight too long for a float, a weighted field sent without its weights) is
dead-lettered by reason in every format, and the records around it decode as usual."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hetgmp.streaming.arrow import ipc_message
from hetgmp.streaming.codec import DecodeConfig, Decoded, Decoder
from hetgmp.streaming.schema_file import load_schema, parse_schema
from hetgmp.streaming.tables import ColumnError, TableSource, arrow_messages, parse_column_map, tsv_messages
from hetgmp.streaming.types import DenseField, RejectReason, Schema, SparseField

SCHEMA = Schema.of("y", [DenseField("price", "none"), DenseField("views")], [
    SparseField("item"),
    SparseField("tags", max_len=4, weighted=True),
])
GOOD = {"y": 1, "price": 2.5, "views": 3, "item": "a", "tags": ["x", "y"], "tags_weights": [0.5, 2]}
# streaming.lists.MAX_MAGNITUDE: the documented bound of a weight and a transform-none value.
BOUND = 1e18


def tsv(record: dict) -> bytes:
    tags = ",".join(f"{t}:{w}" for t, w in zip(record["tags"], record["tags_weights"]))
    return "\t".join(str(record[k]) for k in ("y", "price", "views", "item")).encode() + \
        b"\t" + tags.encode()


def arrow(records: list[dict]) -> bytes:
    return ipc_message(pa.RecordBatch.from_pydict({
        "y": pa.array([r["y"] for r in records], pa.int8()),
        "price": pa.array([float(r["price"]) for r in records]),
        "views": pa.array([r["views"] for r in records], pa.int64()),
        "item": pa.array([r["item"] for r in records]),
        "tags": pa.array([r["tags"] for r in records], pa.list_(pa.string())),
        "tags_weights": pa.array([[float(w) for w in r["tags_weights"]] for r in records],
                                 pa.list_(pa.float64())),
    }))


def decode(fmt: str, records: list[dict]) -> Decoded:
    if fmt == "tsv":
        payloads = [tsv(r) for r in records]
    elif fmt == "json":
        payloads = [json.dumps(r).encode() for r in records]
    else:
        payloads = [arrow(records)]
    return Decoder(SCHEMA, DecodeConfig(format=fmt)).decode(payloads)  # type: ignore[arg-type]


def assert_trainable(decoded: Decoded) -> None:
    """What training takes stays finite in float32: dense values, weights, each bag's sum."""
    b = decoded.batch
    assert b.dense.dtype == np.float32 and np.isfinite(b.dense).all()
    weights = b.value_weights()
    assert weights.dtype == np.float32 and np.isfinite(weights).all()
    bag = np.repeat(np.arange(b.lengths.size), b.lengths.reshape(-1))
    assert np.isfinite(np.bincount(bag, weights.astype(np.float32), b.lengths.size)
                       .astype(np.float32)).all()


@pytest.mark.parametrize("fmt", ["tsv", "json", "arrow"])
@pytest.mark.parametrize(("change", "reason"), [
    ({"price": 1e39}, RejectReason.BAD_DENSE),  # finite in float64, an infinity in float32
    ({"price": -2e18}, RejectReason.BAD_DENSE),  # past the documented bound
    ({"tags_weights": [3e38, 3e38]}, RejectReason.BAD_WEIGHT),  # each fits; the pooled sum not
    ({"tags_weights": [1e39, 1]}, RejectReason.BAD_WEIGHT),
])
def test_a_value_past_float32_is_dead_lettered_and_the_records_around_it_train(
        fmt: str, change: dict, reason: RejectReason) -> None:
    bad = {**GOOD, **change}
    d = decode(fmt, [GOOD, bad, GOOD])
    assert len(d.batch) == 2
    # A JSON record's dense values are one reason with its other fields: bad_json.
    json_dense = fmt == "json" and reason == RejectReason.BAD_DENSE
    assert [r.reason for r in d.rejects] == [RejectReason.BAD_JSON if json_dense else reason]
    assert f"{BOUND:g}" in d.rejects[0].detail  # the reason says where the bound is
    assert_trainable(d)


def test_values_up_to_the_bound_are_kept_and_their_bags_stay_finite() -> None:
    edge = {**GOOD, "price": -BOUND, "tags": ["x"] * 4, "tags_weights": [1e18] * 4}
    for fmt in ("tsv", "json", "arrow"):
        d = decode(fmt, [edge])
        assert not d.rejects and d.batch.dense[0, 0] == np.float32(-1e18)
        assert_trainable(d)


def test_a_json_weight_too_long_for_a_float_is_a_bad_weight_not_a_raise() -> None:
    """``float(10**400)`` raised OverflowError out of the decoder: consume and train ended in a
    traceback at every restart."""
    bad = {**GOOD, "tags_weights": [10**400, 1]}
    d = decode("json", [GOOD, bad, GOOD])
    assert len(d.batch) == 2 and [r.reason for r in d.rejects] == [RejectReason.BAD_WEIGHT]


@pytest.mark.parametrize("weights", [[1], [1, 2, 3], 0.5, {"x": 1}, None, "missing"])
def test_json_weights_that_are_not_one_a_value_are_a_bad_weight(weights: object) -> None:
    bad = {**GOOD, "tags_weights": weights}
    if weights == "missing":
        del bad["tags_weights"]
    d = decode("json", [GOOD, bad])
    assert len(d.batch) == 1 and [r.reason for r in d.rejects] == [RejectReason.BAD_WEIGHT]


def test_a_weighted_field_without_its_weights_never_trains_with_weight_one() -> None:
    """Every format: values of a weighted field sent without weights dead-letter; an empty
    bag needs none; JSON weights of an empty bag are not one a value either."""
    tsv_d = Decoder(SCHEMA).decode([b"1\t1\t1\ta\tx:2,y", b"1\t1\t1\ta\tx", b"1\t1\t1\ta\t"])
    assert [r.reason for r in tsv_d.rejects] == [RejectReason.BAD_WEIGHT] * 2
    assert len(tsv_d.batch) == 1 and tsv_d.batch.lengths.tolist() == [[1, 0]]
    no_key = {k: v for k, v in GOOD.items() if k != "tags_weights"}
    empty = {**no_key, "tags": []}
    extra = {**empty, "tags_weights": [1.0]}
    json_d = decode("json", [no_key, empty, extra])
    assert [r.reason for r in json_d.rejects] == [RejectReason.BAD_WEIGHT] * 2
    assert json_d.rejects[0].payload == json.dumps(no_key).encode()
    assert len(json_d.batch) == 1
    # Arrow: a message without the weights column is refused whole, naming it; a row whose
    # weights are null, or not one a value, alone.
    t = pa.RecordBatch.from_pylist([{**GOOD, "price": 2.5}, {**GOOD, "price": 2.5}])
    no_column = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode(
        [ipc_message(t.drop_columns(["tags_weights"]))])
    assert [r.reason for r in no_column.rejects] == [RejectReason.ARROW_SCHEMA]
    assert "'tags_weights'" in no_column.rejects[0].detail
    rows = t.set_column(5, "tags_weights", pa.array([None, [1.0]], pa.list_(pa.float64())))
    d = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode([ipc_message(rows)])
    assert len(d.batch) == 0 and [r.reason for r in d.rejects] == [RejectReason.BAD_WEIGHT] * 2


def test_the_schema_names_the_weights_column_and_the_column_map_takes_it(tmp_path) -> None:
    path = tmp_path / "schema.toml"
    path.write_text('label = "y"\n[dense.price]\ntransform = "none"\n[dense.views]\n'
                    '[sparse.item]\n[sparse.tags]\nmax_len = 4\nweighted = true\n'
                    'weights = "tags_w"\n')
    named = load_schema(path)
    assert named.sparse_fields[1].weights == "tags_w"
    record = {**{k: v for k, v in GOOD.items() if k != "tags_weights"}, "tags_w": [0.5, 2]}
    d = Decoder(named, DecodeConfig(format="json")).decode([json.dumps(record).encode()])
    assert not d.rejects and d.batch.weights is not None
    assert d.batch.weights.tolist() == [1, 0.5, 2]
    # A file whose weights column is called otherwise: --column-map names it (the weights'
    # own name or <field>_weights), for the default schema and the named one alike.
    pq.write_table(pa.table({"y": [1], "price": [2.5], "views": [3], "item": ["a"],
                             "tags": [["x", "y"]], "w": [[0.5, 2.0]]}), tmp_path / "log.parquet")
    files = [str(tmp_path / "log.parquet")]
    for schema, spec in ((SCHEMA, "tags_weights=w"), (named, "tags_w=w"), (named, "tags_weights=w")):
        source = TableSource(files, schema, parse_column_map(spec, schema))
        [batch] = list(source.batches(10))
        for fmt, messages in (("tsv", tsv_messages(batch, 1)), ("arrow", arrow_messages(batch, 1))):
            got = Decoder(schema, DecodeConfig(format=fmt)).decode(messages)  # type: ignore[arg-type]
            assert not got.rejects and got.batch.weights.tolist() == [1, 0.5, 2], (spec, fmt)
    with pytest.raises(ValueError, match="'history_weights' is not a field"):
        parse_column_map("history_weights=w", SCHEMA)
    with pytest.raises(ValueError, match="weighted = true"):
        SparseField("tags", weights="w")


def test_a_file_without_the_weights_column_is_refused_before_anything_is_sent(tmp_path) -> None:
    pq.write_table(pa.table({"y": [1], "price": [2.5], "views": [3], "item": ["a"],
                             "tags": [["x", "y"]]}), tmp_path / "log.parquet")
    with pytest.raises(ColumnError) as err:
        TableSource([str(tmp_path / "log.parquet")], SCHEMA)
    message = str(err.value)
    assert "no column 'tags_weights'" in message and "weighted field 'tags'" in message
    assert "--column-map tags_weights=COLUMN" in message


def test_a_replay_sends_every_value_as_it_is_for_the_consumer_to_refuse(tmp_path) -> None:
    """Values pyarrow refused to convert stopped a replay at the file's first such record (a
    label of 1e300 or an infinity cast to an integer, a weight past 2**24 cast to float32,
    bytes that are not UTF-8 cast to text); they travel now and are dead-lettered."""
    pq.write_table(pa.table({
        "y": pa.array([1.0, 1e300, float("inf"), 0.0, 1.0]),
        "price": [2.5, 1.0, 1.0, 1e39, 1.0],
        "views": [3, 3, 3, 3, 3],
        "item": pa.array([b"a", b"b", b"c", b"d", b"\xff"]),
        "tags": [["x"], ["x"], ["x"], ["x"], ["x"]],
        "tags_weights": pa.array([[2**40], [1], [1], [1], [1]], pa.list_(pa.int64())),
    }), tmp_path / "log.parquet")
    [batch] = list(TableSource([str(tmp_path / "log.parquet")], SCHEMA).batches(10))
    for fmt, messages in (("tsv", tsv_messages(batch, 2)), ("arrow", arrow_messages(batch, 1))):
        d = Decoder(SCHEMA, DecodeConfig(format=fmt)).decode(messages)  # type: ignore[arg-type]
        assert len(d.batch) + len(d.rejects) == 5, fmt
        assert d.batch.weights is not None and d.batch.weights.tolist()[:2] == [1, 2.0**40]
        assert_trainable(d)
        assert {r.reason for r in d.rejects} >= {RejectReason.BAD_LABEL, RejectReason.BAD_DENSE}


def test_arrow_columns_that_stopped_the_decoder_are_refused_by_reason() -> None:
    """A boolean label with a null, a duplicated column, unsigned ids with a null: each raised
    out of the Arrow decoder (ArrowInvalid, KeyError)."""
    schema = parse_schema("label=y;dense=a;sparse=u")
    decoder = Decoder(schema, DecodeConfig(format="arrow"))
    nulls = pa.RecordBatch.from_pydict({"y": pa.array([True, None, False]), "a": [1, 2, 3],
                                        "u": pa.array([1, None, 2**64 - 1], pa.uint64())})
    d = decoder.decode([ipc_message(nulls)])
    assert len(d.batch) == 1 and d.batch.labels.tolist() == [1.0]
    assert [r.reason for r in d.rejects] == [RejectReason.MISSING_LABEL, RejectReason.BAD_ID]
    twice = pa.RecordBatch.from_arrays([pa.array([1]), pa.array([1]), pa.array([1]),
                                        pa.array(["x"])], names=["y", "a", "a", "u"])
    d = decoder.decode([ipc_message(twice), ipc_message(nulls.slice(0, 1))])
    assert len(d.batch) == 1 and [r.reason for r in d.rejects] == [RejectReason.ARROW_SCHEMA]
    assert "'a' appears more than once" in d.rejects[0].detail
