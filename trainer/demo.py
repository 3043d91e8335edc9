"""``make demo``: the stream, the access window and live repartitioning, end to end on one machine.

What runs: the embedded Kafka broker; the synthetic drifting click stream produced into it at a
fixed rate; a consumer decoding it into batches; the rolling access window; and, every few
seconds, a new placement computed from the window (a full METIS partition at cold start, the
incremental partitioner after) on a background thread. Every global batch is routed to the
workers under the current graph placement and under hash placement (what row-wise sharding does),
and HET-GMP's measure, remote rows per sample, is recorded for both. A live view shows throughput,
remote rows and repartitions; at the end a report (HTML with charts, plus JSON) is written.

Training on these placements (trainer ranks, replicas, staleness, live migration) is the next
stage of the system; this demo shows the placement side working on the live stream.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from streaming.broker import BrokerUnavailable, EmbeddedBroker
from streaming.config import add_flags, build
from streaming.consumer import ClickConsumer, ConsumerConfig
from streaming.kafka import KafkaSettings
from streaming.producer import ProduceConfig, ProduceReport, produce
from streaming.synthetic import SyntheticConfig
from streaming.window import AccessWindow, WindowConfig
from trainer.report import Chart, Series, write_report

__all__ = ["DemoConfig", "main", "run_demo"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo."""

    duration_s: float = field(default=120.0, metadata={"help": "seconds to run"})
    rate: float = field(default=20_000.0, metadata={"help": "records per second produced"})
    workers: int = field(default=2, metadata={"help": "workers the placement is computed for"})
    global_batch: int = field(default=4096, metadata={"help": "samples per step over all workers"})
    window: int = field(default=100_000, metadata={"help": "samples in the access window"})
    repartition_every_s: float = field(default=5.0, metadata={"help": "seconds between placements"})
    drift_every: int = field(default=100_000, metadata={"help": "records between stream drifts"})
    partitions: int = field(default=4, metadata={"help": "Kafka partitions of the demo topic"})
    seed: int = field(default=0, metadata={"help": "seed of the synthetic stream"})
    report_dir: str = field(default="reports", metadata={"help": "where the report goes"})
    live: bool = field(default=True, metadata={"help": "redraw a live view (off: log lines)"})


@dataclass
class _Timeline:
    t: list[float] = field(default_factory=list)
    rr_hash: list[float] = field(default_factory=list)
    rr_graph: list[float] = field(default_factory=list)
    throughput_t: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)
    repartitions: list[dict] = field(default_factory=list)


def _repartition(partitioner, window, current, workers: int):
    from partitioner import plan_diff

    t0 = time.perf_counter()
    placement = partitioner.partition(window, current)
    seconds = time.perf_counter() - t0
    before = current if current is not None else _hash(workers)
    plan = plan_diff(before, placement, row_bytes=64 * 4)
    return placement, seconds, int(plan.rows_moved), int(plan.bytes_moved)


def _hash(workers: int):
    from partitioner import Placement

    return Placement.hash(workers)


def run_demo(config: DemoConfig, stop: threading.Event | None = None) -> Path:
    """Run the demo; returns the path of the HTML report."""
    from partitioner import (
        FullPartitioner,
        IncrementalPartitioner,
        PartitionConfig,
        WindowGraph,
        remote_rows_per_sample,
        route,
    )

    stop = stop or threading.Event()
    out = sys.stdout
    tty = config.live and out.isatty()
    pconf = PartitionConfig(num_workers=config.workers, global_batch=config.global_batch)
    full, incremental = FullPartitioner(pconf), IncrementalPartitioner(pconf)
    hash_placement = _hash(config.workers)
    placement = None
    timeline = _Timeline()
    produced = ProduceReport()
    topic = f"clicks-demo-{int(time.time())}"

    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(EmbeddedBroker())
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="hetgmp-demo")
        print(f"embedded Kafka broker at {broker.bootstrap_servers}; topic {topic}", flush=True)
        producer_stop = threading.Event()
        stack.callback(producer_stop.set)

        def run_producer() -> None:
            nonlocal produced
            produced = produce(
                kafka,
                ProduceConfig(topic=topic, count=0, rate=config.rate, partitions=config.partitions),
                SyntheticConfig(seed=config.seed, drift_every=config.drift_every),
                stop=producer_stop,
                progress=lambda r: None,
            )

        producer = threading.Thread(target=run_producer, name="demo-producer", daemon=True)
        producer.start()
        stack.callback(producer.join, 10)
        consumer = (
            stack.enter_context(
                ClickConsumer(
                    kafka, ConsumerConfig(topic=topic, group_id=""), partitions=list(range(config.partitions))
                )
            )
            if _wait_topic(kafka, topic, config.partitions)
            else None
        )
        if consumer is None:
            raise RuntimeError("the demo topic was not created")
        pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(1, "repartition"))
        window = AccessWindow(26, WindowConfig(capacity=config.window))
        pending: concurrent.futures.Future | None = None
        pending_since = 0.0
        buffered: list[np.ndarray] = []
        n_buffered = 0
        t0 = time.monotonic()
        last_view = last_rate_t = t0
        last_rate_records = 0
        next_repartition = t0 + config.repartition_every_s
        while not stop.is_set():
            now = time.monotonic()
            if now - t0 >= config.duration_s:
                break
            batch = consumer.next_batch(8192, timeout=0.2)
            if len(batch):
                window.add(batch.ids)
                buffered.append(batch.ids)
                n_buffered += len(batch)
            while n_buffered >= config.global_batch:
                ids = np.concatenate(buffered)
                step, rest = ids[: config.global_batch], ids[config.global_batch :]
                buffered, n_buffered = [rest], rest.shape[0]
                graph = placement or hash_placement
                timeline.t.append(now - t0)
                timeline.rr_hash.append(
                    remote_rows_per_sample(step, route(step, hash_placement), hash_placement)
                )
                timeline.rr_graph.append(remote_rows_per_sample(step, route(step, graph), graph))
            if pending is not None and pending.done():
                placement, seconds, rows, nbytes = pending.result()
                timeline.repartitions.append(
                    {
                        "t": pending_since - t0,
                        "version": placement.version,
                        "seconds": seconds,
                        "rows_moved": rows,
                        "bytes_moved": nbytes,
                    }
                )
                pending = None
            if pending is None and now >= next_repartition and len(window) >= config.global_batch:
                graph_window = WindowGraph.from_dense(window.samples(), start=window.start)
                which = full if placement is None else incremental
                pending, pending_since = (
                    pool.submit(_repartition, which, graph_window, placement, config.workers),
                    now,
                )
                next_repartition = now + config.repartition_every_s
            if now - last_rate_t >= 1.0:
                s = consumer.stats
                timeline.throughput_t.append(now - t0)
                timeline.throughput.append((s.records - last_rate_records) / (now - last_rate_t))
                last_rate_records, last_rate_t = s.records, now
            if now - last_view >= (0.5 if tty else 5.0):
                last_view = now
                _view(out, tty, now - t0, config, consumer, timeline, placement)
        _view(out, tty, time.monotonic() - t0, config, consumer, timeline, placement, final=True)
        consumed = consumer.stats.records
        rejected = sum(consumer.stats.rejected.values())
    return _write(config, timeline, produced, consumed, rejected)


def _wait_topic(kafka: KafkaSettings, topic: str, partitions: int, timeout: float = 30.0) -> bool:
    from kafka import KafkaConsumer

    probe = KafkaConsumer(**kafka.client_kwargs())
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            parts = probe.partitions_for_topic(topic)
            if parts and len(parts) >= partitions:
                return True
            time.sleep(0.2)
        return False
    finally:
        probe.close()


def _mean_tail(values: list[float], n: int = 20) -> float:
    return float(np.mean(values[-n:])) if values else float("nan")


def _view(
    out,
    tty: bool,
    elapsed: float,
    config: DemoConfig,
    consumer,
    timeline: _Timeline,
    placement,
    final: bool = False,
) -> None:
    s = consumer.stats
    rate = timeline.throughput[-1] if timeline.throughput else 0.0
    rr_h, rr_g = _mean_tail(timeline.rr_hash), _mean_tail(timeline.rr_graph)
    saving = (1 - rr_g / rr_h) * 100 if rr_h and rr_h == rr_h else float("nan")
    last = timeline.repartitions[-1] if timeline.repartitions else None
    lines = [
        f"hetgmp demo  {elapsed:6.1f}s / {config.duration_s:.0f}s   workers {config.workers}   window {config.window:,}",
        f"  consumed   {s.records:>12,} records   {rate:>9,.0f} records/s   rejected {sum(s.rejected.values()):,}",
        f"  remote rows per sample (last 20 steps):  hash {rr_h:6.2f}   graph {rr_g:6.2f}   saving {saving:5.1f}%",
        f"  placement  version {placement.version if placement else 0:<4d} repartitions {len(timeline.repartitions):<4d}"
        + (f" last: {last['seconds']:.2f}s, {last['rows_moved']:,} rows moved" if last else ""),
    ]
    if tty:
        # Move back over the previous frame (the final frame too, so it replaces the last one).
        prefix = f"\x1b[{len(lines)}F" if getattr(_view, "drawn", False) else ""
        out.write(prefix + "\n".join(line + "\x1b[K" for line in lines) + "\n")
        _view.drawn = not final  # type: ignore[attr-defined]
    else:
        out.write(" | ".join(line.strip() for line in lines[1:]) + "\n")
    out.flush()


def _write(config: DemoConfig, tl: _Timeline, produced: ProduceReport, consumed: int, rejected: int) -> Path:
    after_first = [i for i, t in enumerate(tl.t) if tl.repartitions and t >= tl.repartitions[0]["t"] + 1]
    rr_h = float(np.mean([tl.rr_hash[i] for i in after_first])) if after_first else float("nan")
    rr_g = float(np.mean([tl.rr_graph[i] for i in after_first])) if after_first else float("nan")
    summary = {
        "duration_s": config.duration_s,
        "records_produced": produced.records,
        "records_consumed": consumed,
        "records_rejected": rejected,
        "steps": len(tl.t),
        "repartitions": len(tl.repartitions),
        "remote_rows_per_sample_hash": round(rr_h, 3),
        "remote_rows_per_sample_graph": round(rr_g, 3),
        "saving_vs_hash_pct": round((1 - rr_g / rr_h) * 100, 1) if rr_h == rr_h and rr_h else None,
        "mean_repartition_s": round(float(np.mean([r["seconds"] for r in tl.repartitions])), 3)
        if tl.repartitions
        else None,
        "rows_moved_total": sum(r["rows_moved"] for r in tl.repartitions),
    }
    marks = [r["t"] + r["seconds"] for r in tl.repartitions]
    charts = [
        Chart(
            "Remote rows per sample",
            "seconds",
            "rows/sample",
            [Series("hash placement", tl.t, tl.rr_hash), Series("graph placement", tl.t, tl.rr_graph)],
            marks,
            "new placement",
        ),
        Chart("Throughput", "seconds", "records/s", [Series("consumed", tl.throughput_t, tl.throughput)]),
        Chart(
            "Rows moved per repartition",
            "seconds",
            "rows",
            [
                Series(
                    "rows moved",
                    [r["t"] for r in tl.repartitions],
                    [r["rows_moved"] for r in tl.repartitions],
                )
            ],
        ),
        Chart(
            "Repartition time",
            "seconds",
            "seconds",
            [
                Series(
                    "partitioner", [r["t"] for r in tl.repartitions], [r["seconds"] for r in tl.repartitions]
                )
            ],
        ),
    ]
    notes = [
        f"Synthetic stream (seed {config.seed}) drifting every {config.drift_every:,} records, produced at "
        f"{config.rate:,.0f} records/s into the embedded broker; {config.workers} workers, global batch "
        f"{config.global_batch:,}, window {config.window:,} samples. Averages are over steps after the first placement.",
        "Training on these placements (ranks, replicas, staleness, live migration) is not part of this demo yet.",
    ]
    directory = Path(config.report_dir) / time.strftime("demo-%Y%m%d-%H%M%S")
    return write_report(directory, "hetgmp-stream demo", summary, charts, notes)


def main(argv: list[str] | None = None) -> int:
    """``hetgmp demo``: flags from :class:`DemoConfig`."""
    from trainer.cli import stop_on_signals

    p = argparse.ArgumentParser(prog="hetgmp demo", description=__doc__.split("\n\n")[0])
    add_flags(p, DemoConfig, "demo")
    args = p.parse_args([a for a in (argv or []) if a != "--"])
    config = build(DemoConfig, args)
    stop = stop_on_signals()
    try:
        path = run_demo(config, stop)
    except BrokerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}", flush=True)
    print(f"data:   {path.with_suffix('.json')}", flush=True)
    return 0
