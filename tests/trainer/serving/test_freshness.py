"""Model lag tells a quiet stream from a model behind its log (finding 13 of 2026-12-04: after
the stream stopped, serve's model lag kept rising, so an alert on it fired on a healthy job).

A publish's mark carries ``caught_up_ms``: when every rank had read its whole log. Serving's
model lag counts from the later of that and the watermark (the newest trained append time);
the age of the newest record is a gauge of its own.
"""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from small_serving import GEN, LINEAGE, PUBLISHES, SCHEMA
from small_serving import small_model as _model

from hetgmp.streaming import parse_schema
from hetgmp.trainer.serving import Publish, decode, log_version, mark_message
from hetgmp.trainer.serving.deltas import Delta
from hetgmp.trainer.serving.server import Service

QUIET_S = 600  # the newest record is ten minutes old


def _now_ms() -> int:
    return int(time.time() * 1000)


def _mark(rank: int, caught_up_ms: int, now_ms: int) -> Delta:
    """Rank ``rank``'s mark of a publish whose newest record is QUIET_S old at ``now_ms``."""
    return decode(mark_message(0, Publish(
        rank=rank, world=2, generation=GEN, publish=PUBLISHES + 1, step=500,
        watermark_ms=now_ms - QUIET_S * 1000, lineage=LINEAGE, base=log_version(2, 17)),
        caught_up_ms=caught_up_ms))


def _gauges(model) -> dict[str, float]:
    service = Service(model, None, parse_schema(SCHEMA))
    text = generate_latest(service.registry).decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("hetgmp_serve_model_lag_seconds ",
                            "hetgmp_serve_newest_record_age_seconds ")):
            name, value = line.split()
            out[name] = float(value)
    return out


def test_a_quiet_stream_read_to_its_end_is_not_a_lagging_model() -> None:
    model, now = _model(), _now_ms()
    for rank in (0, 1):
        model.apply(_mark(rank, caught_up_ms=now, now_ms=now))
    g = _gauges(model)
    assert g["hetgmp_serve_model_lag_seconds"] < 60  # fresh: every rank had read its log
    assert g["hetgmp_serve_newest_record_age_seconds"] > QUIET_S - 60  # but nothing new


def test_a_rank_behind_its_log_keeps_the_lag_at_its_watermark() -> None:
    model, now = _model(), _now_ms()
    model.apply(_mark(0, caught_up_ms=now, now_ms=now))
    model.apply(_mark(1, caught_up_ms=-1, now_ms=now))  # rank 1 never caught up
    g = _gauges(model)
    assert g["hetgmp_serve_model_lag_seconds"] > QUIET_S - 60
    assert model.fresh_ms == model.watermark_ms == now - QUIET_S * 1000


def test_a_mark_written_before_caught_up_existed_reads_as_never_caught_up() -> None:
    now = _now_ms()
    delta = _mark(0, caught_up_ms=now, now_ms=now)
    assert delta.caught_up_ms == now
    import pyarrow as pa

    batch = pa.ipc.open_stream(mark_message(0, delta.head)).read_next_batch()
    meta = {k: v for k, v in batch.schema.metadata.items() if k != b"hetgmp.caught_up_ms"}
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema.with_metadata(meta)) as w:
        w.write_batch(batch.replace_schema_metadata(meta))
    assert decode(bytes(sink.getvalue())).caught_up_ms == -1
