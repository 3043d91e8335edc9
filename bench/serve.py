"""Serving benchmark: how fresh the served model is, what the delta log costs, how fast it answers.

Protocol (one run):

* An embedded broker (Tansu); the drifting synthetic stream produced at ``--rate`` records/s
  into a topic of ``--partitions`` partitions; ``--workers`` CPU ranks train DeepFM online from
  it (checkpoints every ``--checkpoint-s``, a publish of the model's changes every
  ``--publish-interval`` s); one ``hetgmp serve`` process loads the first checkpoint and
  follows the delta log; a client sends it ``--rps`` requests a second of ``--request-records``
  records while training runs.
* Freshness end to end: for append times ``a`` on a 10 ms grid over the records produced once
  serving answered, the first reply whose model watermark (the newest append time whose every
  update it holds) reached ``a``, minus ``a``. The resolution is the request period.
* Delta log: bytes the ranks published per sample trained and per second, against the bytes of
  the rows the trainer updated (each rank's distinct rows a step, 8-byte id + float32 row: what
  a log without deduplication would carry).
* Serving speed, after training ended (the model fixed): ``--clients`` clients send requests
  back to back for ``--serve-s`` s: latency p50/p99 and records/s. The ceiling: the same
  decoded records scored by a :class:`~trainer.serving.ServingModel` in this process (gather
  and forward pass, no HTTP, no decoding), one thread.

The last line printed is ``{"bench": "serve", "freshness_p50_s", "freshness_p99_s",
"delta_bytes_per_sample", "updated_row_bytes_per_sample", "serve_records_per_s",
"serve_p99_ms", "forward_records_per_s", ...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from streaming import Decoder
from streaming.broker import EmbeddedBroker
from streaming.consumer import ConsumerConfig
from streaming.kafka import KafkaSettings, ensure_topic
from streaming.producer import ProduceConfig, ProduceReport, produce
from streaming.runtime import free_ports
from streaming.synthetic import SyntheticConfig, SyntheticStream
from trainer import checkpoint as ckpt
from trainer.dist.launch import launch
from trainer.job import Job, RankResult
from trainer.run import run_rank
from trainer.sources import KafkaSpec
from trainer.types import LaunchConfig, ModelConfig, OnlineConfig, StoreConfig, TrainConfig

__all__ = ["build_parser", "main", "parse_args"]

log = logging.getLogger("hetgmp.bench.serve")

TSV = {"Content-Type": "text/tab-separated-values"}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(
        prog="hetgmp bench serve",
        description="Freshness from Kafka to a served prediction, delta-log bytes against the "
                    "rows updated, serving latency and rate against the forward pass alone.")
    p.add_argument("--records", type=int, default=240_000, help="records produced and trained")
    p.add_argument("--rate", type=float, default=8000.0, help="records/s produced")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    p.add_argument("--workers", type=int, default=2, help="training ranks (CPU, gloo)")
    p.add_argument("--global-batch", type=int, default=2048, help="samples a step")
    p.add_argument("--embed-dim", type=int, default=16, help="embedding dimension")
    p.add_argument("--staleness", type=int, default=10, help="replica staleness bound s")
    p.add_argument("--publish-interval", type=float, default=1.0,
                   help="seconds between publishes of the delta log")
    p.add_argument("--checkpoint-s", type=float, default=10.0, help="seconds between checkpoints")
    p.add_argument("--rps", type=float, default=20.0,
                   help="requests a second while training (the freshness probe)")
    p.add_argument("--request-records", type=int, default=256, help="records a request")
    p.add_argument("--clients", type=int, default=2, help="clients of the speed phase")
    p.add_argument("--serve-s", type=float, default=10.0, help="seconds of the speed phase")
    p.add_argument("--seed", type=int, default=0, help="seed of the stream and the model")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and check the flags."""
    p = build_parser()
    args = p.parse_args(argv)
    for name in ("records", "rate", "partitions", "workers", "global_batch", "embed_dim",
                 "publish_interval", "checkpoint_s", "rps", "request_records", "clients",
                 "serve_s"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


class _Probe(threading.Thread):
    """Requests at a steady rate; (reply wall time, model watermark ms, latency s) of each."""

    def __init__(self, url: str, bodies: list[bytes], rps: float) -> None:
        super().__init__(name="bench-probe", daemon=True)
        self.url, self.bodies, self.period = url, bodies, 1.0 / rps
        self.halt = threading.Event()
        self.replies: list[tuple[float, int, float]] = []
        self.errors = 0

    def run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self.halt.is_set():
            next_at += self.period
            t0 = time.perf_counter()
            try:
                reply = _post(self.url, self.bodies[i % len(self.bodies)])
                self.replies.append((time.time(), int(reply["model"]["watermark_ms"]),
                                     time.perf_counter() - t0))
            except urllib.error.HTTPError:
                self.errors += 1
            except OSError:
                pass  # not listening yet
            i += 1
            self.halt.wait(max(0.0, next_at - time.monotonic()))


def _post(url: str, body: bytes) -> dict[str, Any]:
    req = urllib.request.Request(url + "/predict", data=body, headers=TSV)
    with urllib.request.urlopen(req, timeout=30) as r:
        reply: dict[str, Any] = json.loads(r.read())
    return reply


def freshness(replies: list[tuple[float, int, float]], since_s: float, until_s: float,
              step_s: float = 0.01) -> np.ndarray:
    """Seconds from each append time on a grid over [since, until] to the first reply whose
    watermark reached it (append times no reply reached are left out)."""
    if not replies:
        return np.zeros(0)
    t = np.array([r[0] for r in replies])
    w = np.maximum.accumulate(np.array([r[1] for r in replies], np.float64) / 1000.0)
    grid = np.arange(since_s, until_s, step_s)
    first = np.searchsorted(w, grid, side="left")  # first reply with watermark >= a
    ok = first < t.size
    return t[first[ok]] - grid[ok]


def _speed(url: str, bodies: list[bytes], clients: int, seconds: float) -> dict[str, float]:
    latencies: list[float] = []
    records = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    n = bodies[0].count(b"\n") + 1

    def client(k: int) -> None:
        i = k
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            _post(url, bodies[i % len(bodies)])
            with lock:
                latencies.append(time.perf_counter() - t0)
                records[0] += n
            i += clients

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t0
    lat = np.array(latencies)
    return {"records_per_s": records[0] / elapsed, "p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "p99_ms": float(np.percentile(lat, 99)) * 1e3, "requests": float(lat.size)}


def _forward_alone(manifest: ckpt.Manifest, bodies: list[bytes], seconds: float) -> float:
    """Records/s of ServingModel.score on decoded requests, one thread."""
    import torch

    from trainer.serving import ServingModel

    torch.set_num_threads(1)
    model = ServingModel.from_checkpoint(manifest)
    decoder = Decoder()
    batches = [decoder.decode(b.split(b"\n")).batch for b in bodies]
    model.score(batches[0])
    done, i = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        done += len(batches[i % len(batches)])
        model.score(batches[i % len(batches)])
        i += 1
    return done / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stream = SyntheticStream(SyntheticConfig(seed=args.seed + 1))
    n = args.request_records
    bodies = [b"\n".join(stream.lines(i * n, n)) for i in range(32)]
    work = Path(tempfile.mkdtemp(prefix="hetgmp-bench-serve-"))
    root = work / "checkpoints"
    topic = f"bench-serve-{int(time.time())}"
    report = ProduceReport()
    results: list[RankResult] = []
    errors: list[BaseException] = []
    with EmbeddedBroker() as broker:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="bench-serve")
        ensure_topic(kafka, topic, args.partitions)
        job = Job(
            KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=f"{topic}-g"),
                      records=args.records, idle_s=15.0, poll_s=0.05),
            ModelConfig(model="deepfm", embed_dim=args.embed_dim, hidden=(64, 32),
                        seed=args.seed),
            StoreConfig(seed=args.seed),
            TrainConfig(staleness=args.staleness, global_batch=args.global_batch,
                        warmup=20_000, log_every=0),
            online=OnlineConfig(repartition_interval="40000", window=100_000,
                                migration_chunk_bytes=64 << 10, checkpoint_dir=str(root),
                                checkpoint_interval=f"{args.checkpoint_s:g}s",
                                keep_checkpoints=2, publish_interval=args.publish_interval),
            seed=args.seed)

        def train() -> None:
            try:
                results.extend(launch(run_rank, job, LaunchConfig(
                    workers=args.workers, device="cpu", timeout_s=600)))
            except BaseException as exc:  # reported below
                errors.append(exc)

        def make() -> None:
            try:
                produce(kafka, ProduceConfig(topic=topic, count=args.records, rate=args.rate,
                                             partitions=args.partitions),
                        SyntheticConfig(seed=args.seed, drift_every=100_000), report=report)
            except BaseException as exc:  # reported below
                errors.append(exc)

        port = free_ports(18500, 1)
        url = f"http://127.0.0.1:{port}"
        trainer = threading.Thread(target=train, daemon=True)
        producer = threading.Thread(target=make, daemon=True)
        t_start = time.time()
        trainer.start()
        producer.start()
        with open(work / "serve.log", "w") as out:
            serve = subprocess.Popen(
                [sys.executable, "-m", "trainer.app.cli", "serve", "--checkpoint-dir", str(root),
                 "--bootstrap-servers", kafka.bootstrap_servers, "--port", str(port)],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
            probe = _Probe(url, bodies, args.rps)
            try:
                probe.start()
                print(f"training {args.records:,} records at {args.rate:,.0f}/s on "
                      f"{args.workers} ranks; hetgmp serve on {url} (log {work / 'serve.log'})",
                      flush=True)
                while trainer.is_alive():
                    trainer.join(5.0)
                    if probe.replies:
                        lag = time.time() - probe.replies[-1][1] / 1000.0
                        print(f"  {time.time() - t_start:5.0f} s: produced {report.records:,}, "
                              f"{len(probe.replies):,} replies, model lag {lag:.2f} s",
                              flush=True)
                probe.halt.set()
                probe.join(5)
                producer.join(30)
                if errors:
                    raise errors[0]
                final = ckpt.latest(root)
                assert final is not None
                _wait_for_step(url, final.step)
                speed = _speed(url, bodies, args.clients, args.serve_s)
            finally:
                serve.terminate()
                serve.wait(15)
    ceiling = _forward_alone(final, bodies, min(args.serve_s, 5.0))
    return _print(args, results, probe, report, speed, ceiling, t_start)


def _wait_for_step(url: str, step: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as r:
            if json.loads(r.read()).get("step", -1) >= step:
                return
        time.sleep(0.2)
    raise TimeoutError(f"serve did not reach step {step} in {timeout_s:g} s")


def _print(args: argparse.Namespace, results: list[RankResult], probe: _Probe,
           report: ProduceReport, speed: dict[str, float], ceiling: float,
           t_start: float) -> int:
    samples = results[0].job_totals.samples
    seconds = results[0].seconds
    published = [r.online.get("publish", {}) for r in results]
    delta_bytes = sum(p.get("bytes", 0) for p in published)
    rows_sent = sum(p.get("rows", 0) for p in published)
    unique = sum(int(r.totals.counts.get("unique_ids", 0)) for r in results)
    row_bytes = 8 + 4 * (args.embed_dim + 1)  # DeepFM: first-order weight + vector
    updated = unique * row_bytes
    first_reply = probe.replies[0][0] if probe.replies else t_start
    fresh = freshness(probe.replies, first_reply, probe.replies[-1][1] / 1000.0
                      if probe.replies else first_reply)
    p50 = float(np.percentile(fresh, 50)) if fresh.size else float("nan")
    p99 = float(np.percentile(fresh, 99)) if fresh.size else float("nan")
    print(f"\ntrained {samples:,} samples in {seconds:.1f} s ({samples / seconds:,.0f}/s); "
          f"produced {report.records:,}")
    print(f"freshness (append to Kafka -> scored with its update): p50 {p50:.2f} s, p99 "
          f"{p99:.2f} s over {fresh.size:,} append times (request period "
          f"{1000 / args.rps:.0f} ms)")
    print(f"delta log: {delta_bytes / samples:,.1f} bytes/sample, {delta_bytes / seconds / 1e6:.2f}"
          f" MB/s ({rows_sent:,} rows); rows updated: {updated / samples:,.1f} bytes/sample "
          f"({unique:,} row updates): {updated / max(delta_bytes, 1):.1f}x what the log carries")
    print(f"serving, model fixed, {args.clients} clients, {args.request_records} records a "
          f"request: {speed['records_per_s']:,.0f} records/s, p50 {speed['p50_ms']:.1f} ms, "
          f"p99 {speed['p99_ms']:.1f} ms; forward alone (one thread): {ceiling:,.0f} records/s "
          f"({speed['records_per_s'] / ceiling:.2f}x)")
    print(json.dumps({
        "bench": "serve", "freshness_p50_s": round(p50, 3), "freshness_p99_s": round(p99, 3),
        "delta_bytes_per_sample": round(delta_bytes / samples, 2),
        "updated_row_bytes_per_sample": round(updated / samples, 2),
        "delta_bytes_per_s": round(delta_bytes / seconds),
        "serve_records_per_s": round(speed["records_per_s"]),
        "serve_p50_ms": round(speed["p50_ms"], 2), "serve_p99_ms": round(speed["p99_ms"], 2),
        "forward_records_per_s": round(ceiling), "samples_trained": samples,
        "samples_per_s": round(samples / seconds), "probe_errors": probe.errors,
        "publish_interval_s": args.publish_interval, "staleness": args.staleness}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
