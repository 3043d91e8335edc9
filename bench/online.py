"""Online benchmark: static placement (HET-GMP: partitioned once) against online repartitioning.

Protocol (one run; both modes see the same stream at the same rate):

* An embedded broker (Tansu) is started. For each mode a producer writes the drifting synthetic
  stream (``SyntheticStream``, ``--drift-every`` records between drifts, ``--seed``) to a fresh
  topic of ``--partitions`` partitions at ``--rate`` records/s while ``--workers`` ranks train
  from it (each rank reads its share of the partitions), until ``--records`` records.
* ``hash``: hash placement throughout (no window, no partitioner, nothing migrated): the
  baseline every placement has to pay for itself against.
* ``static``: the ranks read the first ``--warmup`` records, rank 0 partitions their access
  graph (METIS plus replicas) while training waits, and the placement never changes again.
  ``online``: training starts at once on the hash placement; after ``--warmup`` records a full
  partition is computed beside training, then every ``--interval`` records (and earlier on
  drift) the incremental partitioner repairs it and rows migrate live in chunks of at most
  ``--chunk-bytes``. ``auto``: ``--placement auto``, online repartitioning where graph
  measurably sends fewer bytes per sample than hash, hash (no window, no routing) where not.
* Per step and rank the loop records the rows not held (fetches plus replica refreshes), the
  samples, the bytes sent and the step's wall time (control, window, migration chunk and the
  step itself; checkpoints excluded), and whether a migration was in progress. The job's step
  time is the slowest rank's. Remote rows per sample after drift: steps from the first drift
  (record ``--drift-every``) on. Bytes per sample: the training path (as ``bench train``); the
  online loop's own traffic (control, window, placement, rows migrated) is printed apart, and
  ``bytes_per_sample_all`` counts everything every rank sent (embedding path, dense
  all-reduce, the loop's traffic) per sample trained, and ``placed_bytes_per_sample`` what a
  placement changes (embedding path, window, placement, migration: the dense all-reduce and the
  control round cost a step the same under any placement, and their bytes per sample move with
  how full the steps were, which depends on timing here). ``--small-vocab`` runs it all on a stream
  of 26 fields of 10-1,000 values, where a graph placement has little to save.
  Freshness: a record's producer timestamp to the end of the step that applied its gradient,
  over the records appended after the ranks started training (records appended while the
  ranks were starting are a backlog, counted apart).

The last line printed is the JSON summary ``{"bench": "online", "rows": [...]}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import threading
import time
from typing import Any

import numpy as np

from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, ProduceReport, produce
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import EMBEDDING_KINDS, ONLINE_KINDS, LaunchConfig
from hetgmp.trainer.dist.launcher import launch, resolve_device
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, RankResult, run_rank
from hetgmp.trainer.sources import KafkaSpec
from hetgmp.trainer.step import TrainConfig

__all__ = ["build_parser", "main", "parse_args", "job_series"]

log = logging.getLogger("hetgmp.bench.online")

PLACED_KINDS = (*EMBEDDING_KINDS, "window", "placement", "migrate")


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(
        prog="hetgmp bench online",
        description="Static placement against online repartitioning on a drifting stream "
                    "through the embedded broker: remote rows and bytes per sample, rows "
                    "migrated, step time during and outside migrations, freshness.")
    p.add_argument("--records", type=int, default=300_000, help="records trained per mode")
    p.add_argument("--rate", type=float, default=6000.0, help="producer records/s")
    p.add_argument("--drift-every", type=int, default=60_000, help="records between drifts")
    p.add_argument("--warmup", type=int, default=30_000,
                   help="records before the first placement (both modes)")
    p.add_argument("--interval", type=int, default=20_000,
                   help="online: records between repartitions")
    p.add_argument("--drift-threshold", type=float, default=0.25,
                   help="online: repartition early on this rise of remote rows per sample")
    p.add_argument("--window", type=int, default=120_000, help="online: window samples")
    p.add_argument("--window-sample", type=float, default=1.0,
                   help="online: fraction of the samples sent to rank 0's window")
    p.add_argument("--chunk-bytes", type=int, default=256 << 10,
                   help="online: most bytes of rows a migration moves between two steps")
    p.add_argument("--workers", type=int, default=2, help="ranks")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the ranks train: cpu (gloo) or cuda (NCCL, a GPU a rank)")
    p.add_argument("--partitions", type=int, default=4, help="topic partitions")
    p.add_argument("--global-batch", type=int, default=2048, help="samples per step")
    p.add_argument("--embed-dim", type=int, default=16, help="embedding dimension")
    p.add_argument("--staleness", type=int, default=10, help="replica staleness bound s")
    p.add_argument("--replica-fraction", type=float, default=0.01, help="replica budget")
    p.add_argument("--replica-basis", choices=["touched", "window"], default="touched",
                   help="what the budget counts: the rows a rank uses (this benchmark's figures "
                        "so far) or all the window's rows (the trainer's default)")
    p.add_argument("--seed", type=int, default=0, help="stream, model and partitioner seed")
    p.add_argument("--modes", default="hash,static,online,auto",
                   help="modes to run, in order (hash, static, online, auto)")
    p.add_argument("--small-vocab", action="store_true",
                   help="a stream of 26 fields of 10-1,000 values (small vocabularies)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 90k records, drift every 30k, at 5k records/s")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.drift_every, args.warmup, args.interval = 90_000, 30_000, 10_000, 10_000
        args.window, args.rate = 40_000, 5000.0
    try:  # refuse now, not once the broker and the producer run
        resolve_device(args.device, args.workers)
    except ValueError as exc:
        p.error(str(exc))
    return args


def _job(args: argparse.Namespace, kafka: KafkaSettings, topic: str, mode: str) -> Job:
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=f"{topic}-trainer"),
                     idle_s=30.0, poll_s=0.05)
    train = TrainConfig(staleness=args.staleness, global_batch=args.global_batch,
                        placement="hash" if mode == "hash" else "auto" if mode == "auto"
                        else "graph",
                        warmup=args.warmup,
                        replica_fraction=args.replica_fraction,
                        replica_basis=args.replica_basis, log_every=0)
    online = OnlineConfig(
        repartition_interval=str(args.interval) if mode in ("online", "auto") else "0",
        drift_threshold=args.drift_threshold if mode in ("online", "auto") else 0.0,
        window=args.window, window_sample=args.window_sample,
        migration_chunk_bytes=args.chunk_bytes, max_records=args.records)
    model = ModelConfig(model="deepfm", embed_dim=args.embed_dim, hidden=(64, 32),
                        seed=args.seed)
    return Job(spec, model, StoreConfig(seed=args.seed), train, online=online, seed=args.seed)


def job_series(results: list[RankResult]) -> dict[str, np.ndarray]:
    """Per-step job-level series from every rank's history (steps aligned by index)."""
    fields = results[0].online["history_fields"]
    per_rank = [np.array(r.online["history"], dtype=np.float64).reshape(-1, len(fields))
                for r in results]
    n = min(h.shape[0] for h in per_rank)
    col = {f: i for i, f in enumerate(fields)}
    stack = np.stack([h[:n] for h in per_rank])  # [ranks, steps, fields]
    return {
        "step": stack[0, :, col["step"]],
        "records": stack[0, :, col["records"]],
        "rows_not_held": stack[:, :, col["rows_not_held"]].sum(0),
        "samples": stack[:, :, col["samples"]].sum(0),
        "bytes": stack[:, :, col["bytes_sent"]].sum(0),
        "seconds": stack[:, :, col["seconds"]].max(0),
        "migrating": stack[:, :, col["migrating"]].max(0) > 0,
        "version": stack[0, :, col["version"]],
    }


def _run_mode(args: argparse.Namespace, broker: EmbeddedBroker, mode: str) -> dict[str, Any]:
    kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="hetgmp-bench")
    topic = f"bench-online-{mode}-{int(time.time())}"
    syn = SyntheticConfig(seed=args.seed, drift_every=args.drift_every)
    if args.small_vocab:
        syn = dataclasses.replace(syn, vocab_min=10, vocab_max=1000)
    config = ProduceConfig(topic=topic, count=args.records, rate=args.rate,
                           partitions=args.partitions)
    # The topic must exist before the ranks look up its partitions.
    from hetgmp.streaming.kafka import ensure_topic

    ensure_topic(kafka, topic, args.partitions)
    report = ProduceReport()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            produce(kafka, config, syn, report=report)
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    thread = threading.Thread(target=producer, name="bench-producer", daemon=True)
    thread.start()
    t0 = time.monotonic()
    results = launch(run_rank, _job(args, kafka, topic, mode),
                     LaunchConfig(workers=args.workers, device=args.device, timeout_s=300))
    wall = time.monotonic() - t0
    thread.join(timeout=60)
    if errors:
        raise RuntimeError(f"producer failed: {errors[0]}")
    return _summarise(args, mode, results, wall, report)


def _summarise(args: argparse.Namespace, mode: str, results: list[RankResult], wall: float,
               report: ProduceReport) -> dict[str, Any]:
    s = job_series(results)
    after = s["records"] >= args.drift_every
    per = lambda rows, samples: float(rows.sum() / max(samples.sum(), 1))  # noqa: E731
    totals = results[0].job_totals
    events = results[0].online["events"]
    done = [e for e in events if e["event"] == "migration_done"]
    placements = [e for e in events if e["event"] == "placement"]
    fresh_p99 = max(r.online["freshness_p99_s"] for r in results)
    fresh_p50 = float(np.median([r.online["freshness_p50_s"] for r in results]))
    online_bytes = sum(results[0].sent_by_kind.get(k, 0) for k in ONLINE_KINDS)
    outside, during = s["seconds"][~s["migrating"]], s["seconds"][s["migrating"]]
    pct = lambda a, q: round(float(np.percentile(a, q)) * 1000, 2) if a.size else None  # noqa: E731
    row = {
        "mode": mode,
        "records": int(totals.samples),
        "steps": int(s["step"].size),
        # Over training time: steps in which no rank trained (waiting for records) left out.
        "samples_per_s": round(results[0].samples_per_s, 1),
        "producer_records_per_s": round(report.records / max(wall, 1e-9), 1),
        "remote_rows_per_sample": round(per(s["rows_not_held"], s["samples"]), 4),
        "remote_rows_per_sample_after_drift": round(
            per(s["rows_not_held"][after], s["samples"][after]), 4),
        "bytes_per_sample": round(totals.per_sample(totals.embedding_bytes), 1),
        "online_bytes_per_sample": round(online_bytes / max(totals.samples, 1), 1),
        "online_bytes_per_sample_by_kind": {
            k: round(results[0].sent_by_kind.get(k, 0) / max(totals.samples, 1), 1)
            for k in ONLINE_KINDS},
        "dense_bytes_per_sample": round(totals.per_sample(totals.dense_bytes), 1),
        "bytes_per_sample_all": round(
            sum(results[0].sent_by_kind.values()) / max(totals.samples, 1), 1),
        # What a placement changes: the embedding path and the loop's window, placement and
        # migration traffic (not the dense all-reduce or the control round, whose bytes per
        # sample depend on how full the steps were, which here depends on timing).
        "placed_bytes_per_sample": round(sum(
            results[0].sent_by_kind.get(k, 0) for k in PLACED_KINDS) / max(totals.samples, 1), 1),
        "placements": len(placements),
        "auto_decisions": [e["decision"] for e in events if e["event"] == "placement_auto"],
        "rows_migrated": int(sum(e["rows_moved"] for e in done)),
        "bytes_migrated": int(sum(e["bytes"] for e in done)),
        "repartition_seconds": round(sum(e["seconds"] for e in placements), 3),
        "step_p50_ms_outside_migration": pct(outside, 50),
        "step_p99_ms_outside_migration": pct(outside, 99),
        "step_p50_ms_during_migration": pct(during, 50),
        "step_p99_ms_during_migration": pct(during, 99),
        "steps_during_migration": int(during.size),
        # Samples a step trained (job-wide), median: a live stream's steps fill to what has
        # arrived, so steps after a pause (a partition's CPU) are fuller and longer.
        "step_samples_p50_outside_migration": float(np.median(s["samples"][~s["migrating"]]))
        if outside.size else None,
        "step_samples_p50_during_migration": float(np.median(s["samples"][s["migrating"]]))
        if during.size else None,
        "freshness_p50_s": round(fresh_p50, 3),
        "freshness_p99_s": round(fresh_p99, 3),
        "freshness_backlog_records": int(sum(r.online["freshness_backlog"] for r in results)),
    }
    _print_timeline(args, mode, s, events)
    for e in done:
        print(f"  [{mode}] migration to v{e['version']} at record {e['records']:,}: "
              f"{e['rows_moved']:,} rows, {e['bytes'] / 1e6:.2f} MB in {e['seconds']:.2f} s")
    return row


def _print_timeline(args: argparse.Namespace, mode: str, s: dict[str, np.ndarray],
                    events: list[dict[str, Any]]) -> None:
    period = max(args.drift_every // 4, 1)
    bucket = (s["records"] // period).astype(np.int64)
    print(f"[{mode}] per {period:,} records: remote rows/sample, bytes/sample (training path), "
          f"step p50 ms, placement version, migrating steps")
    for b in np.unique(bucket):
        m = bucket == b
        drift = " <- drift" if (b * period) % args.drift_every == 0 and b > 0 else ""
        print(f"  {int(b * period):>9,}  {s['rows_not_held'][m].sum() / max(s['samples'][m].sum(), 1):6.3f}"
              f"  {s['bytes'][m].sum() / max(s['samples'][m].sum(), 1):8.1f}"
              f"  {np.median(s['seconds'][m]) * 1000:7.1f}  v{int(s['version'][m].max())}"
              f"  {int(s['migrating'][m].sum()):3d}{drift}")
    for e in events:
        if e["event"] in ("drift", "placement"):
            what = (f"drift detected ({e['level']:.3f} vs {e['baseline']:.3f})"
                    if e["event"] == "drift" else f"placement v{e['version']} ({e['kind']}, "
                    f"{e['seconds']:.2f} s)")
            print(f"  [{mode}] record {e['records']:,}: {what}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures and JSON summary."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"bench online: {args.records:,} records per mode at {args.rate:,.0f}/s, drift every "
          f"{args.drift_every:,}, {args.workers} ranks on {args.device}, batch {args.global_batch}, dim "
          f"{args.embed_dim}, s = {args.staleness}, replicas {args.replica_fraction:.0%}",
          flush=True)
    rows = []
    with EmbeddedBroker() as broker:
        for mode in modes:
            t0 = time.monotonic()
            row = _run_mode(args, broker, mode)
            rows.append(row)
            print(f"[{mode}] done in {time.monotonic() - t0:.0f} s: "
                  + ", ".join(f"{k} {v}" for k, v in row.items() if k != "mode"), flush=True)
    by = {r["mode"]: r for r in rows}
    ratios: dict[str, Any] = {}
    if "hash" in by:
        base = by["hash"]["bytes_per_sample_all"]
        for mode in ("static", "online", "auto"):
            if mode in by:
                ratios[f"{mode}_bytes_all_over_hash"] = round(
                    by[mode]["bytes_per_sample_all"] / max(base, 1e-9), 3)
                print(f"{mode} vs hash, everything sent per sample: "
                      f"{by[mode]['bytes_per_sample_all']:,.0f} / {base:,.0f} bytes = "
                      f"{ratios[f'{mode}_bytes_all_over_hash']:.2f}x; samples/s "
                      f"{by[mode]['samples_per_s']:,.0f} / {by['hash']['samples_per_s']:,.0f}")
    if "auto" in by and "hash" in by and "online" in by:
        for key, what in (("bytes_per_sample_all", "everything sent"),
                          ("placed_bytes_per_sample", "what a placement changes")):
            best = min(by["hash"][key], by["online"][key])
            name = f"auto_{key.replace('_per_sample', '')}_over_best"
            ratios[name] = round(by["auto"][key] / max(best, 1e-9), 3)
            print(f"auto vs the better of hash and online, {what} per sample: "
                  f"{by['auto'][key]:,.0f} / {best:,.0f} bytes = {ratios[name]:.2f}x "
                  f"(target <= 1.05)")
        print(f"auto decisions: {', '.join(by['auto']['auto_decisions']) or 'none'}")
    if "static" in by and "online" in by:
        st, on = by["static"], by["online"]
        ratios["remote_rows_after_drift_reduction"] = round(
            1 - on["remote_rows_per_sample_after_drift"]
            / max(st["remote_rows_per_sample_after_drift"], 1e-9), 4)
        print(f"online vs static after the first drift: "
              f"{ratios['remote_rows_after_drift_reduction']:.1%} fewer remote rows per sample "
              f"(target >= 30%)")
    if "online" in by:
        on = by["online"]
        if on["step_p99_ms_during_migration"] and on["step_p99_ms_outside_migration"]:
            ratios["step_p99_during_over_outside"] = round(
                on["step_p99_ms_during_migration"] / on["step_p99_ms_outside_migration"], 3)
            print(f"online step p99 during migration / outside: "
                  f"{ratios['step_p99_during_over_outside']:.2f} (target <= 1.25)")
        elif on["placements"] and on["steps_during_migration"] == 0:
            # Chunks move between two steps: when the ranks wait for records, every chunk can
            # fall between steps that train nothing, and no trained step overlaps a migration.
            print("online step p99 during migration: not measured, no trained step overlapped a "
                  "migration (the ranks outpaced the producer and moved every chunk while "
                  "waiting for records; a higher --rate measures it)")
        print(f"online freshness p99: {on['freshness_p99_s']:.2f} s at "
              f"{on['producer_records_per_s']:,.0f} records/s produced, "
              f"{on['samples_per_s']:,.0f} trained (target <= 2 s)")
    print(json.dumps({"bench": "online", "device": args.device,
                      "stream": "small_vocab" if args.small_vocab else "default",
                      "rows": rows, "ratios": ratios}),
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
