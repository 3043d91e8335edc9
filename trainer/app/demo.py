"""``make demo``: the whole system on one machine, with a live view and a report at the end.

What runs: the embedded Kafka broker; the synthetic drifting click stream produced into it at a
fixed rate (a producer thread); ``--workers`` training ranks (CPU with gloo, or a GPU each with
NCCL: ``--device``) reading their shares of
the topic's partitions, training DeepFM with bounded-staleness replicas, while the online loop
repartitions the access graph (a full METIS partition at cold start, the incremental
partitioner after, early on drift), migrates rows live and checkpoints. Every rank serves its
Prometheus metrics; the live view is drawn from those very endpoints (scraped once a second), so
what you see is what Prometheus would see. At the end the ranks stop after their current step
(as on SIGTERM), write a last checkpoint and commit their offsets, and a report (HTML with
charts, plus JSON) is written: remote rows per sample over time with the repartitions marked,
the rolling AUC, throughput and the rows each migration moved.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from streaming import (
    BrokerUnavailable,
    EmbeddedBroker,
    KafkaSettings,
    ProduceConfig,
    ProduceReport,
    SyntheticConfig,
    produce,
)
from streaming.runtime import add_flags, build, free_ports, stop_on_signals
from trainer.app.report import Chart, Series, write_report
from trainer.metrics import check_metrics_port
from trainer.types import Interval

__all__ = ["DemoConfig", "add_demo_flags", "run_demo", "run_from_flags", "scrape"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo."""

    duration_s: float = field(default=120.0, metadata={"help": "seconds of training"})
    rate: float = field(default=4000.0, metadata={"help": "records per second produced"})
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
    checkpoint_interval: str = field(
        default="30s", metadata={"help": "checkpoint every N records or Ns seconds"}
    )
    metrics_port: int = field(
        default=9300, metadata={"help": "rank r serves /metrics on this port + r (moved up if taken)"}
    )
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
                    "partitions": self.partitions}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, value in {"staleness": self.staleness, "warmup": self.warmup,
                            "repartition_interval": self.repartition_interval}.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        check_metrics_port(self.metrics_port, self.workers, zero=None)  # the demo scrapes them
        Interval.parse(self.checkpoint_interval)


# -- scraping the ranks -------------------------------------------------------------------------


def scrape(url: str, timeout: float = 2.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a Prometheus endpoint: sample name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def _total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
           **match: str) -> float:
    return sum(v for labels, v in samples.get(name, [])
               if all(labels.get(k) == want for k, want in match.items()))


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Quantile of a cumulative histogram [(upper bound, count)] (upper bound of its bucket)."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    target = q * buckets[-1][1]
    for le, count in buckets:
        if count >= target:
            return le
    return buckets[-1][0]


@dataclass
class _Snapshot:
    """The job's figures at one moment, summed (or combined) over ranks."""

    t: float
    trained: float = 0.0
    not_held: float = 0.0
    consumed: float = 0.0
    version: float = 0.0
    repartitions: float = 0.0
    migrated: float = 0.0
    migrating_steps: float = 0.0
    loss_sum: float = 0.0
    auc: float = math.nan
    staleness: list[tuple[float, float]] = field(default_factory=list)
    freshness: list[tuple[float, float]] = field(default_factory=list)
    checkpoint_age: float = math.nan
    refreshes: float = 0.0
    pushes: float = 0.0


def _combine(t: float, per_rank: list[dict[str, list[tuple[dict[str, str], float]]]]) -> _Snapshot:
    snap = _Snapshot(t)
    hists: dict[str, dict[float, float]] = {"staleness": {}, "freshness": {}}
    aucs, ages = [], []
    for s in per_rank:
        snap.trained += _total(s, "hetgmp_samples_trained_total")
        snap.loss_sum += _total(s, "hetgmp_train_logloss_total")
        snap.not_held += _total(s, "hetgmp_remote_rows_total") + _total(
            s, "hetgmp_replica_refreshes_total")
        snap.consumed += _total(s, "hetgmp_records_consumed_total")
        snap.repartitions = max(snap.repartitions, _total(s, "hetgmp_repartitions_total"))
        snap.migrated += _total(s, "hetgmp_migrated_rows_total")
        snap.migrating_steps = max(snap.migrating_steps, _total(s, "hetgmp_migration_steps_total"))
        snap.refreshes += _total(s, "hetgmp_replica_refreshes_total")
        snap.pushes += _total(s, "hetgmp_replica_pushes_total")
        snap.version = max([snap.version] + [v for _, v in s.get("hetgmp_placement_version", [])])
        aucs += [v for _, v in s.get("hetgmp_heldout_auc", []) if v == v]
        ages += [v for _, v in s.get("hetgmp_checkpoint_age_seconds", [])]
        for key, name in (("staleness", "hetgmp_replica_staleness_updates_bucket"),
                          ("freshness", "hetgmp_freshness_seconds_bucket")):
            for labels, v in s.get(name, []):
                le = float(labels["le"])
                hists[key][le] = hists[key].get(le, 0.0) + v
    snap.auc = float(np.mean(aucs)) if aucs else math.nan
    snap.checkpoint_age = max(ages) if ages else math.nan
    snap.staleness = sorted(hists["staleness"].items())
    snap.freshness = sorted(hists["freshness"].items())
    return snap


def _window_quantile(now: list[tuple[float, float]], then: list[tuple[float, float]],
                     q: float) -> float:
    """Quantile of what a cumulative histogram gained between two scrapes."""
    before = dict(then)
    return _quantile([(le, c - before.get(le, 0.0)) for le, c in now], q)


# -- the demo -----------------------------------------------------------------------------------


@dataclass
class _Timeline:
    snaps: list[_Snapshot] = field(default_factory=list)
    produced: list[tuple[float, int]] = field(default_factory=list)


def run_demo(config: DemoConfig, stop: threading.Event | None = None) -> Path:
    """Run the demo; returns the path of the HTML report.

    Raises:
        ValueError: ``device`` is ``cuda`` and the machine lacks a GPU per rank.
    """
    from streaming import ConsumerConfig, ensure_topic
    from trainer.dist import launch, resolve_device, stop_event
    from trainer.job import Job, RankResult
    from trainer.run import run_rank
    from trainer.sources import KafkaSpec
    from trainer.types import LaunchConfig, ModelConfig, OnlineConfig, StoreConfig, TrainConfig

    config = replace(config, device=resolve_device(config.device, config.workers))
    stop = stop or threading.Event()
    out = sys.stdout
    tty = config.live and out.isatty()
    topic = f"clicks-demo-{int(time.time())}"
    started = time.strftime("demo-%Y%m%d-%H%M%S")
    directory = Path(config.report_dir) / started
    base = free_ports(config.metrics_port, config.workers)
    urls = [f"http://127.0.0.1:{base + r}/metrics" for r in range(config.workers)]
    produced = ProduceReport()
    timeline = _Timeline()
    results: list[RankResult] = []
    failure: list[BaseException] = []

    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(EmbeddedBroker())
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="hetgmp-demo")
        ensure_topic(kafka, topic, config.partitions)
        print(f"embedded Kafka broker at {broker.bootstrap_servers}; topic {topic} "
              f"({config.partitions} partitions)", flush=True)
        producer_stop = threading.Event()
        stack.callback(producer_stop.set)
        syn = SyntheticConfig(seed=config.seed, drift_every=config.drift_every)

        def run_producer() -> None:
            produce(kafka, ProduceConfig(topic=topic, count=0, rate=config.rate,
                                         partitions=config.partitions),
                    syn, stop=producer_stop, report=produced, progress=lambda r: None)

        producer = threading.Thread(target=run_producer, name="demo-producer", daemon=True)
        producer.start()
        stack.callback(producer.join, 10)

        job = Job(
            KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=f"{topic}-trainer"),
                      idle_s=3600.0, poll_s=0.05),
            ModelConfig(model="deepfm", embed_dim=config.embed_dim, hidden=(64, 32),
                        seed=config.seed),
            StoreConfig(seed=config.seed),
            TrainConfig(staleness=config.staleness, global_batch=config.global_batch,
                        warmup=config.warmup, log_every=0),
            online=OnlineConfig(repartition_interval=str(config.repartition_interval),
                                window=config.window, checkpoint_dir=str(directory / "checkpoints"),
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
        t0 = time.monotonic()
        last_view = 0.0
        while trainer.is_alive():
            now = time.monotonic() - t0
            if (now >= config.duration_s or stop.is_set()) and not ranks_stop.is_set():
                ranks_stop.set()  # the ranks finish their step, checkpoint and return
                producer_stop.set()
            try:
                snap = _combine(now, [scrape(u) for u in urls])
            except OSError:
                snap = None  # ranks still starting, or already gone
            if snap is not None:
                timeline.snaps.append(snap)
                timeline.produced.append((now, produced.records))
                if now - last_view >= (0.5 if tty else 5.0):
                    last_view = now
                    _view(out, tty, config, timeline, urls)
            trainer.join(timeout=1.0)
        if failure:
            raise failure[0]
        if timeline.snaps:
            _view(out, tty, config, timeline, urls, final=True)
    return _write(config, directory, timeline, results, produced)


def _rate(tl: _Timeline, attr: str, span: float = 5.0) -> float:
    snaps = tl.snaps
    if len(snaps) < 2:
        return 0.0
    last = snaps[-1]
    first = next((s for s in snaps if s.t >= last.t - span), snaps[0])
    if last.t <= first.t:
        return 0.0
    return (getattr(last, attr) - getattr(first, attr)) / (last.t - first.t)


def _recent(tl: _Timeline, span: float = 5.0) -> tuple[_Snapshot, _Snapshot]:
    last = tl.snaps[-1]
    return next((s for s in tl.snaps if s.t >= last.t - span), tl.snaps[0]), last


def _backend(config: DemoConfig) -> str:
    """How the ranks train, for the live view and the report (``config.device`` resolved);
    one rank needs no process group."""
    device = "CUDA" if config.device == "cuda" else "CPU"
    if config.workers == 1:
        return device
    return f"{device}/{'NCCL' if config.device == 'cuda' else 'gloo'}"


def _view(out: Any, tty: bool, config: DemoConfig, tl: _Timeline, urls: list[str],
          final: bool = False) -> None:
    first, s = _recent(tl)
    trained = s.trained - first.trained
    rrps = (s.not_held - first.not_held) / trained if trained > 0 else math.nan
    loss = (s.loss_sum - first.loss_sum) / trained if trained > 0 else math.nan
    produced = tl.produced[-1][1]
    stale50 = _window_quantile(s.staleness, first.staleness, 0.5)
    stale99 = _window_quantile(s.staleness, first.staleness, 0.99)
    fresh99 = _window_quantile(s.freshness, first.freshness, 0.99)
    ckpt = f"{s.checkpoint_age:.0f} s ago" if s.checkpoint_age == s.checkpoint_age else "none yet"
    lines = [
        f"hetgmp demo  {s.t:6.1f}s / {config.duration_s:.0f}s   {config.workers} rank(s), {_backend(config)}"
        f"   placement v{s.version:.0f}   repartitions {s.repartitions:.0f}",
        f"  stream     produced {produced:>10,}   consumed {s.consumed:>10,.0f}   trained "
        f"{s.trained:>10,.0f}   {_rate(tl, 'trained'):>7,.0f} samples/s",
        f"  placement  remote rows/sample {rrps:5.2f}   rows migrated {s.migrated:>9,.0f}   "
        f"steps while migrating {s.migrating_steps:.0f}",
        f"  replicas   staleness p50 {stale50:.0f}  p99 {stale99:.0f} (bound {config.staleness})   "
        f"refreshes {_rate(tl, 'refreshes'):,.0f}/s   pushes {_rate(tl, 'pushes'):,.0f}/s",
        f"  model      loss {loss:.4f}   rolling AUC {s.auc:.4f}   freshness p99 <= "
        f"{fresh99:.2g} s   checkpoint {ckpt}",
        f"  metrics    {'  '.join(urls)}",
    ]
    if tty:
        prefix = f"\x1b[{len(lines)}F" if getattr(_view, "drawn", False) else ""
        out.write(prefix + "\n".join(line + "\x1b[K" for line in lines) + "\n")
        _view.drawn = not final  # type: ignore[attr-defined]
    else:
        out.write(" | ".join(line.strip() for line in lines[:-1]) + "\n")
    out.flush()


def _write(config: DemoConfig, directory: Path, tl: _Timeline, results: list[Any],
           produced: ProduceReport) -> Path:
    snaps = tl.snaps
    # Per-interval figures between consecutive scrapes.
    mid, rr, thr, aucs, auc_t = [], [], [], [], []
    for a, b in zip(snaps, snaps[1:]):
        dt, dn = b.t - a.t, b.trained - a.trained
        if dt <= 0:
            continue
        mid.append(b.t)
        thr.append(dn / dt)
        rr.append((b.not_held - a.not_held) / dn if dn > 0 else math.nan)
        if b.auc == b.auc:
            aucs.append(b.auc)
            auc_t.append(b.t)
    marks = [b.t for a, b in zip(snaps, snaps[1:]) if b.version > a.version]
    rank0 = results[0] if results else None
    events = rank0.online.get("events", []) if rank0 else []
    done = [e for e in events if e["event"] == "migration_done"]
    totals = rank0.job_totals.summary() if rank0 else {}
    summary: dict[str, Any] = {
        "duration_s": config.duration_s,
        "workers": config.workers,
        "device": config.device,
        "records_produced": produced.records,
        "records_consumed_last_scrape": int(snaps[-1].consumed) if snaps else 0,
        "samples_trained": int(totals.get("samples_trained", 0)),
        "steps": rank0.steps if rank0 else 0,
        "samples_per_s": round(rank0.samples_per_s, 1) if rank0 else None,
        "placement_version": rank0.placement.get("version") if rank0 else None,
        "repartitions": sum(1 for e in events if e["event"] == "placement"),
        "drift_triggers": sum(1 for e in events if e["event"] == "drift"),
        "rows_migrated": int(sum(e["rows_moved"] for e in done)),
        "remote_rows_per_sample": round(float(totals.get("remote_rows_per_sample", math.nan)), 3),
        "bytes_per_sample": round(float(totals.get("bytes_per_sample", math.nan)), 1),
        "max_staleness": totals.get("max_staleness"),
        "progressive_auc_last": round(aucs[-1], 4) if aucs else None,
        "freshness_p50_s": _round(rank0.online.get("freshness_p50_s")) if rank0 else None,
        "freshness_p99_s": _round(rank0.online.get("freshness_p99_s")) if rank0 else None,
        "checkpoints": sum(1 for e in events if e["event"] == "checkpoint"),
        "last_checkpoint_records": _checkpoint_records(directory / "checkpoints"),
        "checkpoint_dir": str(directory / "checkpoints"),
    }
    charts = [
        Chart("Remote rows per sample (rows neither owned nor fresh in a replica)", "seconds",
              "rows/sample", [Series("all ranks", mid, rr)], marks, "new placement"),
        Chart("Rolling AUC (each sample scored before its update)", "seconds", "AUC",
              [Series("mean over ranks", auc_t, aucs)], marks, "new placement"),
        Chart("Throughput", "seconds", "records/s", [
            Series("trained", mid, thr),
            Series("produced", [p[0] for p in tl.produced][1:],
                   list(np.diff([p[1] for p in tl.produced]) / np.maximum(
                       np.diff([p[0] for p in tl.produced]), 1e-9)))]),
        Chart("Rows moved per migration", "records trained when it finished", "rows",
              [Series("rows moved", [e["records"] for e in done],
                      [e["rows_moved"] for e in done])]),
    ]
    notes = [
        f"Synthetic stream (seed {config.seed}) drifting every {config.drift_every:,} records, "
        f"produced at {config.rate:,.0f} records/s into the embedded broker; {config.workers} "
        f"ranks ({_backend(config)}) train DeepFM (dim {config.embed_dim}) with staleness bound "
        f"{config.staleness}, global batch {config.global_batch:,}.",
        f"Placement: hash until {config.warmup:,} records, then a full METIS partition computed "
        f"beside training, then the incremental partitioner every "
        f"{config.repartition_interval:,} records or earlier when remote rows per sample rise "
        "(drift). Rows migrate live in bounded chunks between steps.",
        "Figures are scraped from the ranks' Prometheus endpoints once a second.",
    ]
    return write_report(directory, "hetgmp-stream demo", summary, charts, notes)


def _checkpoint_records(root: Path) -> int | None:
    from trainer.checkpoint import latest

    found = latest(root)
    return found.records if found is not None else None


def _round(x: Any) -> Any:
    return round(x, 3) if isinstance(x, float) and x == x else None


def add_demo_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """Flags of ``hetgmp demo``: one per field of :class:`DemoConfig`."""
    add_flags(parser, DemoConfig, "demo", toml=toml)


def run_from_flags(args: argparse.Namespace) -> int:
    """``hetgmp demo`` from its parsed flags."""
    from trainer.dist import resolve_device

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
