"""Arrow record batches as a message format: the same records as TSV, and every bad message
dead-lettered by its reason."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
from kafka import KafkaConsumer, KafkaProducer

from hetgmp.streaming.arrow import encode_arrow
from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.streaming.types import ClickBatch

STREAM = SyntheticStream(SyntheticConfig(seed=3))
SCHEMA = STREAM.config.schema


def _ipc(table: pa.Table | pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return sink.getvalue().to_pybytes()


def _tsv(start: int, count: int) -> ClickBatch:
    return Decoder(SCHEMA).decode([b"\n".join(STREAM.lines(start, count))]).batch


def _same(a: ClickBatch, b: ClickBatch) -> None:
    for name in ("labels", "dense", "ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def _string_table(start: int, count: int) -> pa.Table:
    """The TSV lines' fields as columns: sparse values as strings, empty dense values as nulls."""
    rows = [line.split(b"\t") for line in STREAM.lines(start, count)]
    cols = list(zip(*rows))
    label = pa.array([int(v) for v in cols[0]], pa.int8())
    dense = [pa.array([int(v) if v else None for v in c], pa.int64()) for c in cols[1:14]]
    sparse = [pa.array([v.decode() for v in c], pa.string()) for c in cols[14:]]
    return pa.table([label, *dense, *sparse], names=[SCHEMA.label, *SCHEMA.dense, *SCHEMA.sparse])


def test_pre_hashed_ids_decode_to_the_tsv_decoders_batch() -> None:
    block = STREAM.take(0, 3000)
    messages = encode_arrow(SCHEMA, block.labels, block.dense, STREAM.block_ids(block), 1024)
    assert len(messages) == 3  # 1,024 + 1,024 + 952
    out = Decoder(SCHEMA, DecodeConfig("arrow")).decode(messages, [1, 1, 2], [7, 8, 9], [5, 5, 6])
    assert out.rejects == []
    _same(out.batch, _tsv(0, 3000))
    # Every record carries its message's Kafka coordinates.
    assert out.batch.offsets.tolist() == [7] * 1024 + [8] * 1024 + [9] * 952
    assert out.batch.partitions.tolist() == [1] * 2048 + [2] * 952


def test_string_values_are_hashed_as_the_tsv_decoder_hashes_them() -> None:
    table = _string_table(100, 500)
    assert table.column("I1").null_count > 0  # the synthetic stream leaves some fields empty
    # Two messages, one of them with its own (large_string) schema: both decode.
    second = table.slice(250).cast(pa.schema([
        pa.field(f.name, pa.large_string() if f.type == pa.string() else f.type)
        for f in table.schema]))
    out = Decoder(SCHEMA, DecodeConfig("arrow")).decode([_ipc(table.slice(0, 250)), _ipc(second)])
    assert out.rejects == []
    _same(out.batch, _tsv(100, 500))


def test_bad_messages_are_rejected_whole_and_bad_records_alone() -> None:
    block = STREAM.take(0, 8)
    good = encode_arrow(SCHEMA, block.labels, block.dense, STREAM.block_ids(block), 8)[0]
    table = pa.ipc.open_stream(good).read_all()
    labels = block.labels.astype(np.int64)
    labels[2] = 2
    ids = table.column("C3").to_numpy().copy()
    ids[5] = -4
    bad_rows = table.set_column(0, SCHEMA.label, pa.array(labels)).set_column(
        table.schema.get_field_index("C3"), "C3", pa.array(ids))
    payloads = [
        good,
        good[: len(good) // 2],  # truncated
        b"\x00garbage that is no Arrow stream",
        _ipc(table.drop_columns(["C7"])),  # a column missing
        _ipc(table.set_column(1, "I1", pa.array([str(i) for i in range(8)]))),  # wrong type
        _ipc(bad_rows),
        good,
    ]
    out = Decoder(SCHEMA, DecodeConfig("arrow")).decode(payloads, offsets=range(7))
    reasons = [(r.reason.value, r.offset) for r in out.rejects]
    assert sorted(reasons) == sorted([("bad_arrow", 1), ("bad_arrow", 2), ("arrow_schema", 3),
                                      ("arrow_schema", 4), ("bad_label", 5), ("bad_id", 5)])
    details = {r.offset: r.detail for r in out.rejects if r.reason.value == "arrow_schema"}
    assert "'C7'" in details[3] and "'I1'" in details[4] and "string" in details[4]
    # The two good messages and the six good records of the message with two bad ones.
    assert len(out.batch) == 8 + 6 + 8
    assert sorted(set(out.batch.offsets.tolist())) == [0, 5, 6]
    # A bad record is dead-lettered as a one-record Arrow message, which reads back.
    label_reject = next(r for r in out.rejects if r.reason.value == "bad_label")
    row = pa.ipc.open_stream(label_reject.payload).read_all()
    assert row.num_rows == 1 and row.column(SCHEMA.label).to_pylist() == [2]


def test_a_message_far_larger_than_its_records_is_too_large() -> None:
    block = STREAM.take(0, 4)
    message = encode_arrow(SCHEMA, block.labels, block.dense, STREAM.block_ids(block), 4)[0]
    out = Decoder(SCHEMA, DecodeConfig("arrow", max_record_bytes=64)).decode([message])
    assert [r.reason.value for r in out.rejects] == ["too_large"] and len(out.batch) == 0
    assert len(Decoder(SCHEMA, DecodeConfig("arrow")).decode([message]).batch) == 4


def test_a_custom_schema_finds_its_columns_by_name() -> None:
    schema = parse_schema("label=y;dense=a;sparse=u,v")
    table = pa.table({"extra": [1, 2], "v": ["x", "y"], "u": [3, 4], "a": [10, None], "y": [1, 0]})
    out = Decoder(schema, DecodeConfig("arrow")).decode([_ipc(table)])
    assert out.rejects == []
    assert out.batch.labels.tolist() == [1.0, 0.0]
    assert out.batch.ids[:, 0].tolist() == [3, 4]  # integer column: ids as they are
    np.testing.assert_allclose(out.batch.dense[:, 0], [np.log1p(10), 0.0], rtol=1e-6)


@pytest.mark.broker
def test_produced_arrow_batches_train_as_tsv_and_bad_ones_go_to_the_dead_letter_topic(
        kafka, unique) -> None:
    topic = unique("arrow")
    report = produce(kafka, ProduceConfig(topic=topic, count=5000, partitions=2, format="arrow",
                                          records_per_message=1000), SyntheticConfig(seed=3))
    assert report.acked == 5000 and report.messages == 5
    producer = KafkaProducer(**kafka.client_kwargs())
    block = STREAM.take(0, 4)
    good = encode_arrow(SCHEMA, block.labels, block.dense, STREAM.block_ids(block), 4)[0]
    for value in (good[:100], _ipc(pa.ipc.open_stream(good).read_all().drop_columns(["C1"]))):
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    config = ConsumerConfig(topic=topic, group_id="", format="arrow")
    batches = []
    with ClickConsumer(kafka, config) as consumer:
        deadline = time.monotonic() + 60
        while sum(map(len, batches)) < 5000 and time.monotonic() < deadline:
            batches.append(consumer.next_batch(8192, timeout=0.5))
        while consumer.stats.rejected.total() < 2 and time.monotonic() < deadline:
            batches.append(consumer.next_batch(8192, timeout=0.5))
        consumer.flush_dead_letters()
        rejected = dict(consumer.stats.rejected)
    got = ClickBatch.concat([b for b in batches if len(b)])
    order = np.lexsort((got.offsets, got.partitions))  # partition by partition, in log order
    assert rejected == {"bad_arrow": 1, "arrow_schema": 1}
    # Messages went round robin: partition 0 holds records 0-999, 2000-2999, 4000-4999.
    tsv = _tsv(0, 5000)
    expected = np.r_[0:1000, 2000:3000, 4000:5000, 1000:2000, 3000:4000]
    np.testing.assert_array_equal(got.ids[order], tsv.ids[expected])
    dlq = KafkaConsumer(f"{topic}.dlq", **kafka.client_kwargs(), auto_offset_reset="earliest",
                        consumer_timeout_ms=5000)
    letters = sorted(dict(m.headers)["hetgmp.reason"].decode() for m in dlq)
    dlq.close()
    assert letters == ["arrow_schema", "bad_arrow"]
