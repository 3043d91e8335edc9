"""``hetgmp train``: start N ranks (or join a torchrun job) and train from a source.

Flags come from the config dataclasses (next to each part they configure, the synthetic stream, Kafka, the
consumer), each with its environment variable. Sources:

* ``--source synthetic``: the synthetic stream in memory; the graph placement is computed from
  the ``--warmup`` records before the training range (not trained on), and the ``--heldout``
  records after it are scored at the end (AUC, log-loss).
* ``--source kafka``: each rank reads its share of the topic's partitions; the graph
  placement comes from the first ``--warmup`` records the ranks read (trained on too); the
  AUC reported is progressive (each sample scored before its update) over the last
  ``--eval-window`` samples, or held out with ``--heldout-after`` (records appended from a
  time on are scored after training and never trained). With ``--passes`` the progressive
  AUC scores records trained in an earlier pass: the summary says it is in-sample.

The source and metrics flags, like the others, come from dataclasses (here, as they configure
this command rather than one component), so each shows its default and environment variable.

SIGINT/SIGTERM stop training after the current step (a second one stops at once). The last
line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hetgmp.runtime import add_flags, build, directory_problem, stop_on_signals
from hetgmp.streaming import ConsumerConfig, KafkaSettings, SyntheticConfig
from hetgmp.trainer.app.jsonout import strict_json
from hetgmp.trainer.dist import ONLINE_KINDS, PHASES, LaunchConfig
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.step import TrainConfig

__all__ = ["add_train_flags", "auc_phrase", "run_train"]

log = logging.getLogger("hetgmp.train")

# --records when unset, by source: the synthetic stream needs a length; a Kafka run reads until
# its topic stays idle (a default of 200,000 there cut longer replays short without a word).
_RECORDS_BY_SOURCE = {"synthetic": 200_000, "kafka": 0}
# Exit status of a run stopped by a signal before it could train (the shell's for Ctrl-C).
_STOPPED = 130


@dataclass(frozen=True)
class _SourceFlags:
    """Where the samples of ``hetgmp train`` come from and how they are scored (the flags of
    its ``source`` group; ``[source]`` in a ``--config`` file)."""

    source: Literal["synthetic", "kafka"] = field(
        default="synthetic", metadata={"help": "in-memory synthetic stream, or a Kafka topic"})
    records: int | None = field(default=None, metadata={
        "help": "records this run trains on, over all ranks; unset: "
                f"{_RECORDS_BY_SOURCE['synthetic']} for --source synthetic, "
                f"{_RECORDS_BY_SOURCE['kafka']} for --source kafka (0 = until the topic "
                "stays idle; --max-records counts over resumed runs too)"})
    heldout: int = field(default=20_000, metadata={
        "help": "synthetic: records after the training range scored at the end"})
    heldout_after: str | None = field(default=None, metadata={
        "help": "kafka: records appended at or after this time (ms since the epoch, or ISO "
                "8601 such as 2026-12-02T03:00:00Z) are held out: scored after training, "
                "never trained (unset: none)"})
    eval_window: int = field(default=20_000, metadata={
        "help": "the progressive AUC and log-loss cover this many of the last samples "
                "trained, each scored before its update"})
    idle_s: float = field(default=10.0, metadata={
        "help": "kafka: a rank's source ends after this long without records"})
    prefetch_records: int = field(default=65536, metadata={
        "help": "kafka: decoded records a rank's fetch thread keeps ready ahead of training "
                "(polling stops there, so memory stays bounded when training is slower than "
                "the stream); 0 polls on the training thread"})
    order: Literal["event-time", "fetched"] = field(default="event-time", metadata={
        "help": "kafka: the order a rank hands out its partitions' records: by append time (a "
                "partition behind its log holds younger records back until it sends) or as "
                "the client fetched them"})
    max_skew: float = field(default=0.0, metadata={
        "help": "kafka, --order event-time: records up to this many seconds younger than a "
                "lagging partition's newest one go out without waiting for it (0: strict "
                "order)"})
    fill_wait: float = field(default=1.0, metadata={
        "help": "kafka: seconds a step waits for a whole batch while the broker holds enough "
                "unread records for one (a replay: batches then do not depend on fetch "
                "timing); near the end of the log a rank trains what it has"})
    passes: int = field(default=1, metadata={
        "help": "kafka: read the topic this many times, each pass from the first record the first "
                "pass read to where it went idle, in order (not with --checkpoint-dir: a "
                "checkpoint's offsets cannot say which pass); the progressive AUC is then "
                "in-sample"})
    reset_offsets: Literal["checkpoint", "earliest", "latest"] = field(
        default="checkpoint", metadata={
            "help": "kafka, with --resume: where each partition goes on: the checkpoint's "
                    "offsets, or (after the broker lost its log, which stops a run with an "
                    "error saying so) the first or the next record of the log as it is now"})
    seed: int = field(default=0, metadata={
        "help": "seed of the model, the initial rows and the partitioner"})


@dataclass(frozen=True)
class _MetricsFlags:
    """Prometheus exposition of the ranks (``--metrics-*``; ``[metrics]`` in a config file)."""

    port: int = field(default=0, metadata={
        "help": "rank r serves /metrics on this port + r (0: off)"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address the metrics are served on (0.0.0.0 for every interface)"})
    linger_s: float = field(default=0.0, metadata={
        "help": "keep serving metrics this long after the run ends, so that the last scrape "
                "of a bounded run sees its final figures"})


def heldout_time(text: str) -> int:
    """``--heldout-after``: milliseconds since the epoch, or an ISO 8601 time (UTC unless it
    says otherwise).

    Raises:
        ValueError: neither (a usage error of ``hetgmp train``).
    """
    import datetime as dt

    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--heldout-after {text!r}: expected milliseconds since the epoch or an ISO 8601 "
            "time such as 2026-12-02T03:00:00Z") from None
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
    add_flags(parser.add_argument_group("source", "where samples come from"), _SourceFlags,
              "source", toml=toml)
    add_flags(parser.add_argument_group("metrics", "Prometheus exposition"), _MetricsFlags,
              "metrics", prefix="metrics", toml=toml)
    add_flags(parser.add_argument_group("synthetic stream", "shape of --source synthetic"),
              SyntheticConfig, "synthetic", prefix="synthetic", toml=toml)
    add_flags(parser.add_argument_group("kafka", "how to reach the cluster"), KafkaSettings,
              "kafka", toml=toml)
    add_flags(parser.add_argument_group("consumer", "Kafka consumer of --source kafka"),
              ConsumerConfig, "consumer", prefix="consumer", toml=toml)


def _job(args: argparse.Namespace) -> tuple[Any, LaunchConfig]:
    from hetgmp.trainer.dist import job_ranks
    from hetgmp.trainer.run import Job, check_metrics_port
    from hetgmp.trainer.sources import KafkaSpec, SyntheticSpec

    launch = build(LaunchConfig, args)
    train = build(TrainConfig, args)
    online = build(OnlineConfig, args)
    model = build(ModelConfig, args, seed=args.seed)
    store = build(StoreConfig, args, "store", seed=args.seed)
    if args.eval_window < 1:
        raise ValueError(f"--eval-window {args.eval_window}: must be >= 1")
    records = _records(args)
    heldout_after = _heldout_after(args)
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
        if records < 1:
            raise ValueError(f"--records {records}: the synthetic source needs at least "
                             f"one record (0, 'until idle', is for --source kafka)")
        if heldout_after is not None:
            raise ValueError("--heldout-after is for --source kafka (the synthetic source holds "
                             "out --heldout records after its training range)")
        if args.heldout < 0:
            raise ValueError(f"--heldout {args.heldout}: must be >= 0 (0: no held-out score)")
        _check_resumed_range(online, records, args.heldout)
        syn = build(SyntheticConfig, args, "synthetic")
        w = train.warmup if static else 0
        job = Job(SyntheticSpec(syn, w, records), model, store, train,
                  window=SyntheticSpec(syn, 0, w) if w else None,
                  heldout=SyntheticSpec(syn, w + records, args.heldout)
                  if args.heldout else None, **common)
    else:
        # --records is this run's budget over all ranks, shared out as --max-records is (a
        # rank whose partitions run dry leaves its share to the others).
        if records < 0:
            raise ValueError(f"a Kafka source needs records >= 0 (0: until idle), got "
                             f"{records}")
        if args.passes > 1 and online.checkpoint_dir:
            raise ValueError("--passes with --checkpoint-dir: a checkpoint's offsets cannot say "
                             "which pass they are in; checkpoint single-pass runs")
        spec = KafkaSpec(build(KafkaSettings, args), build(ConsumerConfig, args, "consumer"),
                         idle_s=args.idle_s,
                         reset_offsets=args.reset_offsets,
                         prefetch_records=args.prefetch_records, order=args.order,
                         max_skew_s=args.max_skew, fill_wait_s=args.fill_wait,
                         passes=args.passes)
        job = Job(spec, model, store, train, heldout_after_ms=heldout_after,
                  run_records=records, **common)
    return job, launch


def _records(args: argparse.Namespace) -> int:
    """``--records``, or when unset the source's own default."""
    return int(args.records) if args.records is not None else _RECORDS_BY_SOURCE[args.source]


def _heldout_after(args: argparse.Namespace) -> int | None:
    """``--heldout-after`` in ms since the epoch (None: not given)."""
    text = args.heldout_after
    return heldout_time(text) if text is not None and text.strip() else None


def _check_paths(online: OnlineConfig) -> None:
    """Refuse, before any rank starts, paths the run could not use (one line, not the
    traceback of a rank that tried)."""
    from hetgmp.trainer.serving import load_signer

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
    from hetgmp.trainer.checkpoint import latest

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
    steps = result.steps - steps_before
    after = _heldout_after(args)
    out: dict[str, Any] = {
        "command": "train",
        "source": args.source,
        "workers": result.world,
        "device": device,
        # This run's; the *_total figures count the runs it resumed too.
        "steps": steps,
        "steps_total": result.steps,
        # A live source trains what it has: steps short of --global-batch, and the samples a
        # step trained (this run's).
        "steps_below_global_batch": result.short_steps,
        "samples_per_step_mean": round(totals["samples_trained"] / steps, 1) if steps else None,
        "samples_per_step_min": result.min_step_samples,
        "seconds": round(result.seconds, 3),
        "training_seconds": round(result.training_seconds, 3),
        "idle_seconds": round(result.idle_seconds, 3),
        "samples": totals["samples_trained"],
        "samples_total": totals["samples_trained"] + result.resumed_records,
        "samples_per_s": round(result.samples_per_s, 1),
        "mean_loss": round(float(totals["mean_loss"]), 5),
        "heldout_auc": result.heldout_auc,
        "heldout_logloss": result.heldout_logloss,
        "heldout": (f"{result.heldout_records} records appended at or after {after} ms"
                    if after is not None
                    else f"{args.heldout} records after the training range"
                    if args.source == "synthetic" and args.heldout else None),
        "heldout_records": (result.heldout_records if after is not None
                            else args.heldout if args.source == "synthetic" else 0),
        "progressive_auc": result.progressive_auc,
        "progressive_logloss": result.progressive_logloss,
        # --passes: the progressive figures score records trained in an earlier pass. They are
        # kept (scored over the first pass only, they would describe the model K - 1 passes
        # before the one trained) and said to be in-sample; --heldout-after gives the
        # out-of-sample figure.
        "progressive_in_sample": result.progressive_in_sample,
        # Several labels: each task's AUC and log-loss (the figures above are the first's).
        "tasks": result.tasks or None,
        "eval_window": args.eval_window,
        "placement": result.placement,
        "placements_moved_to": result.online.get("placements", 0),
        # --placement auto: where it ended and every decision, with the costs it compared.
        "placement_auto": result.online.get("placement_auto"),
        # --route-rounds: batch-aware routing in force at the end and rank 0's decisions, with
        # the rows and seconds each weighed.
        "batch_routing": result.online.get("batch_routing"),
        "migrations": len(migrations),
        "rows_migrated": int(sum(e.get("rows_moved", 0) for e in migrations)),
        # Everything the ranks sent (embedding path, dense all-reduce, the loop's own window,
        # placement, migration and control traffic), per sample trained.
        "bytes_per_sample_all": round(jt.per_sample(float(sum(result.sent_by_kind.values()))), 1),
        "loop_bytes_per_sample": round(jt.per_sample(float(sum(
            result.sent_by_kind.get(k, 0) for k in ONLINE_KINDS))), 1),
        "freshness_p50_s": result.online.get("freshness_p50_s"),
        "freshness_p99_s": result.online.get("freshness_p99_s"),
        # What the batch costs of it: a record's wait for the newest record of its step's
        # batch to be appended (rank 0's records); a larger batch waits longer to fill.
        "batch_fill_p50_s": result.online.get("batch_fill_p50_s"),
        "batch_fill_p99_s": result.online.get("batch_fill_p99_s"),
        # --batch-scaling: the rule and what it set (learning rates, L2, warm-up, clip).
        "batch_scaling": _scaling(args).record(),
        "resumed_from_step": result.resumed_from,
        # The stores, summed over ranks: rows by tier, created, evicted (dropped), spilled to
        # and restored from the disk tier, and the memory tier's hit rate.
        "store": result.store or None,
        # Kafka: records handed out of event-time order because a rank's order buffer was
        # full (0 keeps the promise), and the source's other counts.
        "event_time_order": {k: v for k, v in result.source.items()
                             if k.startswith("order_")} or None,
        **(_records_read(result.source) if args.source == "kafka" else {}),
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


def _scaling(args: argparse.Namespace) -> Any:
    """What ``--batch-scaling`` sets from the flags (:func:`hetgmp.trainer.step.scaled`)."""
    from hetgmp.trainer.step import scaled

    return scaled(build(TrainConfig, args), build(StoreConfig, args, "store", seed=args.seed))


def _records_read(source: dict[str, int]) -> dict[str, Any]:
    """What the ranks' consumers read, summed: every record in (``records_in``), of which
    ``records_decoded`` (trained, held out, or read past the record budget) and
    ``records_rejected`` (by reason, each dead-lettered, never trained), messages, dead letters,
    and list values cut to ``max_len`` by field."""
    def by(prefix: str) -> dict[str, int]:
        return {k[len(prefix):]: v for k, v in sorted(source.items()) if k.startswith(prefix)}

    rejected = by("rejected.")
    decoded = source.get("records_read", 0)
    return {"records_in": decoded + sum(rejected.values()), "records_decoded": decoded,
            "messages_read": source.get("messages_read", 0),
            "records_rejected": sum(rejected.values()), "rejected": rejected,
            "dead_lettered": source.get("dead_lettered", 0),
            "values_truncated": by("truncated.")}


def _read_phrase(summary: dict[str, Any]) -> str:
    """The printed summary's account of what a Kafka run read (empty for the synthetic one)."""
    if "records_in" not in summary:
        return ""
    text = f"; read {summary['records_in']:,} records from Kafka"
    if summary["records_rejected"]:
        reasons = ", ".join(f"{why} {n:,}" for why, n in
                            sorted(summary["rejected"].items(), key=lambda kv: -kv[1]))
        text += (f": {summary['records_decoded']:,} decoded, {summary['records_rejected']:,} "
                 f"rejected ({reasons}; {summary['dead_lettered']:,} dead-lettered)")
    truncated = sum(summary["values_truncated"].values())
    if truncated:
        text += f", {truncated:,} list values cut to max_len"
    return text


def run_train(args: argparse.Namespace) -> int:
    """``hetgmp train`` from its parsed flags: 0 trained, 1 a rank failed, 2 refused settings."""
    from hetgmp.streaming import ConnectStopped, ConsumerFailed, KafkaUnavailable, TopicNotFound
    from hetgmp.trainer.checkpoint import CheckpointError
    from hetgmp.trainer.dist import (
        PeerLost,
        WorkerFailed,
        job_device,
        launch,
        run_torchrun,
        stop_event,
        under_torchrun,
    )
    from hetgmp.trainer.online import Diverged
    from hetgmp.trainer.run import check_job, run_rank

    try:
        job, launch_config = _job(args)
        launch_config = replace(launch_config, device=job_device(launch_config))
        check_job(job, launch_config)
    except ValueError as exc:
        print(f"hetgmp train: error: {exc}", file=sys.stderr)
        return 2
    if job.train.batch_scaling != "none":
        print(_scaling(args).describe(), flush=True)
    stop = stop_event()
    try:
        with stop_on_signals(stop):
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
        if stop.is_set() and exc.summary.startswith(f"{ConnectStopped.__name__}:"):
            print(f"stopped: rank {exc.rank}: {exc.summary.split(': ', 1)[1]}", file=sys.stderr)
            return _STOPPED
        print(f"error: rank {exc.rank} failed: {exc.summary}", file=sys.stderr)
        return 1
    except ConnectStopped as exc:  # one rank in this process, or a torchrun rank
        print(f"stopped: {exc}", file=sys.stderr)
        return _STOPPED
    except KafkaUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ConsumerFailed, CheckpointError, Diverged, PeerLost, TopicNotFound) as exc:
        # A torchrun rank's own failure (launch() turns a child's into WorkerFailed).
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _STOPPED
    summary = _summary(result, args, launch_config.device)
    short = summary["steps_below_global_batch"]
    print(f"trained {summary['samples']:,} samples in {summary['steps']} steps on "
          f"{summary['workers']} rank(s)"
          + (f" ({short} below --global-batch: {summary['samples_per_step_mean']:,.0f} "
             f"samples a step on average, {summary['samples_per_step_min']:,} at least)"
             if short else "")
          + f": {summary['samples_per_s']:,.0f} samples/s over "
          f"{summary['training_seconds']:.1f} s of training (+{summary['idle_seconds']:.1f} s "
          f"idle), loss {summary['mean_loss']:.4f}, {auc_phrase(summary)}, "
          f"{summary['bytes_per_sample']:,.0f} embedding bytes/sample "
          f"({summary['bytes_per_sample_all']:,.0f} with the dense all-reduce and the loop's), "
          f"{summary['remote_rows_per_sample']:.3f} remote rows/sample, "
          f"max staleness {summary['max_staleness']}" + _read_phrase(summary)
          + _fill_phrase(summary), flush=True)
    print(json.dumps(strict_json(summary), allow_nan=False), flush=True)
    return 0


def _fill_phrase(summary: dict[str, Any]) -> str:
    """Freshness and the part of it the batch costs, when records carried append times."""
    p50, fill = summary["freshness_p50_s"], summary["batch_fill_p50_s"]
    if p50 is None or p50 != p50:
        return ""
    return (f"; freshness p50 {p50:.2f} s, of which waiting for the batch to fill "
            f"{fill:.2f} s (p99 {summary['batch_fill_p99_s']:.2f} s)")


def auc_phrase(summary: dict[str, Any]) -> str:
    """The AUC of the summary line and what it is: held out when the run scored held-out
    records, else progressive, said to be in-sample after ``--passes``."""
    if summary.get("tasks"):
        kind = "heldout" if summary["heldout_auc"] is not None else "progressive"
        each = ", ".join(f"{name} {_rounded(t.get(f'{kind}_auc'))}"
                         for name, t in summary["tasks"].items())
        return f"AUC {each} ({'held-out' if kind == 'heldout' else 'progressive'})"
    if summary["heldout_auc"] is not None:
        return f"AUC {round(summary['heldout_auc'], 4)} (held-out)"
    auc = summary["progressive_auc"]
    what = (f"progressive, last {summary['eval_window']:,} samples"
            + (", in-sample: records trained in an earlier pass"
               if summary["progressive_in_sample"] else ""))
    return f"AUC {auc if auc is None else round(auc, 4)} ({what})"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
