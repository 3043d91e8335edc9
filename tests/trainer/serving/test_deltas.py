"""The delta log's message format: what goes in comes out, in messages a broker accepts, and
anything else is refused with a reason."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hetgmp.trainer.serving import deltas
from hetgmp.trainer.serving.deltas import (
    Publish,
    decode,
    dense_messages,
    log_version,
    mark_message,
    row_messages,
    tombstone_messages,
)

HEAD = Publish(rank=1, world=2, generation=3, publish=42, step=4200,
               watermark_ms=1_700_000_000_123, lineage="f00d")


@pytest.mark.parametrize("dim", [4, 16, 128])
def test_rows_round_trip_in_messages_under_a_broker_limit(dim: int) -> None:
    rng = np.random.default_rng(dim)
    n = deltas.rows_per_message(dim) * 2 + 5
    ids = rng.integers(0, 1 << 62, n)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    messages = row_messages(ids, values, HEAD)
    assert len(messages) == 3
    assert max(len(m) for m in messages) < 1_000_000  # a broker's default message limit
    got = [decode(m) for m in messages]
    assert {(d.kind, d.head) for d in got} == {("rows", HEAD)}
    np.testing.assert_array_equal(np.concatenate([d.ids for d in got]), ids)
    np.testing.assert_array_equal(np.concatenate([d.values for d in got]), values)


def test_nothing_to_send_makes_no_message() -> None:
    assert row_messages(np.zeros(0, np.int64), np.zeros((0, 8), np.float32), HEAD) == []
    assert tombstone_messages(np.zeros(0, np.int64), HEAD) == []


def test_tombstones_and_marks_round_trip() -> None:
    ids = np.arange(10, 20, dtype=np.int64)
    (message,) = tombstone_messages(ids, HEAD)
    d = decode(message)
    assert d.kind == "tombstones" and d.head == HEAD
    np.testing.assert_array_equal(d.ids, ids)
    m = decode(mark_message(7, HEAD))
    assert m.kind == "mark" and m.messages == 7 and m.head.version == HEAD.version


def test_dense_parameters_round_trip_in_chunks() -> None:
    flat = np.random.default_rng(1).standard_normal(deltas.DENSE_CHUNK + 3).astype(np.float32)
    messages = dense_messages(flat, HEAD)
    assert max(len(m) for m in messages) < 1_000_000
    got = [decode(m) for m in messages]
    assert [d.start for d in got] == [0, deltas.DENSE_CHUNK]
    assert {d.dense_size for d in got} == {flat.size}
    np.testing.assert_array_equal(np.concatenate([d.values for d in got]), flat)


def test_a_newer_generation_outranks_any_publish_of_an_older_one() -> None:
    assert log_version(2, 0) > log_version(1, (1 << deltas.GENERATION_SHIFT) - 1)
    assert log_version(1, 6) > log_version(1, 5)
    with pytest.raises(ValueError):
        log_version(1, 1 << deltas.GENERATION_SHIFT)


@pytest.mark.parametrize("payload", [None, b"", b"garbage that is not arrow"])
def test_what_is_not_a_delta_is_refused_with_a_reason(payload: bytes | None) -> None:
    with pytest.raises(ValueError, match="not an Arrow IPC delta"):
        decode(payload)


def _with_meta(message: bytes, **change: str) -> bytes:
    batch = pa.ipc.open_stream(message).read_next_batch()
    meta = {k.decode(): v.decode() for k, v in batch.schema.metadata.items()} | change
    meta = {k: v for k, v in meta.items() if v}
    sink = pa.BufferOutputStream()
    b = batch.replace_schema_metadata(meta)
    with pa.ipc.new_stream(sink, b.schema) as w:
        w.write_batch(b)
    return bytes(sink.getvalue())


def test_another_format_kind_or_a_missing_field_is_refused() -> None:
    (message,) = tombstone_messages(np.arange(3), HEAD)
    with pytest.raises(ValueError, match="format 'hetgmp-delta/0'"):
        decode(_with_meta(message, **{"hetgmp.format": "hetgmp-delta/0"}))
    with pytest.raises(ValueError, match="unknown delta kind 'weights'"):
        decode(_with_meta(message, **{"hetgmp.kind": "weights"}))
    with pytest.raises(ValueError, match="without what it must hold"):
        decode(_with_meta(message, **{"hetgmp.publish": ""}))
    with pytest.raises(ValueError, match="without what it must hold"):
        decode(_with_meta(message, **{"hetgmp.kind": "rows"}))  # no values column
