"""No delta message, however malformed, changes what serving holds or stops it (invariant 10).

Each case below is a message a probe of 2026-12-04 wrote to a job's delta log: every one of
them either stopped the follower for good or changed served scores. Here each must be refused
with its reason, counted, and leave the model exactly as it was; a valid message after it is
applied as usual. Messages are crafted the way a writer to the topic can: with the job's own
lineage, which any message of the topic shows.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pytest
from small_serving import GEN, IDS, LINEAGE, PUBLISHES
from small_serving import numel as _numel
from small_serving import small_batch as _batch
from small_serving import small_model as _model

from hetgmp.trainer.serving import (
    Publish,
    ServingModel,
    dense_messages,
    log_version,
    mark_message,
    row_messages,
)
from hetgmp.trainer.serving.follower import DeltaGate, FollowerStats
from hetgmp.trainer.serving.signing import Signer

HEAD = Publish(rank=0, world=2, generation=GEN, publish=PUBLISHES + 1, step=500,
               watermark_ms=1_700_000_000_000, lineage=LINEAGE, base=log_version(2, 17))


def _state(model: ServingModel) -> tuple[np.ndarray, ...]:
    ids, values, versions, flat = model.export()
    return ids, values, versions, flat, model.score(_batch())


def _ipc(columns: dict[str, pa.Array], meta: dict[str, object]) -> bytes:
    batch = pa.record_batch(list(columns.values()), names=list(columns))
    batch = batch.replace_schema_metadata({f"hetgmp.{k}": str(v) for k, v in meta.items()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


def _meta(kind: str, **change: object) -> dict[str, object]:
    h = HEAD
    out: dict[str, object] = {"format": "hetgmp-delta/1", "kind": kind, "lineage": h.lineage,
                              "rank": h.rank, "world": h.world, "generation": h.generation,
                              "publish": h.publish, "step": h.step,
                              "watermark_ms": h.watermark_ms, "base": h.base}
    return out | change


def _rows(width: int = 17, values: float | None = None, **meta: object) -> bytes:
    v = np.full((4, width), 0.5 if values is None else values, np.float32)
    flat = pa.array(v.reshape(-1))
    return _ipc({"id": pa.array(IDS[:4]), "values": pa.FixedSizeListArray.from_arrays(flat, width)},
                _meta("rows", **meta))


def _dense(size: int, start: int = 0, n: int = 4, fill: float = 0.25) -> bytes:
    return _ipc({"start": pa.array([start], pa.int64()),
                 "values": pa.array([np.full(n, fill, np.float32)], pa.list_(pa.float32()))},
                _meta("dense", dense_size=size))


# Each: (the message, the reason it is refused for). Named as the probe found them.
POISON: dict[str, tuple[Callable[[], bytes], str]] = {
    "rows 20 wide, the model's are 17": (lambda: _rows(width=20), "shape"),
    "rows as a variable-length list": (lambda: _ipc(
        {"id": pa.array(IDS[:2]),
         "values": pa.array([[0.5] * 17, [0.5] * 17], pa.list_(pa.float32()))},
        _meta("rows")), "schema"),
    "publish 2^40": (lambda: _rows(publish=1 << 40), "bounds"),
    "generation -1": (lambda: _rows(generation=-1), "bounds"),
    "dense of size 4": (lambda: _dense(4), "shape"),
    "dense of size -5": (lambda: _dense(-5), "bounds"),
    "dense of size 2^40": (lambda: _dense(1 << 40), "bounds"),
    "dense starting past the end": (lambda: _dense(_numel(), start=_numel() - 2), "bounds"),
    "NaN rows": (lambda: _rows(values=float("nan")), "not_finite"),
    "infinite rows": (lambda: _rows(values=float("inf")), "not_finite"),
    "NaN dense": (lambda: _dense(_numel(), n=_numel(), fill=float("nan")), "not_finite"),
    "a mark of a newer generation from base 0 (wipes every row)": (lambda: _ipc(
        {"messages": pa.array([0], pa.int64())}, _meta("mark", generation=GEN + 1, base=0,
                                                       publish=1)), "order"),
    "a publish far ahead of the rank's (outranks every later one)": (
        lambda: _rows(publish=PUBLISHES + (1 << 20)), "order"),
    "a generation far ahead (outranks every later run)": (
        lambda: _rows(generation=GEN + 100_000, base=log_version(GEN, PUBLISHES)), "order"),
    "a world of 3 in a generation of 2 ranks": (lambda: _rows(world=3), "bounds"),
    "ids twice in one message": (lambda: _ipc(
        {"id": pa.array([7, 7], pa.int64()),
         "values": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(34, np.float32)), 17)},
        _meta("rows")), "shape"),
    "ids as strings": (lambda: _ipc(
        {"id": pa.array(["7"]),
         "values": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(17, np.float32)), 17)},
        _meta("rows")), "schema"),
    "not Arrow": (lambda: b"\x00" * 64, "format"),
    "a header that is not a number": (lambda: _rows(step="soon"), "schema"),
}


@pytest.mark.parametrize("name", list(POISON))
def test_a_poisoned_delta_is_refused_counted_and_changes_nothing(name: str) -> None:
    message, reason = POISON[name]
    model = _model()
    before = _state(model)
    gate = DeltaGate(model, FollowerStats())
    assert not gate.receive(message(), None, "test@0")
    assert gate.stats.rejected[reason] == 1
    assert sum(gate.stats.rejected.values()) == 1
    for held, now in zip(before, _state(model)):
        np.testing.assert_array_equal(held, now)
    # The follower goes on: the next valid publish is applied as usual.
    (good,) = row_messages(IDS[:4], np.full((4, 17), 0.5, np.float32), HEAD)
    assert gate.receive(good, None, "test@1")
    np.testing.assert_array_equal(model.table.gather(IDS[:4])[0], 0.5)


def test_a_refusal_reason_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    gate = DeltaGate(_model(), FollowerStats())
    for offset in range(5):
        gate.receive(_rows(width=20), None, f"test@{offset}")
    assert gate.stats.rejected["shape"] == 5
    assert len([r for r in caplog.records if "rejected (shape)" in r.getMessage()]) == 1


def test_a_legitimate_new_generation_still_takes_over() -> None:
    """The order checks refuse nothing a resumed run sends: its base is the checkpoint serving
    started from (or later), its publishes follow that checkpoint's."""
    model = _model()
    head = Publish(rank=1, world=3, generation=GEN + 2, publish=PUBLISHES + 1, step=600,
                   watermark_ms=1_700_000_001_000, lineage=LINEAGE,
                   base=log_version(GEN, PUBLISHES))
    gate = DeltaGate(model, FollowerStats())
    (rows,) = row_messages(IDS[:4], np.full((4, 17), 0.75, np.float32), head)
    flat = np.full(_numel(), 0.01, np.float32)
    messages = [rows, *dense_messages(flat, head), mark_message(2, head)]
    assert all(gate.receive(m, None, "test") for m in messages)
    assert model.applied.generations == 1 and model.dense_version == head.version
    np.testing.assert_array_equal(model.export()[3], flat)
    np.testing.assert_array_equal(model.table.gather(IDS[:4])[0], 0.75)


def test_a_signed_log_applies_only_what_the_key_signed() -> None:
    key = Signer(b"k" * 32)
    model = _model()
    gate = DeltaGate(model, FollowerStats(), signer=key)
    (good,) = row_messages(IDS[:4], np.full((4, 17), 0.5, np.float32), HEAD)
    forged = row_messages(IDS[:4], np.full((4, 17), 9.0, np.float32), HEAD)[0]
    assert not gate.receive(forged, None, "unsigned")
    assert not gate.receive(forged, Signer(b"x" * 32).headers(forged), "another key")
    assert not gate.receive(forged, key.headers(good), "the signature of another payload")
    assert not gate.receive(forged, key.headers(forged) * 2, "two signatures")
    assert gate.stats.rejected["signature"] == 4
    np.testing.assert_array_equal(model.table.gather(IDS[:4])[0] == 9.0, False)
    assert gate.receive(good, key.headers(good), "signed")
    np.testing.assert_array_equal(model.table.gather(IDS[:4])[0], 0.5)
