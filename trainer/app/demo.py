"""``make demo``: the whole system on one machine, with a live view and a report at the end.

What runs: the embedded Kafka broker; the synthetic drifting click stream produced into it at a
fixed rate (a producer thread); ``--workers`` training ranks (CPU with gloo, or a GPU each with
NCCL: ``--device``) reading their shares of
the topic's partitions, training DeepFM with bounded-staleness replicas, while the online loop
repartitions the access graph (a full METIS partition at cold start, the incremental
partitioner after, early on drift), migrates rows live and checkpoints. Every rank serves its
Prometheus metrics; the live view is drawn from those very endpoints (scraped once a second), so
what you see is what Prometheus would see. A ``hetgmp serve`` process loads the
first checkpoint and follows the ranks' model delta log, and a load generator sends it
prediction requests: the view shows its model lag and latency. At the end the ranks stop after
their current step (as on SIGTERM), write a last checkpoint and commit their offsets, and a
report (HTML with charts, plus JSON) is written: remote rows per sample over time with the
repartitions marked, the rolling AUC, throughput, the rows each migration moved, and the
serving side's model lag and latency.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from hetgmp.runtime import add_flags, build, free_ports, stop_on_signals
from hetgmp.streaming import (
    BrokerUnavailable,
    EmbeddedBroker,
    KafkaSettings,
    ProduceConfig,
    ProduceReport,
    SyntheticConfig,
    produce,
)
from hetgmp.trainer.app.report import Chart, Series, rates, ratios, write_report
from hetgmp.trainer.app.scrape import Timeline, combine, scrape
from hetgmp.trainer.app.view import LiveView
from hetgmp.trainer.online import Interval
from hetgmp.trainer.run import check_metrics_port

__all__ = ["DemoConfig", "add_demo_flags", "run_demo", "run_from_flags", "write_demo_report"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo."""

    duration_s: float = field(default=120.0, metadata={"help": "seconds of training"})
    rate: float = field(
        default=8000.0,
        metadata={"help": "records per second produced (paced evenly; the default keeps two CPU "
                  "ranks busy here)"})
    workers: int = field(default=2, metadata={"help": "training ranks"})
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto",
        metadata={"help": "auto: a GPU per rank (NCCL) when the machine has one for every rank, "
                  "else CPU (gloo)"}
    )
    global_batch: int = field(default=2048, metadata={"help": "samples per step over all ranks"})
    embed_dim: int = field(default=16, metadata={"help": "embedding dimension"})
    staleness: int = field(default=10, metadata={"help": "replica staleness bound s"})
    window: int = field(default=100_000, metadata={"help": "samples in the access window"})
    warmup: int = field(default=20_000, metadata={"help": "records before the first placement"})
    repartition_interval: int = field(
        default=40_000, metadata={"help": "records between repartitions (drift may come first)"}
    )
    drift_every: int = field(default=100_000, metadata={"help": "records between stream drifts"})
    partitions: int = field(default=4, metadata={"help": "Kafka partitions of the demo topic"})
    migration_chunk_bytes: int = field(
        default=64 << 10,
        metadata={"help": "most bytes of rows moved between two steps (small: a migration spans "
                  "steps, and the view shows training going on meanwhile)"})
    checkpoint_interval: str = field(
        default="15s", metadata={"help": "checkpoint every N records or Ns seconds (serving "
                                 "starts from the first)"}
    )
    serve_port: int = field(
        default=8500, metadata={"help": "port of the demo's hetgmp serve (moved up if taken)"})
    serve_rps: float = field(
        default=10.0, metadata={"help": "prediction requests a second sent to it (256 records "
                                "each; 0 = no serve process)"})
    metrics_port: int = field(
        default=9300, metadata={"help": "rank r serves /metrics on this port + r (moved up if taken)"}
    )
    conversion: bool = field(
        default=False, metadata={"help": "two labels: the stream also carries a conversion "
                                 "(only where clicked), MMoE trains click and conversion, and "
                                 "the report charts each task's rolling AUC"})
    seed: int = field(default=0, metadata={"help": "seed of the stream, the model and the partitioner"})
    report_dir: str = field(default="reports", metadata={"help": "where the report goes"})
    live: bool = field(default=True, metadata={"help": "redraw a live view (off: a line every 5 s)"})

    def __post_init__(self) -> None:
        # Checked here, so that a bad flag is a usage error before the broker starts, not a
        # traceback (or a hang: a topic of 0 partitions) once it runs.
        if self.duration_s <= 0 or self.rate <= 0 or self.workers < 1:
            raise ValueError("duration_s, rate and workers must be positive")
        positive = {"global_batch": self.global_batch, "embed_dim": self.embed_dim,
                    "window": self.window, "drift_every": self.drift_every,
                    "partitions": self.partitions,
                    "migration_chunk_bytes": self.migration_chunk_bytes}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in {"staleness": self.staleness, "warmup": self.warmup,
                            "repartition_interval": self.repartition_interval}.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        check_metrics_port(self.metrics_port, self.workers, zero=None)  # the demo scrapes them
        Interval.parse(self.checkpoint_interval)


# -- the demo -----------------------------------------------------------------------------------


def _model(config: DemoConfig) -> str:
    """The model the demo trains: DeepFM, or MMoE on two labels."""
    return "mmoe" if config.conversion else "deepfm"


def _backend(config: DemoConfig) -> str:
    """How the ranks train (``config.device`` resolved); one rank needs no process group."""
    device = "CUDA" if config.device == "cuda" else "CPU"
    group = "" if config.workers == 1 else f"/{'NCCL' if config.device == 'cuda' else 'gloo'}"
    return f"{config.workers} rank(s), {device}{group}"


def run_demo(config: DemoConfig, stop: threading.Event | None = None) -> Path:
    """Run the demo; returns the path of the HTML report.

    Raises:
        ValueError: ``device`` is ``cuda`` and the machine lacks a GPU per rank.
        ProduceFailed: The broker did not acknowledge records of the stream.
    """
    from hetgmp.streaming import ConsumerConfig, ensure_topic
    from hetgmp.trainer.dist import LaunchConfig, launch, resolve_device, stop_event
    from hetgmp.trainer.embedding import StoreConfig
    from hetgmp.trainer.model import ModelConfig
    from hetgmp.trainer.online import OnlineConfig
    from hetgmp.trainer.run import Job, RankResult, run_rank
    from hetgmp.trainer.sources import KafkaSpec
    from hetgmp.trainer.step import TrainConfig

    config = replace(config, device=resolve_device(config.device, config.workers))
    stop = stop or threading.Event()
    out = sys.stdout
    topic = f"clicks-demo-{int(time.time())}"
    directory = Path(config.report_dir) / time.strftime("demo-%Y%m%d-%H%M%S")
    base = free_ports(config.metrics_port, config.workers)
    urls = [f"http://127.0.0.1:{base + r}/metrics" for r in range(config.workers)]
    wanted = config.serve_port
    if base <= wanted < base + config.workers:  # not on a rank's metrics port
        wanted = base + config.workers
    serve_port = free_ports(wanted, 1)
    serve_url = f"http://127.0.0.1:{serve_port}"
    view = LiveView(out, config.live and out.isatty(), config.duration_s, _backend(config),
                    config.staleness, urls)
    produced = ProduceReport()
    timeline = Timeline()
    results: list[RankResult] = []
    failure: list[BaseException] = []
    loader: _Load | None = None

    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(EmbeddedBroker())
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="hetgmp-demo")
        ensure_topic(kafka, topic, config.partitions)
        print(f"embedded Kafka broker at {broker.bootstrap_servers}; topic {topic} "
              f"({config.partitions} partitions)", flush=True)
        producer_stop = threading.Event()
        stack.callback(producer_stop.set)
        syn = SyntheticConfig(seed=config.seed, drift_every=config.drift_every,
                              conversion=config.conversion)
        # Two labels: the consumer and serve read the conversion column (the shape's schema
        # with its second label), and MMoE gives a logit to each.
        schema = f"{syn.shape}+conversion" if config.conversion else "criteo"

        def run_producer() -> None:
            try:
                produce(kafka, ProduceConfig(topic=topic, count=0, rate=config.rate,
                                             partitions=config.partitions),
                        syn, stop=producer_stop, report=produced, progress=lambda r: None)
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        producer = threading.Thread(target=run_producer, name="demo-producer", daemon=True)
        producer.start()
        stack.callback(producer.join, 10)

        job = Job(
            KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=f"{topic}-trainer",
                                            schema=schema),
                      idle_s=3600.0, poll_s=0.05),
            ModelConfig(model=_model(config), embed_dim=config.embed_dim, hidden=(64, 32),
                        seed=config.seed),
            StoreConfig(seed=config.seed),
            TrainConfig(staleness=config.staleness, global_batch=config.global_batch,
                        warmup=config.warmup, log_every=0),
            online=OnlineConfig(repartition_interval=str(config.repartition_interval),
                                window=config.window,
                                migration_chunk_bytes=config.migration_chunk_bytes,
                                checkpoint_dir=str(directory / "checkpoints"),
                                checkpoint_interval=config.checkpoint_interval,
                                keep_checkpoints=2),
            seed=config.seed, metrics_port=base)
        ranks_stop = stop_event()

        def run_training() -> None:
            try:
                results.extend(launch(run_rank, job, LaunchConfig(
                    workers=config.workers, device=config.device, timeout_s=300), ranks_stop))
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        trainer = threading.Thread(target=run_training, name="demo-training", daemon=True)
        trainer.start()
        print(f"{config.workers} training rank(s) starting; metrics at " + "  ".join(urls),
              flush=True)
        if config.serve_rps > 0:
            directory.mkdir(parents=True, exist_ok=True)
            stack.enter_context(_ServeProcess(
                directory / "checkpoints", kafka, serve_port, directory / "serve.log", schema))
            loader = _Load(serve_url, syn, config.serve_rps)
            loader.start()
            stack.callback(loader.stop)
            print(f"hetgmp serve on {serve_url} (log: {directory / 'serve.log'}); "
                  f"{config.serve_rps:g} requests/s of 256 records", flush=True)
        t0 = time.monotonic()
        last_view = 0.0
        while trainer.is_alive():
            now = time.monotonic() - t0
            if (now >= config.duration_s or stop.is_set() or failure) \
                    and not ranks_stop.is_set():
                ranks_stop.set()  # the ranks finish their step, checkpoint and return
                producer_stop.set()
            try:
                snap = combine(now, [scrape(u) for u in urls], _serve_samples(
                    serve_url if config.serve_rps > 0 else None))
            except OSError:
                snap = None  # ranks still starting, or already gone
            if snap is not None:
                timeline.snaps.append(snap)
                timeline.produced.append((now, produced.records))
                if now - last_view >= (0.5 if view.tty else 5.0):
                    last_view = now
                    view.draw(timeline)
            trainer.join(timeout=1.0)
        if failure:
            raise failure[0]
        if timeline.snaps:
            view.draw(timeline, final=True)
    return write_demo_report(config, directory, timeline, results, produced, loader)


class _ServeProcess:
    """``hetgmp serve`` on the demo's checkpoints and broker, as a user would start it."""

    def __init__(self, checkpoints: Path, kafka: KafkaSettings, port: int, log: Path,
                 schema: str = "criteo") -> None:
        self.argv = [sys.executable, "-m", "hetgmp.trainer.app.cli", "serve", "--checkpoint-dir",
                     str(checkpoints), "--bootstrap-servers", kafka.bootstrap_servers,
                     "--port", str(port), "--schema", schema]
        self.log = log

    def __enter__(self) -> _ServeProcess:
        import os
        import subprocess

        self._out = open(self.log, "w")  # closed in __exit__
        self.proc = subprocess.Popen(self.argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        return self

    def __exit__(self, *exc: object) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


class _Load(threading.Thread):
    """Prediction requests of 256 records at a steady rate; client-side latency of each."""

    def __init__(self, url: str, syn: SyntheticConfig, rps: float) -> None:
        super().__init__(name="demo-requests", daemon=True)
        from hetgmp.streaming import SyntheticStream

        stream = SyntheticStream(syn)
        self.bodies = [b"\n".join(stream.lines(i * 256, 256)) for i in range(16)]
        self.url, self.period = url + "/predict", 1.0 / rps
        self.halt = threading.Event()
        self.latencies: list[float] = []
        self.failed = 0

    def run(self) -> None:
        import urllib.error
        import urllib.request

        # Serve listens at once and answers 503 until it holds a model (the first checkpoint):
        # requests start once /readyz says so, as a load balancer's readiness probe would.
        while not self.halt.wait(self.period):
            try:
                with urllib.request.urlopen(self.url.replace("/predict", "/readyz"),
                                            timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass  # 503 (an HTTPError) or not listening yet
        i = 0
        while not self.halt.wait(self.period):
            req = urllib.request.Request(self.url, data=self.bodies[i % len(self.bodies)],
                                         headers={"Content-Type": "text/tab-separated-values"})
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()
                self.latencies.append(time.perf_counter() - t0)
            except urllib.error.HTTPError:
                self.failed += 1
            except OSError:
                pass  # gone (the demo is ending)
            i += 1

    def stop(self) -> None:
        self.halt.set()
        self.join(5)


def _serve_samples(url: str | None) -> Any:
    """The serve process's metrics (None before it listens, or without one)."""
    if url is None:
        return None
    try:
        return scrape(url + "/metrics")
    except OSError:
        return None


def write_demo_report(config: DemoConfig, directory: Path, tl: Timeline, results: list[Any],
                      produced: ProduceReport, load: _Load | None = None) -> Path:
    """The demo's report from its timeline, the ranks' results and the serving side's."""
    from hetgmp.trainer import checkpoint as ckpt

    t = [s.t for s in tl.snaps]
    rank0 = results[0] if results else None
    events = rank0.online.get("events", []) if rank0 else []
    done = [e for e in events if e["event"] == "migration_done"]
    totals = rank0.job_totals.summary() if rank0 else {}
    marks = [b.t for a, b in zip(tl.snaps, tl.snaps[1:]) if b.version > a.version]
    rr_t, rr = ratios(t, [s.not_held for s in tl.snaps], [s.trained for s in tl.snaps])
    trained_t, trained = rates(t, [s.trained for s in tl.snaps])
    produced_t, produced_rate = rates([p[0] for p in tl.produced],
                                      [p[1] for p in tl.produced])
    last = ckpt.latest(directory / "checkpoints")
    figures = _figures(config, produced, tl, rank0, totals, events, done,
                       directory / "checkpoints", last)
    figures.update(_serving_figures(tl, load))
    lag = [(s.t, s.serve_lag) for s in tl.snaps if s.serve_lag == s.serve_lag]
    lat_t, lat50, lat99 = _latency_windows(tl)
    charts = [
        Chart("Remote rows per sample (rows neither owned nor fresh in a replica), 5 s window",
              "seconds", "rows / sample", [Series("all ranks", rr_t, rr)], marks,
              "new placement"),
        Chart("Rolling AUC (each sample scored before its update)", "seconds", "AUC",
              _auc_series(tl), marks, "new placement"),
        Chart("Throughput, 5 s window", "seconds", "records / s",
              [Series("trained", trained_t, trained),
               Series("produced", produced_t, produced_rate)]),
        Chart("Rows moved by each migration", "seconds since the start", "rows",
              [Series("rows moved", [_at(tl, e) for e in done],
                      [e["rows_moved"] for e in done], bars=True)]),
        Chart("Model lag of hetgmp serve: now minus the newest append time it holds every "
              "update of", "seconds", "seconds",
              [Series("model lag", [t for t, _ in lag], [v for _, v in lag])], marks,
              "new placement"),
        Chart("Serving latency, 256 records a request (5 s windows, bucket upper bounds)",
              "seconds", "milliseconds",
              [Series("p50", lat_t, lat50), Series("p99", lat_t, lat99)]),
    ]
    notes = [
        f"Synthetic stream (seed {config.seed}) drifting every {config.drift_every:,} records, "
        f"produced at {config.rate:,.0f} records/s into the embedded broker; "
        f"{_backend(config)} train "
        f"{'MMoE on click and conversion' if config.conversion else 'DeepFM'} "
        f"(dim {config.embed_dim}) with staleness bound "
        f"{config.staleness}, global batch {config.global_batch:,}.",
        f"Placement: hash until {config.warmup:,} records, then a full METIS partition computed "
        f"beside training, then the incremental partitioner every "
        f"{config.repartition_interval:,} records or earlier when remote rows per sample rise "
        "(drift). Rows migrate live, at most "
        f"{config.migration_chunk_bytes // 1024:,} KB between two steps.",
        "Figures are scraped from the ranks' Prometheus endpoints once a second; rates are "
        "taken over a trailing 5 s window.",
        f"Serving: hetgmp serve loads the first checkpoint and follows the ranks' model delta "
        f"log (a publish a second); {config.serve_rps:g} requests a second of 256 records. "
        "Its latency percentiles in the table are measured by the client; the chart's are the "
        "server's histogram.",
    ]
    return write_report(directory, "hetgmp-stream demo", _table(config, figures), charts, notes,
                        {"figures": figures})


def _auc_series(tl: Timeline) -> list[Series]:
    """The rolling AUC over time: a line a task with several labels (each the mean over
    ranks), else one."""
    tasks = list(dict.fromkeys(k for s in tl.snaps for k in s.task_auc))
    if not tasks:
        auc_t = [s.t for s in tl.snaps if s.auc == s.auc]
        return [Series("mean over ranks", auc_t, [s.auc for s in tl.snaps if s.auc == s.auc])]
    return [Series(task, [s.t for s in tl.snaps if task in s.task_auc],
                   [s.task_auc[task] for s in tl.snaps if task in s.task_auc])
            for task in tasks]


def _latency_windows(tl: Timeline, span: float = 5.0
                     ) -> tuple[list[float], list[float], list[float]]:
    """p50 and p99 (ms) of the serve latency histogram over consecutive ``span`` windows."""
    from hetgmp.trainer.app.scrape import window_quantile

    out: tuple[list[float], list[float], list[float]] = ([], [], [])
    start = None
    for s in tl.snaps:
        if not s.serve_latency:
            continue
        if start is None:
            start = s
            continue
        if s.t - start.t >= span:
            p50 = window_quantile(s.serve_latency, start.serve_latency, 0.5)
            p99 = window_quantile(s.serve_latency, start.serve_latency, 0.99)
            if p50 == p50:
                out[0].append(s.t)
                out[1].append(p50 * 1000)
                out[2].append(p99 * 1000)
            start = s
    return out


def _serving_figures(tl: Timeline, load: _Load | None) -> dict[str, Any]:
    import numpy as np

    lags = [s.serve_lag for s in tl.snaps if s.serve_lag == s.serve_lag]
    lat = np.array(load.latencies if load is not None else [])
    return {
        "serve_requests_ok": int(lat.size),
        "serve_requests_failed": load.failed if load is not None else 0,
        "serve_records_scored": int(tl.snaps[-1].serve_scored) if tl.snaps else 0,
        "serve_latency_p50_ms": round(float(np.percentile(lat, 50)) * 1000, 1)
        if lat.size else None,
        "serve_latency_p99_ms": round(float(np.percentile(lat, 99)) * 1000, 1)
        if lat.size else None,
        "model_lag_p50_s": round(float(np.median(lags)), 2) if lags else None,
        "model_lag_max_s": round(float(max(lags)), 2) if lags else None,
    }


def _at(tl: Timeline, event: dict[str, Any]) -> float:
    """Seconds since the start when the ranks had trained as many records as an event's."""
    for s in tl.snaps:
        if s.trained >= event["records"]:
            return s.t
    return tl.snaps[-1].t if tl.snaps else 0.0


def _figures(config: DemoConfig, produced: ProduceReport, tl: Timeline, rank0: Any,
             totals: dict[str, Any], events: list[dict[str, Any]], done: list[dict[str, Any]],
             checkpoints: Path, checkpoint: Any) -> dict[str, Any]:
    """The run's figures, by name (report.json's ``figures``; the table shows them)."""
    aucs = [s.auc for s in tl.snaps if s.auc == s.auc]
    online = rank0.online if rank0 else {}
    return {
        "duration_s": config.duration_s, "workers": config.workers, "device": config.device,
        "records_produced": produced.records,
        "records_consumed": int(tl.snaps[-1].consumed) if tl.snaps else 0,
        "samples_trained": int(totals.get("samples_trained", 0)),
        "samples_per_s": round(rank0.samples_per_s, 1) if rank0 else None,
        "steps": rank0.steps if rank0 else 0,
        "steps_during_migrations": int(tl.snaps[-1].migrating_steps) if tl.snaps else 0,
        "placement_version": rank0.placement.get("version") if rank0 else None,
        "repartitions": sum(1 for e in events if e["event"] == "placement"),
        "drift_triggers": sum(1 for e in events if e["event"] == "drift"),
        "rows_migrated": int(sum(e["rows_moved"] for e in done)),
        "remote_rows_per_sample": totals.get("remote_rows_per_sample"),
        "bytes_per_sample": totals.get("bytes_per_sample"),
        "max_staleness": totals.get("max_staleness"),
        "progressive_auc_last": round(aucs[-1], 4) if aucs else None,
        "task_auc_last": {task: round(v, 4) for task, v in tl.snaps[-1].task_auc.items()}
        if tl.snaps else {},
        "freshness_p50_s": online.get("freshness_p50_s"),
        "freshness_p99_s": online.get("freshness_p99_s"),
        "batch_fill_p50_s": online.get("batch_fill_p50_s"),
        "batch_fill_p99_s": online.get("batch_fill_p99_s"),
        "checkpoints": sum(1 for e in events if e["event"] == "checkpoint"),
        "last_checkpoint_records": checkpoint.records if checkpoint is not None else None,
        "checkpoint_dir": str(checkpoints),
    }


def _table(config: DemoConfig, f: dict[str, Any]) -> list[tuple[str, Any]]:
    """The figures as the report's table shows them: labels and units."""
    def num(x: Any, digits: int = 0) -> str:
        return "–" if x is None or x != x else f"{x:,.{digits}f}"

    return [
        ("Ran", f"{f['duration_s']:,.0f} s on {_backend(config)}"),
        ("Records produced / consumed / trained",
         f"{num(f['records_produced'])} / {num(f['records_consumed'])} / "
         f"{num(f['samples_trained'])}"),
        ("Throughput", f"{num(f['samples_per_s'])} samples/s"),
        ("Steps", f"{num(f['steps'])}, {num(f['steps_during_migrations'])} of them trained "
                  f"while a migration went on"),
        ("Placement", f"v{f['placement_version']} after {f['repartitions']} repartitions "
                      f"({f['drift_triggers']} for drift)"),
        ("Rows migrated", num(f["rows_migrated"])),
        ("Remote rows per sample", num(f["remote_rows_per_sample"], 3)),
        ("Bytes sent per sample (embedding path)", num(f["bytes_per_sample"], 1)),
        ("Largest staleness read", f"{f['max_staleness']} updates (bound {config.staleness})"),
        ("Rolling AUC at the end", ", ".join(f"{task} {num(v, 4)}" for task, v in
                                             f["task_auc_last"].items())
         if f.get("task_auc_last") else num(f["progressive_auc_last"], 4)),
        ("Freshness (append to Kafka → gradient applied)",
         f"p50 {num(f['freshness_p50_s'], 2)} s, p99 {num(f['freshness_p99_s'], 2)} s; of it, "
         f"waiting for the batch to fill: p50 {num(f.get('batch_fill_p50_s'), 2)} s, "
         f"p99 {num(f.get('batch_fill_p99_s'), 2)} s"),
        ("Checkpoints", f"{f['checkpoints']}; the last holds "
                        f"{num(f['last_checkpoint_records'])} records"),
        ("Serving (hetgmp serve)", f"{num(f.get('serve_requests_ok'))} requests answered "
                                   f"({num(f.get('serve_records_scored'))} records), "
                                   f"{num(f.get('serve_requests_failed'))} refused"),
        ("Serving latency (client, 256 records)",
         f"p50 {num(f.get('serve_latency_p50_ms'), 1)} ms, "
         f"p99 {num(f.get('serve_latency_p99_ms'), 1)} ms"),
        ("Model lag (append to Kafka → served)",
         f"median {num(f.get('model_lag_p50_s'), 2)} s, max {num(f.get('model_lag_max_s'), 2)} s"),
    ]


def add_demo_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """Flags of ``hetgmp demo``: one per field of :class:`DemoConfig`."""
    add_flags(parser, DemoConfig, "demo", toml=toml)


def run_from_flags(args: argparse.Namespace) -> int:
    """``hetgmp demo`` from its parsed flags."""
    from hetgmp.trainer.dist import resolve_device

    try:
        config = build(DemoConfig, args)
        config = replace(config, device=resolve_device(config.device, config.workers))
    except ValueError as exc:  # a bad setting, or --device cuda without a GPU per rank
        print(f"hetgmp demo: error: {exc}", file=sys.stderr)
        return 2
    with stop_on_signals(threading.Event()) as stop:
        try:
            path = run_demo(config, stop)
        except BrokerUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(f"report: {path}", flush=True)
    print(f"data:   {path.with_suffix('.json')}", flush=True)
    return 0
