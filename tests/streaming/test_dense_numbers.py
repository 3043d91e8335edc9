"""Dense values as numbers: integers as before, floats in every format, bad ones dead-lettered."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from hetgmp.streaming.arrow import ipc_message
from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.types import DenseField, RejectReason, Schema, SparseField

SCHEMA = Schema.of("label", [DenseField("price", "none"), DenseField("views")],
                   [SparseField("item")])


def _tsv(price: str, views: str = "3") -> bytes:
    return f"1\t{price}\t{views}\tshoe".encode()


@pytest.mark.parametrize(("text", "value"), [
    ("2.5", 2.5), ("-1e-3", -1e-3), (".5", 0.5), ("7", 7.0), ("", 0.0),
    ("9.5e17", 9.5e17), ("-1e18", -1e18),  # as far as a transform-none value goes
])
def test_tsv_dense_values_may_be_floats(text: str, value: float) -> None:
    d = Decoder(SCHEMA).decode([_tsv(text)])
    assert not d.rejects
    assert d.batch.dense[0].tolist() == pytest.approx([value, np.log1p(3.0)])


def test_a_value_past_int64_is_a_float_on_a_log1p_field_and_too_large_on_a_field_of_none() -> None:
    """log1p keeps any finite number small; a value trained as it is must stay within 1e18, so
    that float32 holds it (1e39 was an infinity) and sums of it."""
    past = "1234567890123456789012"
    d = Decoder(SCHEMA).decode([_tsv("1", past), _tsv(past), _tsv("1e39")])
    assert d.batch.dense.tolist() == [[1.0, pytest.approx(np.log1p(1.234567890123456789012e21))]]
    assert [r.reason for r in d.rejects] == [RejectReason.BAD_DENSE] * 2
    assert "1e+18" in d.rejects[0].detail


@pytest.mark.parametrize("text", ["1.5.2", "nan", "inf", "-", "1e", "x1", "1" * 41])
def test_tsv_dense_values_that_are_no_finite_number_are_dead_lettered(text: str) -> None:
    good, bad = _tsv("1.5"), _tsv(text)
    d = Decoder(SCHEMA).decode([good, bad, good])
    assert len(d.batch) == 2  # the records around it decode
    assert [(r.reason, r.payload) for r in d.rejects] == [(RejectReason.BAD_DENSE, bad)]


def test_an_integer_log_decodes_bit_for_bit_as_before() -> None:
    rng = np.random.default_rng(3)
    raw = rng.integers(-5, 10**12, size=(200, 13))
    lines = [b"0\t" + b"\t".join(str(v).encode() for v in row) + b"\t" +
             b"\t".join([b"ab"] * 26) for row in raw]
    dense = Decoder().decode(lines).batch.dense
    expected = np.log1p(np.maximum(raw, 0).astype(np.float64)).astype(np.float32)
    assert np.array_equal(dense, expected)


def test_json_dense_values_are_numbers_or_strings_of_numbers() -> None:
    rows = [{"label": 1, "price": 2.5, "views": 3, "item": "a"},
            {"label": 0, "price": "0.25", "views": None, "item": "b"},
            {"label": 1, "price": True, "views": 1, "item": "c"},
            {"label": 1, "price": float("nan"), "views": 1, "item": "d"}]
    payloads = [json.dumps(r).encode() for r in rows]
    d = Decoder(SCHEMA, DecodeConfig(format="json")).decode(payloads)
    np.testing.assert_allclose(d.batch.dense, [[2.5, np.log1p(3.0)], [0.25, 0.0]], rtol=1e-6)
    assert [r.reason for r in d.rejects] == [RejectReason.BAD_JSON] * 2  # one reason for JSON


def test_arrow_float_dense_columns_decode_and_non_finite_values_are_dead_lettered() -> None:
    batch = pa.record_batch({
        "label": pa.array([1, 0, 1], pa.int8()),
        "price": pa.array([2.5, float("inf"), None], pa.float64()),
        "views": pa.array([3.0, 1.0, 4.0], pa.float32()),
        "item": pa.array(["a", "b", "c"]),
    })
    d = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode([ipc_message(batch)])
    np.testing.assert_allclose(d.batch.dense, [[2.5, np.log1p(3.0)], [0.0, np.log1p(4.0)]],
                               rtol=1e-6)
    assert [r.reason for r in d.rejects] == [RejectReason.BAD_DENSE]


def test_a_parquet_file_of_floats_replays_to_the_same_features_as_tsv_and_as_arrow(
        tmp_path) -> None:
    import pyarrow.parquet as pq

    from hetgmp.streaming.tables import TableSource, arrow_messages, parse_column_map, tsv_messages

    price = [2.5, 0.125, None, -3.0]
    pq.write_table(pa.table({"label": [1, 0, 1, 0], "price": price,
                             "views": pa.array([1.5, 2.0, 3.0, 4.25], pa.float32()),
                             "item": ["a", "b", "c", "d"]}), tmp_path / "log.parquet")
    source = TableSource([str(tmp_path / "log.parquet")], SCHEMA, parse_column_map("", SCHEMA))
    batch = next(iter(source.batches(100)))
    tsv = Decoder(SCHEMA).decode(tsv_messages(batch, 2))
    arrow = Decoder(SCHEMA, DecodeConfig(format="arrow")).decode(arrow_messages(batch, 2))
    assert not tsv.rejects and not arrow.rejects
    expected = [[p or 0.0, np.log1p(v)] for p, v in zip(price, [1.5, 2.0, 3.0, 4.25])]
    np.testing.assert_allclose(tsv.batch.dense, expected, rtol=1e-6)
    assert np.array_equal(tsv.batch.dense, arrow.batch.dense)
    assert np.array_equal(tsv.batch.ids, arrow.batch.ids)


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00garbage\n", b"\xff\xfe\x00garbage"])
def test_a_message_whose_every_line_is_rejected_decodes_to_nothing_and_its_reasons(
        payload: bytes) -> None:
    # Seen in serve: with no line left, the dense parse met an empty [0, D] array and raised.
    d = Decoder().decode([payload])
    assert len(d.batch) == 0 and [r.reason for r in d.rejects] == [RejectReason.INVALID_UTF8]
    d = Decoder(parse_schema("label=y;sparse=a")).decode([b"1\tx", b"\xff"])  # no dense field
    assert len(d.batch) == 1 and d.batch.dense.shape == (1, 0)
