import json

import numpy as np
import pytest

from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.hashing import feature_id
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.types import RejectReason


def tsv(label="1", dense=None, sparse=None) -> bytes:
    dense = [str(i * 3) for i in range(13)] if dense is None else dense
    sparse = [f"{i * 7919:08x}" for i in range(26)] if sparse is None else sparse
    return "\t".join([label, *dense, *sparse]).encode()


def reasons(decoded):
    return sorted(r.reason.value for r in decoded.rejects)


def test_valid_line_decodes_labels_dense_and_ids():
    d = Decoder().decode([tsv(label="1"), tsv(label="0", dense=["5"] * 13)])
    b = d.batch
    assert len(b) == 2 and not d.rejects
    assert b.labels.tolist() == [1.0, 0.0]
    np.testing.assert_allclose(b.dense[0], np.log1p(np.arange(13) * 3), rtol=1e-6)
    np.testing.assert_allclose(b.dense[1], np.log1p(5.0), rtol=1e-6)
    assert b.ids.shape == (2, 26)
    assert b.ids[0, 4] == feature_id("C5", f"{4 * 7919:08x}")


def test_missing_values_are_zero_dense_and_the_empty_value_id():
    line = tsv(dense=[""] * 13, sparse=[""] * 26)
    d = Decoder().decode([line])
    assert len(d.batch) == 1 and not d.rejects
    assert (d.batch.dense == 0).all()
    assert d.batch.ids[0, 0] == feature_id("C1", "")
    assert d.batch.ids[0, 25] == feature_id("C26", "")


def test_negative_and_long_dense_values():
    d = Decoder().decode([tsv(dense=["-2", "123456789012", *["1"] * 11])])
    assert not d.rejects
    assert d.batch.dense[0, 0] == 0.0  # log(1 + max(x, 0))
    assert d.batch.dense[0, 1] == pytest.approx(np.log1p(123456789012.0), rel=1e-6)


@pytest.mark.parametrize(
    "line,reason",
    [
        (b"1\t2\t3", RejectReason.WRONG_FIELD_COUNT),
        (tsv() + b"\textra", RejectReason.WRONG_FIELD_COUNT),
        (tsv(dense=["x1", *["1"] * 12]), RejectReason.BAD_DENSE),
        (tsv(dense=["1.5.2", *["1"] * 12]), RejectReason.BAD_DENSE),
        (tsv(dense=["nan", *["1"] * 12]), RejectReason.BAD_DENSE),
        (tsv(dense=["-", *["1"] * 12]), RejectReason.BAD_DENSE),
        (tsv(dense=["1234567890x", *["1"] * 12]), RejectReason.BAD_DENSE),
        (tsv(label="2"), RejectReason.BAD_LABEL),
        (tsv(label=""), RejectReason.MISSING_LABEL),
        (b"\xff\xfe" + tsv(), RejectReason.INVALID_UTF8),
    ],
)
def test_bad_lines_are_rejected_with_their_reason(line, reason):
    d = Decoder().decode([line], partitions=[3], offsets=[42])
    assert len(d.batch) == 0
    assert [(r.reason, r.partition, r.offset, r.payload) for r in d.rejects] == [(reason, 3, 42, line)]


def test_valid_non_ascii_utf8_value_is_accepted():
    line = tsv(sparse=["café", *[f"{i:08x}" for i in range(25)]])
    d = Decoder().decode([line])
    assert not d.rejects and d.batch.ids[0, 0] == feature_id("C1", "café")


def test_empty_lines_are_skipped_and_empty_messages_rejected():
    d = Decoder().decode([b"\n" + tsv() + b"\n\n" + tsv() + b"\r\n", b"", None, b"\n \n"])
    assert len(d.batch) == 2
    assert reasons(d) == ["empty_message"] * 3


def test_a_10mb_line_is_rejected_without_stopping_its_neighbours():
    huge = b"1\t" + b"9" * (10 << 20)
    d = Decoder().decode([tsv(), huge, tsv(label="0")], offsets=[1, 2, 3])
    assert d.batch.offsets.tolist() == [1, 3]
    assert [(r.reason, r.offset, len(r.payload)) for r in d.rejects] == [
        (RejectReason.TOO_LARGE, 2, len(huge))
    ]


def test_message_mixing_good_and_bad_lines():
    msg = b"\n".join([tsv(label="0"), b"garbage", tsv(label="1"), tsv(label="7"), tsv(label="1")])
    d = Decoder().decode([msg], partitions=[1], offsets=[9])
    assert d.batch.labels.tolist() == [0.0, 1.0, 1.0]
    assert d.batch.offsets.tolist() == [9, 9, 9]
    assert reasons(d) == ["bad_label", "wrong_field_count"]


def test_one_record_per_message_and_many_per_message_decode_the_same():
    lines = [tsv(label=str(i % 2), dense=[str(i)] * 13) for i in range(10)]
    one = Decoder().decode(lines).batch
    many = Decoder().decode([b"\n".join(lines[:4]), b"\n".join(lines[4:])]).batch
    for name in ("labels", "dense", "ids"):
        np.testing.assert_array_equal(getattr(one, name), getattr(many, name))


def test_record_coordinates_follow_their_message():
    d = Decoder().decode(
        [tsv() + b"\n" + tsv(), tsv()], partitions=[0, 1], offsets=[5, 7], timestamps_ms=[100, 200]
    )
    assert d.batch.partitions.tolist() == [0, 0, 1]
    assert d.batch.offsets.tolist() == [5, 5, 7]
    assert d.batch.timestamps_ms.tolist() == [100, 100, 200]


def test_custom_schema():
    schema = parse_schema("label=click;dense=age;sparse=user,item")
    d = Decoder(schema).decode([b"1\t30\tu1\ti9", b"0\t\tu2\t"])
    assert d.batch.ids.shape == (2, 2) and not d.rejects
    assert d.batch.ids[0, 1] == feature_id("item", "i9")
    assert parse_schema("2,3").sparse == ("C1", "C2", "C3")


def test_json_lines_decode_like_tsv():
    schema = parse_schema("label=y;dense=a,b;sparse=u,i")
    rec = lambda y, a, b, u, i: json.dumps({"y": y, "a": a, "b": b, "u": u, "i": i}).encode()  # noqa: E731
    dj = Decoder(schema, DecodeConfig("json")).decode(
        [rec(1, 3, None, "x", "y") + b"\n" + b'{"y": 1, "a": "nope", "u": "x"}', rec(0, 0, 5, "x", 12)]
    )
    dt = Decoder(schema).decode([b"1\t3\t\tx\ty", b"0\t0\t5\tx\t12"])
    np.testing.assert_array_equal(dj.batch.ids, dt.batch.ids)
    np.testing.assert_array_equal(dj.batch.dense, dt.batch.dense)
    assert reasons(dj) == ["bad_json"]


def test_json_rejects_non_objects_and_bad_labels():
    schema = parse_schema("label=y;dense=a;sparse=u")
    d = Decoder(schema, DecodeConfig("json")).decode(
        [b"[1,2]", b'{"y": 3, "u": "a"}', b"{not json", b'{"y":0,"u":"a"}']
    )
    assert len(d.batch) == 1 and reasons(d) == ["bad_json"] * 3


def test_json_dense_values_past_a_float_are_rejected_not_raised():
    """A dense value numpy cannot hold must dead-letter its record: raising would fail the batch
    after the consumer moved past it, and again after every restart. Past int64 is a float now;
    past a float (an integer of 400 digits, 1e999) is rejected."""
    schema = parse_schema("label=y;dense=a;sparse=u")
    huge = b"9" * 400
    d = Decoder(schema, DecodeConfig("json")).decode(
        [b'{"y":1,"a":' + huge + b',"u":"x"}', b'{"y":1,"a":1e999,"u":"x"}',
         b'{"y":1,"a":"-' + huge + b'","u":"x"}', b'{"y":1,"a":99999999999999999999,"u":"x"}']
    )
    assert len(d.batch) == 1 and reasons(d) == ["bad_json"] * 3
    assert d.batch.dense[0, 0] == pytest.approx(np.log1p(1e20))


def test_json_nested_past_what_the_parser_takes_is_rejected_not_raised():
    """'[' * 30000: the json module raises RecursionError, which escaped the decoder (a 500 in
    serve; in the consumer, a batch that fails again after every restart)."""
    schema = parse_schema("label=y;dense=a;sparse=u")
    d = Decoder(schema, DecodeConfig("json", max_record_bytes=1 << 20)).decode(
        [b"[" * 30000 + b"]" * 30000, b'{"y":1,"a":2,"u":"x"}', b'{"u":' * 20000]
    )
    assert len(d.batch) == 1 and reasons(d) == ["bad_json"] * 2
    assert d.rejects[0].detail == "nested too deeply"


def test_unknown_format_is_a_clear_error():
    with pytest.raises(ValueError, match="tsv, json, arrow"):
        Decoder(config=DecodeConfig("csv"))  # type: ignore[arg-type]

