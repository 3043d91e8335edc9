"""Serving benchmark: how fresh the served model is, what the delta log costs, how fast it
answers, and what bad messages and stalled clients do to it.

One invocation performs several runs on one embedded broker (Tansu) and prints one row each.

Training runs, ``publish_<s>s``, one for each of ``--publish-intervals`` (default 1 s and
0.25 s):

* The drifting synthetic stream produced at ``--rate`` records/s into a topic of
  ``--partitions`` partitions; ``--workers`` CPU ranks train DeepFM online from it (checkpoints
  as a user's run takes them by default, or every ``--checkpoint-s``; a publish of the model's
  changes every publish interval); one
  ``hetgmp serve`` process loads the first checkpoint and follows the delta log; a client sends
  it ``--rps`` requests a second of ``--probe-records`` records while training runs.
* Freshness end to end: for append times ``a`` on a 10 ms grid over the records produced once
  serving answered, the first reply whose model watermark (the newest append time whose every
  update it holds) reached ``a``, minus ``a``. The resolution is the request period.
* Delta log: bytes the ranks published per sample trained and per second, against the bytes of
  the rows the trainer updated (each rank's distinct rows a step, 8-byte id + float32 row: what
  a log without deduplication would carry).
* Serving speed, after training ended (the model fixed): ``--clients`` clients send requests
  back to back for ``--serve-s`` s: latency p50/p99 and records/s. The ceiling: the same
  decoded records scored by a :class:`~hetgmp.trainer.serving.ServingModel` in this process (gather
  and forward pass, no HTTP, no decoding), one thread.

``poisoned``, on the last training run's checkpoint directory and delta log (no more
training): a copy of its first checkpoint is served by two ``hetgmp serve`` processes, a clean
one following the job's delta log and a poisoned one following (``--model-topic``) a copy of
that log in which one invalid message, crafted with the header of the valid message before it
(:mod:`bench.serve_probes`), follows every ``--poison-every``-th of the N valid messages the
serve processes read (M in all: rows of the wrong width, NaN rows, dense parameters of the
wrong size, a publish number 2^39 ahead, a generation of -1, garbage bytes, a mark of a newer
generation with base 0, rows as a variable-length list, in turn). Once both are ready at the
final checkpoint's step and their ``hetgmp_serve_deltas_*`` counters have stopped moving, both
score the same requests. Target: every invalid message rejected (the poisoned serve's
``hetgmp_serve_deltas_rejected_total`` = M) and the scores equal (difference 0.0).

``slow_clients``, on the clean serve process of ``poisoned`` (run with ``--header-timeout-s``
and ``--body-timeout-s``): one client sends requests back to back for min(header timeout, body
timeout) seconds, first alone, then while ``--stalled`` connections hold half a request head
and ``--stalled`` more a whole head and half the body it announces; the p99 latency of each
window, and how many stalled connections the server closed in time: a half head within the
header timeout + 1 s of opening, a half body within the body timeout + serve's 1 s linger after
its 408 reply + 1 s of sending its head.

The last line printed is ``{"bench": "serve", "rows": [...]}``: every row has ``run`` and
every field of :data:`FIELDS` (null where it does not apply to the run; ``poisoned`` and
``slow_clients`` carry the publish interval and staleness of the run whose log they use):
``freshness_p50_s``, ``freshness_p99_s``, ``delta_bytes_per_sample``,
``updated_row_bytes_per_sample``, ``serve_records_per_s``, ``serve_p99_ms``,
``forward_records_per_s``, ... for the training runs;
``poisoned_messages``, ``valid_messages``, ``rejected_messages``, ``rejected_by_reason``,
``max_score_diff_vs_clean`` for ``poisoned``; ``stalled_connections``,
``stalled_closed_within_timeout``, ``normal_p99_ms_idle``, ``normal_p99_ms_with_stalled``,
``p99_ratio`` for ``slow_clients``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.serve_probes import (
    ServeProcess,
    Stalled,
    copy_with_poison,
    expected_reason,
    post,
    wait_settled,
)
from hetgmp.runtime import free_ports
from hetgmp.streaming import Decoder
from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings, ensure_topic
from hetgmp.streaming.producer import ProduceConfig, ProduceReport, produce
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.app.serve import LINGER_S
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, RankResult, run_rank
from hetgmp.trainer.sources import KafkaSpec
from hetgmp.trainer.step import TrainConfig

__all__ = ["FIELDS", "build_parser", "main", "parse_args"]

log = logging.getLogger("hetgmp.bench.serve")

#: The fields of every row (besides ``run``), by the runs they apply to.
TRAIN_FIELDS = ("freshness_p50_s", "freshness_p99_s", "trained_freshness_p50_s",
                "trained_freshness_p99_s", "publishes", "publish_ms_mean", "steps",
                "delta_bytes_per_sample",
                "updated_row_bytes_per_sample", "delta_bytes_per_s", "serve_records_per_s",
                "serve_p50_ms", "serve_p99_ms", "forward_records_per_s", "samples_trained",
                "samples_per_s", "probe_errors", "publish_interval_s", "staleness")
POISON_FIELDS = ("poisoned_messages", "valid_messages", "rejected_messages", "rejected_by_reason",
                 "expected_by_reason", "poisoned_by_kind", "applied_messages",
                 "rejected_messages_clean", "max_score_diff_vs_clean")
SLOW_FIELDS = ("stalled_connections", "stalled_closed_within_timeout", "stalled_close_max_s",
               "normal_p99_ms_idle", "normal_p99_ms_with_stalled", "p99_ratio",
               "header_timeout_s", "body_timeout_s")
FIELDS = TRAIN_FIELDS + POISON_FIELDS + SLOW_FIELDS


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(
        prog="hetgmp bench serve", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Freshness from Kafka to a served prediction and delta-log bytes against "
                    "the rows updated at each publish interval, serving latency and rate against "
                    "the forward pass alone; a poisoned copy of the delta log against the clean "
                    "one; normal requests while stalled clients hold connections.")
    p.add_argument("--records", type=int, default=240_000,
                   help="records produced and trained in each training run")
    p.add_argument("--rate", type=float, default=6000.0,
                   help="records/s produced (2 ranks on 2 shared cores sustain it; at 8,000/s "
                        "they fell behind and freshness grew through the run)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    p.add_argument("--workers", type=int, default=2, help="training ranks (CPU, gloo)")
    p.add_argument("--global-batch", type=int, default=2048, help="samples a step")
    p.add_argument("--embed-dim", type=int, default=16, help="embedding dimension")
    p.add_argument("--staleness", type=int, default=10, help="replica staleness bound s")
    p.add_argument("--publish-intervals", "--publish-interval", dest="publish_intervals",
                   default="1,0.25", metavar="SECONDS[,SECONDS...]",
                   help="seconds between publishes of the delta log: one training run each, "
                        "in this order (the poisoned and slow-client runs use the last one's "
                        "log)")
    p.add_argument("--checkpoint-s", type=float, default=0.0,
                   help="seconds between checkpoints (0: the trainer's default, "
                        "--checkpoint-interval auto: one at the first publish, then every "
                        "300 s, as a user's run does; a checkpoint stalls the steps it interrupts)")
    p.add_argument("--rps", type=float, default=50.0,
                   help="requests a second while training (the freshness probe: its period "
                        "bounds the resolution of the freshness figures)")
    p.add_argument("--probe-records", type=int, default=16,
                   help="records a probe request (it reads the model's watermark; a small one "
                        "leaves the CPU to training)")
    p.add_argument("--request-records", type=int, default=256, help="records a request")
    p.add_argument("--clients", type=int, default=2, help="clients of the speed phase")
    p.add_argument("--serve-s", type=float, default=10.0, help="seconds of the speed phase")
    p.add_argument("--poison-every", type=int, default=10,
                   help="poisoned run: one invalid message after every this many valid ones")
    p.add_argument("--stalled", type=int, default=50,
                   help="slow-client run: connections stalled in their head, and as many in "
                        "their body")
    p.add_argument("--header-timeout-s", type=float, default=2.0,
                   help="slow-client run: serve's --header-timeout-s (the normal client's "
                        "windows last the shorter of the two timeouts)")
    p.add_argument("--body-timeout-s", type=float, default=2.0,
                   help="slow-client run: serve's --body-timeout-s")
    p.add_argument("--seed", type=int, default=0, help="seed of the stream and the model")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and check the flags; ``intervals`` is ``--publish-intervals`` as floats."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.checkpoint_s < 0:
        p.error("--checkpoint-s must be >= 0 (0: the trainer's default)")
    for name in ("records", "rate", "partitions", "workers", "global_batch", "embed_dim",
                 "rps", "probe_records", "request_records", "clients", "serve_s", "poison_every",
                 "stalled", "header_timeout_s", "body_timeout_s"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    try:
        args.intervals = [float(x) for x in args.publish_intervals.split(",")]
    except ValueError:
        p.error(f"--publish-intervals {args.publish_intervals!r}: expected seconds, comma "
                "separated")
    if not all(0 < x < float("inf") for x in args.intervals):
        p.error("--publish-intervals must be positive")
    if len({f"{x:g}" for x in args.intervals}) != len(args.intervals):
        p.error("--publish-intervals names an interval twice")
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
        # Freshness counts from readiness (/readyz: the log caught up with once), as a load
        # balancer would send traffic: before it, serve answers from a checkpoint it is still
        # catching up from.
        while not self.halt.wait(0.05):
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass  # 503 (an HTTPError) or not listening yet
        i = 0
        next_at = time.monotonic()
        while not self.halt.is_set():
            next_at += self.period
            t0 = time.perf_counter()
            try:
                reply = post(self.url, self.bodies[i % len(self.bodies)])
                self.replies.append((time.time(), int(reply["model"]["watermark_ms"]),
                                     time.perf_counter() - t0))
            except urllib.error.HTTPError:
                # Before its first model serve answers 503 (not ready): not a failure.
                self.errors += bool(self.replies)
            except OSError:
                pass  # not listening yet
            i += 1
            self.halt.wait(max(0.0, next_at - time.monotonic()))


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
            post(url, bodies[i % len(bodies)])
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

    from hetgmp.trainer.serving import ServingModel

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


def _row(run: str, **values: Any) -> dict[str, Any]:
    return {"run": run, **dict.fromkeys(FIELDS), **values}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stream = SyntheticStream(SyntheticConfig(seed=args.seed + 1))
    n = args.request_records
    bodies = [b"\n".join(stream.lines(i * n, n)) for i in range(32)]
    work = Path(tempfile.mkdtemp(prefix="hetgmp-bench-serve-"))
    print(f"work directory {work}", flush=True)
    with EmbeddedBroker() as broker:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="bench-serve")
        runs = [_train_run(args, kafka, bodies, interval, work / f"run-{i}")
                for i, interval in enumerate(args.intervals)]
        rows = [r.row for r in runs] + _log_runs(args, kafka, runs[-1], bodies, work)
    print()
    print(_table(rows))
    print(json.dumps({"bench": "serve", "rows": rows}))
    return 0


# -- training runs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Trained:
    """A training run: its row, a copy of its first checkpoint, its final checkpoint."""

    row: dict[str, Any]
    first: Path
    final: ckpt.Manifest


def _job(args: argparse.Namespace, kafka: KafkaSettings, topic: str, root: Path,
         interval: float) -> Job:
    return Job(
        KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=f"{topic}-g"),
                  records=args.records, idle_s=15.0, poll_s=0.05),
        ModelConfig(model="deepfm", embed_dim=args.embed_dim, hidden=(64, 32), seed=args.seed),
        StoreConfig(seed=args.seed),
        TrainConfig(staleness=args.staleness, global_batch=args.global_batch,
                    warmup=20_000, log_every=0),
        online=OnlineConfig(repartition_interval="40000", window=100_000,
                            migration_chunk_bytes=64 << 10, checkpoint_dir=str(root),
                            checkpoint_interval=f"{args.checkpoint_s:g}s" if args.checkpoint_s
                            else "auto",
                            keep_checkpoints=2, publish_interval=interval),
        seed=args.seed)


def _keep_first(root: Path, dest: Path) -> None:
    """Copy the oldest complete checkpoint under ``root`` into ``dest`` (once), before the
    job prunes it; a copy that fails its checks (pruned while copied) is tried again."""
    if dest.exists() or not root.is_dir():
        return
    for d in sorted(p for p in root.iterdir() if (p / ckpt.MANIFEST).exists()):
        part = dest.with_name(dest.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        try:
            shutil.copytree(d, part / d.name)
        except (OSError, shutil.Error):
            continue
        if ckpt.latest(part) is not None:
            part.rename(dest)
            return


def _train_run(args: argparse.Namespace, kafka: KafkaSettings, bodies: list[bytes],
               interval: float, work: Path) -> _Trained:
    """One training run with a serve process following it (the ``publish_<s>s`` rows)."""
    work.mkdir(parents=True)
    root, first = work / "checkpoints", work / "first"
    topic = f"bench-serve-{int(time.time())}-{work.name}"
    report = ProduceReport()
    results: list[RankResult] = []
    errors: list[BaseException] = []
    ensure_topic(kafka, topic, args.partitions)
    job = _job(args, kafka, topic, root, interval)

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

    trainer = threading.Thread(target=train, daemon=True)
    producer = threading.Thread(target=make, daemon=True)
    t_start = time.time()
    trainer.start()
    producer.start()
    with ServeProcess(work / "serve.log", root, kafka, free_ports(18500, 1)) as serve:
        probe = _Probe(serve.url, [b"\n".join(b.split(b"\n")[:args.probe_records])
                                   for b in bodies], args.rps)
        probe.start()
        print(f"publish interval {interval:g} s: training {args.records:,} records at "
              f"{args.rate:,.0f}/s on {args.workers} ranks; hetgmp serve on {serve.url} (log "
              f"{serve.log_path})", flush=True)
        next_line = time.monotonic() + 5.0
        while trainer.is_alive():
            trainer.join(0.25)
            _keep_first(root, first)
            if time.monotonic() >= next_line:
                next_line = time.monotonic() + 5.0
                wm = probe.replies[-1][1] if probe.replies else -1
                lag = f"{time.time() - wm / 1000.0:.2f} s" if wm >= 0 else "-"
                print(f"  {time.time() - t_start:5.0f} s: produced {report.records:,}, "
                      f"{len(probe.replies):,} replies, model lag {lag}", flush=True)
        probe.halt.set()
        probe.join(5)
        producer.join(30)
        if errors:
            raise errors[0]
        _keep_first(root, first)  # a run shorter than a checkpoint interval: the final one
        final = ckpt.latest(root)
        assert final is not None
        _wait_for_step(serve, final.step)
        speed = _speed(serve.url, bodies, args.clients, args.serve_s)
    ceiling = _forward_alone(final, bodies, min(args.serve_s, 5.0))
    row = _train_row(args, interval, results, probe, report, speed, ceiling, t_start)
    return _Trained(row, first, final)


def _wait_for_step(serve: ServeProcess, step: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        at = serve.ready_step()
        if at is not None and at >= step:
            return
        time.sleep(0.2)
    raise TimeoutError(f"serve did not reach step {step} in {timeout_s:g} s")


def _train_row(args: argparse.Namespace, interval: float, results: list[RankResult],
               probe: _Probe, report: ProduceReport, speed: dict[str, float], ceiling: float,
               t_start: float) -> dict[str, Any]:
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
    print(f"  trained {samples:,} samples in {seconds:.1f} s ({samples / seconds:,.0f}/s); "
          f"produced {report.records:,}")
    print(f"  freshness (append to Kafka -> scored with its update): p50 {p50:.2f} s, p99 "
          f"{p99:.2f} s over {fresh.size:,} append times (request period "
          f"{1000 / args.rps:.0f} ms)")
    print(f"  delta log: {delta_bytes / samples:,.1f} bytes/sample, "
          f"{delta_bytes / seconds / 1e6:.2f} MB/s ({rows_sent:,} rows); rows updated: "
          f"{updated / samples:,.1f} bytes/sample ({unique:,} row updates): "
          f"{updated / max(delta_bytes, 1):.1f}x what the log carries")
    print(f"  serving, model fixed, {args.clients} clients, {args.request_records} records a "
          f"request: {speed['records_per_s']:,.0f} records/s, p50 {speed['p50_ms']:.1f} ms, "
          f"p99 {speed['p99_ms']:.1f} ms; forward alone (one thread): {ceiling:,.0f} records/s "
          f"({speed['records_per_s'] / ceiling:.2f}x)", flush=True)
    return _row(
        f"publish_{interval:g}s", freshness_p50_s=_round(p50, 3), freshness_p99_s=_round(p99, 3),
        # The trainer's own part: append to Kafka -> gradient applied (its histogram).
        trained_freshness_p50_s=results[0].online.get("freshness_p50_s"),
        trained_freshness_p99_s=results[0].online.get("freshness_p99_s"),
        publishes=int(published[0].get("publishes", 0)),
        publish_ms_mean=round(1000 * max(p.get("seconds", 0.0) for p in published)
                              / max(published[0].get("publishes", 0), 1), 1),
        steps=results[0].steps,
        delta_bytes_per_sample=round(delta_bytes / samples, 2),
        updated_row_bytes_per_sample=round(updated / samples, 2),
        delta_bytes_per_s=round(delta_bytes / seconds),
        serve_records_per_s=round(speed["records_per_s"]),
        serve_p50_ms=round(speed["p50_ms"], 2), serve_p99_ms=round(speed["p99_ms"], 2),
        forward_records_per_s=round(ceiling), samples_trained=samples,
        samples_per_s=round(samples / seconds), probe_errors=probe.errors,
        publish_interval_s=interval, staleness=args.staleness)


def _round(x: float, digits: int) -> float | None:
    return round(x, digits) if np.isfinite(x) else None  # JSON has no NaN


# -- runs on the last training run's log ---------------------------------------------------------

def _log_runs(args: argparse.Namespace, kafka: KafkaSettings, run: _Trained,
              bodies: list[bytes], work: Path) -> list[dict[str, Any]]:
    """The ``poisoned`` and ``slow_clients`` rows, from ``run``'s first checkpoint and log."""
    first = ckpt.latest(run.first)
    assert first is not None and first.model is not None
    source, target = first.model.topic, f"{first.model.topic}.poisoned"
    ids = np.unique(Decoder().decode(bodies[0].split(b"\n")).batch.ids)[:8]  # rows we score
    copy = copy_with_poison(kafka, source, target, first.model.offsets, args.poison_every, ids,
                            int(first.extra["row_dim"]))
    print(f"\npoisoned log: {copy.valid:,} valid messages from the first checkpoint (step "
          f"{first.step}) on, {copy.poisoned:,} invalid ones among them ({copy.before:,} "
          f"before it copied as they were), in {target}", flush=True)
    if not copy.poisoned:
        print("  nothing poisoned: the first checkpoint was the last one (a run shorter than "
              "--checkpoint-s) or --poison-every exceeds the messages after it", flush=True)
    port = free_ports(18500, 2)
    timeouts = ("--header-timeout-s", f"{args.header_timeout_s:g}",
                "--body-timeout-s", f"{args.body_timeout_s:g}")
    with ServeProcess(work / "serve-clean.log", run.first, kafka, port, *timeouts) as clean, \
            ServeProcess(work / "serve-poisoned.log", run.first, kafka, port + 1,
                         "--model-topic", target) as poisoned:
        applied_c, rejected_c = wait_settled(clean, run.final.step)
        applied_p, rejected_p = wait_settled(poisoned, run.final.step)
        diff = max(float(np.max(np.abs(np.array(post(clean.url, b)["scores"])
                                       - np.array(post(poisoned.url, b)["scores"]))))
                   for b in bodies)
        poisoned.stop()  # the slow clients get the cores to themselves and the clean serve
        slow = _slow_clients(args, clean, port, bodies)
    expected: dict[str, int] = {}
    for kind, n in copy.by_kind.items():
        expected[expected_reason(kind)] = expected.get(expected_reason(kind), 0) + n
    common = {"publish_interval_s": run.row["publish_interval_s"], "staleness": args.staleness}
    return [
        _row("poisoned", poisoned_messages=copy.poisoned, valid_messages=copy.valid,
             rejected_messages=round(sum(rejected_p.values())),
             rejected_by_reason={k: round(v) for k, v in rejected_p.items() if v},
             expected_by_reason=dict(sorted(expected.items())),
             poisoned_by_kind=copy.by_kind,
             applied_messages={"clean": round(sum(applied_c.values())),
                               "poisoned": round(sum(applied_p.values()))},
             rejected_messages_clean=round(sum(rejected_c.values())),
             max_score_diff_vs_clean=diff, **common),
        _row("slow_clients", **slow, **common)]


def _slow_clients(args: argparse.Namespace, serve: ServeProcess, port: int,
                  bodies: list[bytes]) -> dict[str, Any]:
    """Normal requests alone, then among stalled connections; how many of those were closed."""
    window = min(args.header_timeout_s, args.body_timeout_s)
    head_s, body_s = args.header_timeout_s + 1.0, args.body_timeout_s + LINGER_S + 1.0
    idle = _speed(serve.url, bodies, 1, window)
    with Stalled(port, args.stalled, bodies[0]) as stalled:
        busy = _speed(serve.url, bodies, 1, window)
        stalled.wait_closed(max(head_s, body_s) + 1.0)
        heads, halves = stalled.close_times()
    within = sum(t <= head_s for t in heads) + sum(t <= body_s for t in halves)
    print(f"slow clients: {within} of {2 * args.stalled} stalled connections closed in time; "
          f"normal p99 {idle['p99_ms']:.1f} ms alone, {busy['p99_ms']:.1f} ms among them",
          flush=True)
    slowest = max(heads + halves)
    return {"stalled_connections": 2 * args.stalled, "stalled_closed_within_timeout": within,
            "stalled_close_max_s": _round(slowest, 2),
            "normal_p99_ms_idle": round(idle["p99_ms"], 2),
            "normal_p99_ms_with_stalled": round(busy["p99_ms"], 2),
            "p99_ratio": round(busy["p99_ms"] / idle["p99_ms"], 3),
            "header_timeout_s": args.header_timeout_s, "body_timeout_s": args.body_timeout_s}


def _table(rows: list[dict[str, Any]]) -> str:
    """The rows as a short table: the training figures, and what the other runs found."""
    def f(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [f"{'run':<14} {'fresh p50/p99 s':>16} {'delta/rows B/smp':>17} {'serve rec/s':>11} "
             f"{'p99 ms':>7}  notes"]
    for r in rows:
        if r["run"] == "poisoned":
            note = (f"rejected {r['rejected_messages']} of {r['poisoned_messages']} poisoned "
                    f"among {r['valid_messages']} valid; max score diff "
                    f"{r['max_score_diff_vs_clean']:g}")
        elif r["run"] == "slow_clients":
            note = (f"closed {r['stalled_closed_within_timeout']} of "
                    f"{r['stalled_connections']} stalled in time; normal p99 "
                    f"{r['normal_p99_ms_idle']:.1f} -> {r['normal_p99_ms_with_stalled']:.1f} ms "
                    f"({r['p99_ratio']:.2f}x)")
        else:
            note = (f"{r['samples_per_s']:,}/s trained; forward alone "
                    f"{r['forward_records_per_s']:,} rec/s")
        fresh = f"{f(r['freshness_p50_s'], '.2f')}/{f(r['freshness_p99_s'], '.2f')}"
        delta = (f"{f(r['delta_bytes_per_sample'], '.0f')}/"
                 f"{f(r['updated_row_bytes_per_sample'], '.0f')}")
        lines.append(f"{r['run']:<14} {fresh:>16} {delta:>17} "
                     f"{f(r['serve_records_per_s'], ','):>11} {f(r['serve_p99_ms'], '.1f'):>7}  "
                     f"{note}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
