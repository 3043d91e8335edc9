"""``hetgmp serve``'s HTTP side: predictions from a :class:`ServingModel`, health, metrics.

aiohttp serves the requests (a body over ``--max-body-bytes`` is refused before it is read
whole); decoding and the forward pass run on a small thread pool, since numpy and torch release
the interpreter while they compute. Routes:

* ``POST /predict``: records in the consumer's formats, chosen by Content-Type
  (``text/tab-separated-values`` or ``text/plain``: Criteo TSV; ``application/x-ndjson``,
  ``application/jsonl`` or ``application/json``: JSON lines), one record a line, the label field
  present and ignored. Answers ``{"scores": [...], "model": {...}}``, one score per record in
  order; a request with any malformed record is refused whole (400, each bad line's number and
  reason), so that scores never shift against the records they belong to.
* ``GET /healthz``: the process and its follower of the delta log are alive.
* ``GET /readyz``: a checkpoint is loaded and the log has been caught up with once.
* ``GET /metrics``: Prometheus exposition.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from streaming import DecodeConfig, Decoder, Schema
from trainer.serving.follower import FollowerThread
from trainer.serving.model import ServingModel

__all__ = ["ServeMetrics", "Service", "build_app"]

log = logging.getLogger(__name__)

_TSV = {"text/tab-separated-values", "text/plain"}
_JSON = {"application/x-ndjson", "application/jsonl", "application/json"}
# Latency buckets (seconds): a 256-record request takes milliseconds on a CPU.
_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class ServeMetrics:
    """The serve process's metrics: request counters here, the model's read at scrape time."""

    def __init__(self, registry: CollectorRegistry, service: Service) -> None:
        self.requests = Counter("hetgmp_serve_requests", "Prediction requests answered, by "
                                "HTTP status", ["code"], registry=registry)
        self.records = Counter("hetgmp_serve_records_scored", "Records scored",
                               registry=registry)
        self.latency = Histogram("hetgmp_serve_request_seconds", "Time to answer a prediction "
                                 "request (read, decode, score, reply)", buckets=_BUCKETS,
                                 registry=registry)
        registry.register(_ModelCollector(service))


class _ModelCollector:
    """Figures of the model and its follower, read when scraped."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        s = self.service
        m, a = s.model, s.model.applied
        yield GaugeMetricFamily("hetgmp_serve_rows", "Embedding rows held", value=len(m.table))
        deltas = CounterMetricFamily("hetgmp_serve_deltas_applied", "Delta-log messages "
                                     "applied, by kind", labels=["kind"])
        for kind in ("rows", "tombstones", "dense", "mark"):
            deltas.add_metric([kind], a.by_kind.get(kind, 0))
        yield deltas
        if s.follower is not None:
            rejected = CounterMetricFamily("hetgmp_serve_deltas_rejected", "Delta-log messages "
                                           "refused and skipped, by reason (the model keeps "
                                           "what it held)", labels=["reason"])
            for reason, n in s.follower.follower.stats.rejected.items():
                rejected.add_metric([reason], n)
            yield rejected
        yield CounterMetricFamily("hetgmp_serve_rows_applied", "Rows replaced or added by the "
                                  "log", value=a.rows)
        yield CounterMetricFamily("hetgmp_serve_rows_removed", "Rows removed by tombstones",
                                  value=a.tombstones)
        yield CounterMetricFamily("hetgmp_serve_unknown_ids", "Ids scored without a row (with "
                                  "their initial value)", value=m.unknown_ids)
        yield CounterMetricFamily("hetgmp_serve_publish_gaps", "Publishes missing or out of "
                                  "order in the log", value=a.gaps)
        yield CounterMetricFamily("hetgmp_serve_publishes_incomplete", "Publishes whose "
                                  "messages were not all seen", value=a.incomplete)
        yield GaugeMetricFamily("hetgmp_serve_model_step", "Training step of the newest "
                                "complete publish applied", value=m.step)
        wm = m.watermark_ms
        if wm >= 0:  # no sample before every rank has published one
            yield GaugeMetricFamily("hetgmp_serve_model_lag_seconds", "Now minus the newest "
                                    "Kafka append time whose every update the model holds",
                                    value=time.time() - wm / 1000.0)
        yield GaugeMetricFamily("hetgmp_serve_ready", "1 once the log was caught up with",
                                value=float(s.ready))


@dataclass
class Service:
    """What the routes need.

    Attributes:
        model: The model answering.
        follower: Its follower of the delta log (None: a fixed checkpoint).
        schema: The records' field names.
        format: The record format of a request without a Content-Type.
        max_record_bytes: Longer records are malformed.
        max_records: Most records one request may hold.
        threads: Threads that decode and score.
    """

    model: ServingModel
    follower: FollowerThread | None
    schema: Schema
    format: str = "tsv"
    max_record_bytes: int = 65536
    max_records: int = 65536
    threads: int = 2

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ServeMetrics(self.registry, self)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="score")
        self._decoders = {f: Decoder(self.schema, DecodeConfig(f, self.max_record_bytes))
                          for f in ("tsv", "json")}

    @property
    def ready(self) -> bool:
        """A checkpoint is loaded and the log was caught up with (or there is no log)."""
        f = self.follower
        return f is None or (f.follower.stats.caught_up and not f.follower.stats.error)

    def score(self, body: bytes, fmt: str) -> tuple[int, dict[str, Any]]:
        """(status, reply) for a request body (runs on the pool)."""
        lines = body.split(b"\n")
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            return 400, {"error": "no records in the request body"}
        if len(lines) > self.max_records:
            return 413, {"error": f"{len(lines)} records in one request; at most "
                                  f"{self.max_records} (--max-records)"}
        decoded = self._decoders[fmt].decode(lines, offsets=np.arange(len(lines)))
        if decoded.rejects:
            bad = sorted(decoded.rejects, key=lambda r: r.offset)
            return 400, {"error": f"{len(bad)} malformed record(s) of {len(lines)}; nothing "
                                  "was scored",
                         "rejected": [{"line": int(r.offset) + 1, "reason": r.reason.value,
                                       **({"detail": r.detail} if r.detail else {})}
                                      for r in bad[:100]]}
        scores = self.model.score(decoded.batch)
        self.metrics.records.inc(len(scores))
        m = self.model
        wm = m.watermark_ms
        return 200, {"scores": np.round(scores, 7).tolist(),  # 4x faster than a float loop
                     "model": {"step": m.step, "watermark_ms": wm,
                               "lag_s": round(time.time() - wm / 1000.0, 3) if wm >= 0
                               else None}}


def build_app(service: Service, max_body_bytes: int) -> Any:
    """The aiohttp application of ``service``."""
    from aiohttp import web

    async def predict(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        status, reply = await _predict(request)
        service.metrics.requests.labels(str(status)).inc()
        if status == 200:
            service.metrics.latency.observe(time.perf_counter() - t0)
        return web.json_response(reply, status=status, dumps=_dumps)

    async def _predict(request: web.Request) -> tuple[int, dict[str, Any]]:
        ctype = request.content_type  # "application/octet-stream" when none is given
        if ctype in _TSV:
            fmt = "tsv"
        elif ctype in _JSON:
            fmt = "json"
        elif ctype == "application/octet-stream" and not request.headers.get("Content-Type"):
            fmt = service.format
        else:
            return 415, {"error": f"Content-Type {ctype!r} is not a record format: send "
                                  f"{sorted(_TSV)} for TSV or {sorted(_JSON)} for JSON lines"}
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return 413, {"error": f"the body is over {max_body_bytes} bytes (--max-body-bytes)"}
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(service.pool, service.score, body, fmt)
        except ValueError as exc:  # records the model cannot take
            return 400, {"error": str(exc)}

    async def healthz(_: web.Request) -> web.Response:
        f = service.follower
        if f is not None and (f.follower.stats.error or not f.is_alive()):
            return web.json_response({"ok": False, "error": f.follower.stats.error or
                                      "the delta-log follower stopped"}, status=503)
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        if service.ready:
            return web.json_response({"ready": True, "step": service.model.step})
        f = service.follower
        reason = (f.follower.stats.error if f is not None and f.follower.stats.error
                  else "catching up with the delta log")
        return web.json_response({"ready": False, "reason": reason}, status=503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(service.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_post("/predict", predict)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False)
