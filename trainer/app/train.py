"""``hetgmp train``: start N ranks (or join a torchrun job) and train from a source.

Flags come from the config dataclasses (:mod:`trainer.types`, the synthetic stream, Kafka, the
consumer), each with its environment variable. Sources:

* ``--source synthetic``: the synthetic stream in memory; the graph placement is computed from
  the ``--warmup`` records before the training range (not trained on), and the ``--heldout``
  records after it are scored at the end (AUC, log-loss).
* ``--source kafka``: each rank reads its share of the topic's partitions; the graph
  placement comes from the first ``--warmup`` records the ranks read (trained on too); the
  AUC reported is progressive (each sample scored before its update) over the last
  ``--eval-window`` samples, or held out with ``--heldout-after`` (records appended from a
  time on are scored after training and never trained).

SIGINT/SIGTERM stop training after the current step (a second one stops at once). The last
line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import Any

from streaming import ConsumerConfig, KafkaSettings, SyntheticConfig
from streaming.runtime import add_flags, build, directory_problem, stop_on_signals
from trainer.app.jsonout import strict_json
from trainer.counters import ONLINE_KINDS, PHASES
from trainer.types import LaunchConfig, ModelConfig, OnlineConfig, StoreConfig, TrainConfig

__all__ = ["add_train_flags", "run_train"]

log = logging.getLogger("hetgmp.train")



def heldout_time(text: str) -> int:
    """``--heldout-after``: milliseconds since the epoch, or an ISO 8601 time (UTC unless it
    says otherwise)."""
    import datetime as dt

    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected milliseconds since the epoch or an ISO 8601 time such as "
            "2026-12-02T03:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


def add_train_flags(parser: argparse.ArgumentParser, toml: dict[str, Any] | None = None) -> None:
    """Add the flags of ``hetgmp train`` to ``parser`` (TOML tables give defaults)."""
    add_flags(parser.add_argument_group("launch", "ranks and devices"), LaunchConfig, "launch",
              toml=toml)
    add_flags(parser.add_argument_group("train", "training loop"), TrainConfig, "train",
              toml=toml)
    add_flags(parser.add_argument_group(
        "online", "repartitioning on the stream, live migration, checkpoints"), OnlineConfig,
        "online", toml=toml)
    add_flags(parser.add_argument_group("model", "CTR model"), ModelConfig, "model", toml=toml,
              skip=("seed",))
    add_flags(parser.add_argument_group("store", "embedding store"), StoreConfig, "store",
              prefix="store", toml=toml, skip=("seed",))
    src = parser.add_argument_group("source", "where samples come from")
    src.add_argument("--source", choices=["synthetic", "kafka"], default="synthetic",
                     help="in-memory synthetic stream, or a Kafka topic")
    src.add_argument("--records", type=int, default=200_000,
                     help="records this run trains on, over all ranks (kafka: 0 = until the "
                          "topic stays idle; --max-records counts over resumed runs too)")
    src.add_argument("--heldout", type=int, default=20_000,
                     help="synthetic: records after the training range scored at the end")
    src.add_argument("--heldout-after", type=heldout_time, default=None, metavar="TIME",
                     help="kafka: records appended at or after TIME (ms since the epoch, or ISO "
                          "8601) are held out: scored after training, never trained")
    src.add_argument("--eval-window", type=int, default=20_000, metavar="N",
                     help="the progressive AUC and log-loss cover the last N samples trained, "
                          "each scored before its update")
    src.add_argument("--idle-s", type=float, default=10.0,
                     help="kafka: a rank's source ends after this long without records")
    src.add_argument("--prefetch-records", type=int, default=65536,
                     help="kafka: decoded records a rank's fetch thread keeps ready ahead of "
                          "training (polling stops there, so memory stays bounded when training "
                          "is slower than the stream); 0 polls on the training thread")
    src.add_argument("--order", choices=["event-time", "fetched"], default="event-time",
                     help="kafka: the order a rank hands out its partitions' records: by append "
                          "time (a partition behind its log holds younger records back until it "
                          "sends) or as the client fetched them")
    src.add_argument("--max-skew", type=float, default=0.0, metavar="SECONDS",
                     help="kafka, --order event-time: records up to this much younger than a "
                          "lagging partition's newest one go out without waiting for it (0: "
                          "strict order)")
    src.add_argument("--fill-wait", type=float, default=1.0, metavar="SECONDS",
                     help="kafka: how long a step waits for a whole batch while the broker holds "
                          "enough unread records for one (a replay: batches then do not depend "
                          "on fetch timing); near the end of the log a rank trains what it has")
    src.add_argument("--passes", type=int, default=1, metavar="K",
                     help="kafka: read the topic K times, each pass from the first record the "
                          "first pass read to where it went idle, in order (not with "
                          "--checkpoint-dir: a checkpoint's offsets cannot say which pass)")
    src.add_argument("--reset-offsets", choices=["checkpoint", "earliest", "latest"],
                     default="checkpoint",
                     help="kafka, with --resume: where each partition goes on: the "
                          "checkpoint's offsets, or (after the broker lost its log, which "
                          "stops a run with an error saying so) the first or the next record "
                          "of the log as it is now")
    src.add_argument("--seed", type=int, default=0,
                     help="seed of the model, the initial rows and the partitioner")
    met = parser.add_argument_group("metrics", "Prometheus exposition")
    met.add_argument("--metrics-port", type=int, default=0,
                     help="rank r serves /metrics on this port + r (0: off)")
    met.add_argument("--metrics-host", default="127.0.0.1",
                     help="address the metrics are served on (0.0.0.0 for every interface)")
    met.add_argument("--metrics-linger-s", type=float, default=0.0,
                     help="keep serving metrics this long after the run ends, so that the last "
                          "scrape of a bounded run sees its final figures")
    add_flags(parser.add_argument_group("synthetic stream", "shape of --source synthetic"),
              SyntheticConfig, "synthetic", prefix="synthetic", toml=toml)
    add_flags(parser.add_argument_group("kafka", "how to reach the cluster"), KafkaSettings,
              "kafka", toml=toml)
    add_flags(parser.add_argument_group("consumer", "Kafka consumer of --source kafka"),
              ConsumerConfig, "consumer", prefix="consumer", toml=toml)


def _job(args: argparse.Namespace) -> tuple[Any, LaunchConfig]:
    from trainer.dist import job_ranks
    from trainer.job import Job
    from trainer.metrics import check_metrics_port
    from trainer.sources import KafkaSpec, SyntheticSpec

    launch = build(LaunchConfig, args)
    train = build(TrainConfig, args)
    online = build(OnlineConfig, args)
    model = build(ModelConfig, args, seed=args.seed)
    store = build(StoreConfig, args, "store", seed=args.seed)
    if args.eval_window < 1:
        raise ValueError(f"--eval-window {args.eval_window}: must be >= 1")
    _check_paths(online)
    common = dict(progressive=args.eval_window, seed=args.seed, online=online,
                  metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                  metrics_linger_s=args.metrics_linger_s)
    # Graph placement is computed online (cold start from hash) unless repartitioning is off:
    # then once, from a warm-up window, and never again (HET-GMP's static placement).
    static = train.placement in ("graph", "auto") and not online.repartition.enabled
    if train.placement == "auto" and static:
        log.warning("--placement auto decides once a repartition interval, and "
                    "--repartition-interval is 0: the graph placement is computed once from "
                    "--warmup records, as --placement graph would (give an interval for auto)")
    check_metrics_port(args.metrics_port, job_ranks(launch), zero="off")
    if args.source == "synthetic":
        if args.records < 1:
            raise ValueError(f"--records {args.records}: the synthetic source needs at least "
                             f"one record (0, 'until idle', is for --source kafka)")
        if args.heldout_after is not None:
            raise ValueError("--heldout-after is for --source kafka (the synthetic source holds "
                             "out --heldout records after its training range)")
        if args.heldout < 0:
            raise ValueError(f"--heldout {args.heldout}: must be >= 0 (0: no held-out score)")
        _check_resumed_range(online, args.records, args.heldout)
        syn = build(SyntheticConfig, args, "synthetic")
        w = train.warmup if static else 0
        job = Job(SyntheticSpec(syn, w, args.records), model, store, train,
                  window=SyntheticSpec(syn, 0, w) if w else None,
                  heldout=SyntheticSpec(syn, w + args.records, args.heldout)
                  if args.heldout else None, **common)
    else:
        # --records is this run's budget over all ranks, shared out as --max-records is (a
        # rank whose partitions run dry leaves its share to the others).
        if args.records < 0:
            raise ValueError(f"a Kafka source needs records >= 0 (0: until idle), got "
                             f"{args.records}")
        if args.passes > 1 and online.checkpoint_dir:
            raise ValueError("--passes with --checkpoint-dir: a checkpoint's offsets cannot say "
                             "which pass they are in; checkpoint single-pass runs")
        spec = KafkaSpec(build(KafkaSettings, args), build(ConsumerConfig, args, "consumer"),
                         idle_s=args.idle_s,
                         reset_offsets=args.reset_offsets,
                         prefetch_records=args.prefetch_records, order=args.order,
                         max_skew_s=args.max_skew, fill_wait_s=args.fill_wait,
                         passes=args.passes)
        job = Job(spec, model, store, train, heldout_after_ms=args.heldout_after,
                  run_records=args.records, **common)
    return job, launch


def _check_paths(online: OnlineConfig) -> None:
    """Refuse, before any rank starts, paths the run could not use (one line, not the
    traceback of a rank that tried)."""
    from trainer.serving import load_signer

    if online.checkpoint_dir:
        problem = directory_problem("--checkpoint-dir", online.checkpoint_dir)
        if problem:
            raise ValueError(problem)
    try:
        load_signer(online.delta_key_file)
    except ValueError as exc:
        raise ValueError(f"--delta-key-file: {exc}") from None


def _check_resumed_range(online: OnlineConfig, records: int, heldout: int) -> None:
    """A synthetic run resumed with fewer ``--records`` than its checkpoint trained would
    score records it trained as held out (they follow the asked range): refuse before start."""
    if not (online.resume and online.checkpoint_dir and heldout):
        return
    from trainer.checkpoint import latest

    manifest = latest(online.checkpoint_dir, verify=False)
    if manifest is not None and manifest.records > records:
        raise ValueError(f"--resume: the checkpoint in {online.checkpoint_dir} trained "
                         f"{manifest.records} records of the synthetic range and --records "
                         f"asks for {records}: the --heldout records after that range were "
                         f"trained on. Give --records {manifest.records} or more (or "
                         f"--heldout 0)")


def _summary(result: Any, args: argparse.Namespace, device: str) -> dict[str, Any]:
    totals = result.job_totals.summary()
    jt = result.job_totals
    migrations = [e for e in result.online.get("events", []) if e.get("event") == "migration_done"]
    steps_before = result.resumed_from or 0
    out: dict[str, Any] = {
        "command": "train",
        "source": args.source,
        "workers": result.world,
        "device": device,
        # This run's; the *_total figures count the runs it resumed too.
        "steps": result.steps - steps_before,
        "steps_total": result.steps,
        "seconds": round(result.seconds, 3),
        "training_seconds": round(result.training_seconds, 3),
        "idle_seconds": round(result.idle_seconds, 3),
        "samples": totals["samples_trained"],
        "samples_total": totals["samples_trained"] + result.resumed_records,
        "samples_per_s": round(result.samples_per_s, 1),
        "mean_loss": round(float(totals["mean_loss"]), 5),
        "heldout_auc": result.heldout_auc,
        "heldout_logloss": result.heldout_logloss,
        "heldout": (f"{result.heldout_records} records appended at or after "
                    f"{args.heldout_after} ms" if args.heldout_after is not None
                    else f"{args.heldout} records after the training range"
                    if args.source == "synthetic" and args.heldout else None),
        "heldout_records": (result.heldout_records if args.heldout_after is not None
                            else args.heldout if args.source == "synthetic" else 0),
        "progressive_auc": result.progressive_auc,
        "progressive_logloss": result.progressive_logloss,
        "eval_window": args.eval_window,
        "placement": result.placement,
        "placements_moved_to": result.online.get("placements", 0),
        # --placement auto: where it ended and every decision, with the costs it compared.
        "placement_auto": result.online.get("placement_auto"),
        "migrations": len(migrations),
        "rows_migrated": int(sum(e.get("rows_moved", 0) for e in migrations)),
        # Everything the ranks sent (embedding path, dense all-reduce, the loop's own window,
        # placement, migration and control traffic), per sample trained.
        "bytes_per_sample_all": round(jt.per_sample(float(sum(result.sent_by_kind.values()))), 1),
        "loop_bytes_per_sample": round(jt.per_sample(float(sum(
            result.sent_by_kind.get(k, 0) for k in ONLINE_KINDS))), 1),
        "freshness_p50_s": result.online.get("freshness_p50_s"),
        "freshness_p99_s": result.online.get("freshness_p99_s"),
        "resumed_from_step": result.resumed_from,
        # Kafka: records handed out of event-time order because a rank's order buffer was
        # full (0 keeps the promise), and the source's other counts.
        "event_time_order": result.source or None,
        # Host wall time by phase, each the longest of any rank's (on CUDA a phase also waits
        # for the GPU work queued before it whenever it copies to the host).
        "seconds_by_phase": {phase: round(float(v), 3)
                             for phase, v in zip(PHASES, result.job_totals.seconds)},
    }
    out.update({k: totals[k] for k in (
        "bytes_per_sample", "dense_bytes_per_sample", "remote_rows_per_sample", "remote_rows",
        "replica_reads", "replica_refreshes", "replica_pushes", "staleness_histogram",
        "max_staleness", "embedding_bytes", "dense_bytes")})
    return out


def run_train(args: argparse.Namespace) -> int:
    """``hetgmp train`` from its parsed flags: 0 trained, 1 a rank failed, 2 refused settings."""
    from streaming import ConsumerFailed, TopicNotFound
    from trainer.checkpoint import CheckpointError
    from trainer.dist import (
        PeerLost,
        WorkerFailed,
        job_device,
        launch,
        run_torchrun,
        stop_event,
        under_torchrun,
    )
    from trainer.online import Diverged
    from trainer.run import run_rank

    try:
        job, launch_config = _job(args)
        launch_config = replace(launch_config, device=job_device(launch_config))
        _check_machine(job, launch_config)
    except ValueError as exc:
        print(f"hetgmp train: error: {exc}", file=sys.stderr)
        return 2
    try:
        with stop_on_signals(stop_event()) as stop:
            if under_torchrun():
                result = run_torchrun(run_rank, job, launch_config, stop)
                if result.rank != 0:
                    return 0
            else:
                log.info("starting %d rank(s) on %s", launch_config.workers,
                         launch_config.device)
                result = launch(run_rank, job, launch_config, stop)[0]
    except WorkerFailed as exc:
        log.debug("rank %d: %s", exc.rank, exc.detail)
        print(f"error: rank {exc.rank} failed: {exc.summary}", file=sys.stderr)
        return 1
    except (ConsumerFailed, CheckpointError, Diverged, PeerLost, TopicNotFound) as exc:
        # A torchrun rank's own failure (launch() turns a child's into WorkerFailed).
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    summary = _summary(result, args, launch_config.device)
    auc = summary["heldout_auc"] if summary["heldout_auc"] is not None else summary[
        "progressive_auc"]
    auc_of = ("held-out" if summary["heldout_auc"] is not None
              else f"progressive, last {summary['eval_window']:,} samples")
    print(f"trained {summary['samples']:,} samples in {summary['steps']} steps on "
          f"{summary['workers']} rank(s): {summary['samples_per_s']:,.0f} samples/s over "
          f"{summary['training_seconds']:.1f} s of training (+{summary['idle_seconds']:.1f} s "
          f"idle), loss {summary['mean_loss']:.4f}, "
          f"AUC {auc if auc is None else round(auc, 4)} ({auc_of}), "
          f"{summary['bytes_per_sample']:,.0f} embedding bytes/sample "
          f"({summary['bytes_per_sample_all']:,.0f} with the dense all-reduce and the loop's), "
          f"{summary['remote_rows_per_sample']:.3f} remote rows/sample, "
          f"max staleness {summary['max_staleness']}", flush=True)
    print(json.dumps(strict_json(summary), allow_nan=False), flush=True)
    return 0


def _check_machine(job: Any, launch_config: LaunchConfig) -> None:
    """Refuse ranks, threads or a model this machine cannot hold (before any rank starts)."""
    from streaming import Schema
    from trainer.dist import check_resources, job_ranks, under_torchrun
    from trainer.sources import SyntheticSpec

    schema = (job.source.config.schema if isinstance(job.source, SyntheticSpec)
              else Schema.parse(job.source.consumer.schema))
    world = job_ranks(launch_config)
    here = 1 if under_torchrun() else launch_config.workers
    check_resources(launch_config, job.model, job.train, ranks_here=here, world=world,
                    n_fields=len(schema.sparse), n_dense=len(schema.dense),
                    device=launch_config.device)
