"""``hetgmp serve``'s HTTP side: predictions from a :class:`ServingModel`, health, metrics.

aiohttp serves the requests; decoding and the forward pass run on a small thread pool, since
numpy and torch release the interpreter while they compute. What a client can hold:

* a connection that has not sent a whole request head ``--header-timeout-s`` after it opened
  (or after its last reply) is closed: aiohttp's keep-alive timer, which also runs before the
  first request;
* a body not received within ``--body-timeout-s`` gets 408;
* a body over ``--max-body-bytes`` gets 413 before it is read whole; bodies in memory at once
  (being read, decoded or scored) are bounded by ``--max-inflight-bytes``: past it a request
  gets 503 with ``Retry-After`` before its body is read;
* more than ``--max-records`` lines get 413 before they are split.

The process listens at once; until a model is loaded ``/predict`` answers 503 and ``/readyz``
says what it waits for. Routes:

* ``POST /predict``: records in the consumer's formats, chosen by Content-Type
  (``text/tab-separated-values`` or ``text/plain``: Criteo TSV; ``application/x-ndjson``,
  ``application/jsonl`` or ``application/json``: JSON lines), one record a line, the label field
  present and ignored. Answers ``{"scores": [...], "model": {...}}``, one score per record in
  order (with several labels, one list of a score a task per record, and ``"tasks"`` naming
  them); a request with any malformed record is refused whole (400, each bad line's number and
  reason), so that scores never shift against the records they belong to. A record the decoder
  takes but whose score is not finite (values too large for the model) is refused the same way
  (reason ``out_of_range``). Every answer is counted under its status, a 500 included.
* ``GET /healthz``: the process is alive, nothing it needs has failed, and its follower of
  the delta log is reading (503 with the error while it cannot).
* ``GET /readyz``: a checkpoint is loaded and the log has been caught up with once.
* ``GET /metrics``: Prometheus exposition.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from hetgmp.streaming import DecodeConfig, Decoder, Schema
from hetgmp.trainer.serving.follower import FollowerThread
from hetgmp.trainer.serving.model import ServingModel

__all__ = ["ServeMetrics", "Service", "build_app"]

log = logging.getLogger(__name__)

_TSV = {"text/tab-separated-values", "text/plain"}
_JSON = {"application/x-ndjson", "application/jsonl", "application/json"}
# A request body at least this big gives memory back once no body is held (Service.trim_soon).
_TRIM_AFTER_BYTES = 1 << 20


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_malloc_trim = _libc_malloc_trim()

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
        yield GaugeMetricFamily("hetgmp_serve_ready", "1 once the log was caught up with",
                                value=float(s.ready))
        yield GaugeMetricFamily("hetgmp_serve_inflight_bytes", "Request bodies held in memory "
                                "now (read, decoded or being scored)", value=s.inflight_bytes)
        if s.model is None:
            return
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
        yield CounterMetricFamily("hetgmp_serve_publishes_replayed", "Publishes whose mark "
                                  "was read again (a retry or a copy: nothing applied twice)",
                                  value=a.replayed)
        yield CounterMetricFamily("hetgmp_serve_dense_dropped", "Dense publishes dropped "
                                  "before they were whole (at most a few are assembled at "
                                  "once)", value=a.dense_dropped)
        yield GaugeMetricFamily("hetgmp_serve_model_step", "Training step of the newest "
                                "complete publish applied", value=m.step)
        # No sample before every rank has published once. Lag is what the model misses of the
        # log; the newest record's age also grows while the stream is quiet, and says so.
        now, wm, fresh = time.time(), m.watermark_ms, m.fresh_ms
        if fresh >= 0:
            yield GaugeMetricFamily("hetgmp_serve_model_lag_seconds", "Now minus the time up "
                                    "to which the model holds every record appended (the "
                                    "newest trained append time, or when the trainer had "
                                    "read its whole log if later): it stays near the publish "
                                    "interval while the stream is quiet",
                                    value=max(now - fresh / 1000.0, 0.0))
        if wm >= 0:
            yield GaugeMetricFamily("hetgmp_serve_newest_record_age_seconds", "Now minus the "
                                    "newest Kafka append time whose every update the model "
                                    "holds (grows while no records arrive)",
                                    value=now - wm / 1000.0)


@dataclass
class Service:
    """What the routes need.

    Attributes:
        model: The model answering (None until one is loaded: :meth:`attach`).
        follower: Its follower of the delta log (None: a fixed checkpoint, or not yet).
        schema: The records' field names.
        format: The record format of a request without a Content-Type.
        max_record_bytes: Longer records are malformed.
        max_records: Most records one request may hold.
        threads: Threads that decode and score.
        max_inflight_bytes: Most request-body bytes held at once.
        waiting_for: What the process waits for before it can answer ('' once it has a model).
        failed: Why it cannot go on ('' while nothing has failed).
    """

    model: ServingModel | None
    follower: FollowerThread | None
    schema: Schema
    format: str = "tsv"
    max_record_bytes: int = 65536
    max_records: int = 65536
    threads: int = 2
    max_inflight_bytes: int = 64 << 20
    waiting_for: str = ""
    failed: str = ""
    value_separator: str = ","

    def __post_init__(self) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ServeMetrics(self.registry, self)
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="score")
        self._decoders = {f: Decoder(self.schema, DecodeConfig(f, self.max_record_bytes,
                                                               self.value_separator))
                          for f in ("tsv", "json")}
        self.inflight_bytes = 0  # changed on the event loop only
        self._trimmed = 0.0

    def trim_soon(self) -> None:
        """Give the heap's free memory back to the system, at most once a second, on the pool.

        glibc keeps what large request bodies and their decoding freed in its arenas (its
        mmap threshold grows with the largest block freed), so after a burst of 8 MB bodies a
        process stayed 550 MB above its idle size; ``malloc_trim`` brings it back.
        """
        now = time.monotonic()
        if _malloc_trim is None or now - self._trimmed < 1.0:
            return
        self._trimmed = now
        self.pool.submit(_malloc_trim, 0)

    def attach(self, model: ServingModel, follower: FollowerThread | None) -> None:
        """Start answering from ``model`` (kept current by ``follower``)."""
        self.model, self.follower, self.waiting_for = model, follower, ""

    @property
    def ready(self) -> bool:
        """A checkpoint is loaded and the log was caught up with (or there is no log)."""
        if self.model is None or self.failed or self.waiting_for:
            return False
        f = self.follower
        return f is None or (f.follower.stats.caught_up and not f.follower.stats.error)

    def score(self, body: bytes, fmt: str) -> tuple[int, dict[str, Any]]:
        """(status, reply) for a request body (runs on the pool)."""
        # Count before splitting: 4M short lines would be 4M objects before the check.
        if body.count(b"\n") > self.max_records:
            body = body.rstrip()
            n = body.count(b"\n") + 1
            if n > self.max_records:
                return 413, {"error": f"{n} records in one request; at most "
                                      f"{self.max_records} (--max-records)"}
        lines = body.split(b"\n")
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            return 400, {"error": "no records in the request body"}
        if self.model is None:
            return 503, {"error": "no model loaded yet"}
        decoded = self._decoders[fmt].decode(lines, offsets=np.arange(len(lines)))
        if decoded.rejects:
            bad = sorted(decoded.rejects, key=lambda r: r.offset)
            return 400, {"error": f"{len(bad)} malformed record(s) of {len(lines)}; nothing "
                                  "was scored",
                         "rejected": [{"line": int(r.offset) + 1, "reason": r.reason.value,
                                       **({"detail": r.detail} if r.detail else {})}
                                      for r in bad[:100]]}
        scores = self.model.score(decoded.batch)
        finite = np.isfinite(np.asarray(scores)).reshape(len(decoded.batch), -1).all(axis=1)
        if not finite.all():
            lines_out = decoded.batch.offsets[~finite]
            return 400, {"error": f"{lines_out.size} record(s) of {len(lines)} score to NaN or "
                                  "an infinity; nothing was scored",
                         "rejected": [{"line": int(i) + 1, "reason": "out_of_range",
                                       "detail": "values too large for the model to score"}
                                      for i in lines_out[:100]]}
        self.metrics.records.inc(len(scores))
        m = self.model
        wm, fresh = m.watermark_ms, m.fresh_ms
        tasks = m.bags.labels
        return 200, {"scores": np.round(scores, 7).tolist(),  # 4x faster than a float loop
                     **({"tasks": list(tasks)} if len(tasks) > 1 else {}),
                     "model": {"step": m.step, "watermark_ms": wm,
                               "lag_s": round(max(time.time() - fresh / 1000.0, 0.0), 3)
                               if fresh >= 0 else None}}


def build_app(service: Service, max_body_bytes: int, body_timeout_s: float = 30.0) -> Any:
    """The aiohttp application of ``service`` (the header timeout is the runner's
    ``keepalive_timeout``: :func:`hetgmp.trainer.app.serve`)."""
    from aiohttp import web

    async def predict(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        try:
            status, reply = await _predict(request)
            response = web.json_response(reply, status=status, dumps=_dumps)
        except Exception:  # a fault of ours: answered, logged and counted, never a reset
            log.exception("a /predict request failed")
            status = 500
            response = web.json_response({"error": "internal error (see the serve log)"},
                                         status=500)
        service.metrics.requests.labels(str(status)).inc()
        if status == 200:
            service.metrics.latency.observe(time.perf_counter() - t0)
        if status == 503:
            response.headers["Retry-After"] = "1"
        if status in (408, 413):
            # The body may be unread: the connection cannot carry another request.
            response.force_close()
        return response

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
        if service.model is None:
            return 503, {"error": f"no model loaded yet: {service.waiting_for or service.failed}"}
        size = request.content_length
        if size is not None and size > max_body_bytes:
            return 413, {"error": f"the body is over {max_body_bytes} bytes (--max-body-bytes)"}
        # Reserve what the body may take before reading it (all of --max-body-bytes when the
        # client does not say), so bodies in memory never pass the bound.
        need = max(size or max_body_bytes, 1)
        if service.inflight_bytes + need > service.max_inflight_bytes and service.inflight_bytes:
            return 503, {"error": f"{service.inflight_bytes} bytes of requests in memory; at "
                                  f"most {service.max_inflight_bytes} (--max-inflight-bytes): "
                                  "retry"}
        service.inflight_bytes += need
        try:
            try:
                async with asyncio.timeout(body_timeout_s):
                    body = await request.read()
            except TimeoutError:
                return 408, {"error": f"the body did not arrive within {body_timeout_s:g} s "
                                      "(--body-timeout-s)"}
            except web.HTTPRequestEntityTooLarge:
                return 413, {"error": f"the body is over {max_body_bytes} bytes "
                                      "(--max-body-bytes)"}
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(service.pool, service.score, body, fmt)
            except ValueError as exc:  # records the model cannot take
                return 400, {"error": str(exc)}
        finally:
            service.inflight_bytes -= need
            if need >= _TRIM_AFTER_BYTES and not service.inflight_bytes:
                service.trim_soon()

    async def healthz(_: web.Request) -> web.Response:
        f = service.follower
        error = service.failed
        if not error and f is not None and (f.follower.stats.error or not f.is_alive()):
            error = f.follower.stats.error or "the delta-log follower stopped"
        if error:
            return web.json_response({"ok": False, "error": error}, status=503)
        return web.json_response({"ok": True, **({"waiting_for": service.waiting_for}
                                                 if service.waiting_for else {})})

    async def readyz(_: web.Request) -> web.Response:
        if service.ready:
            assert service.model is not None
            return web.json_response({"ready": True, "step": service.model.step})
        f = service.follower
        reason = (service.failed or service.waiting_for
                  or (f.follower.stats.error if f is not None and f.follower.stats.error
                      else "catching up with the delta log"))
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
