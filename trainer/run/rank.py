"""What one rank of a training job does, from its source to its report.

:func:`run_rank` is the function :func:`hetgmp.trainer.dist.launcher` runs on every rank (and the one
single-process training runs with a ``LocalComm``):

1. find the checkpoint a resumed job starts from, and open the rank's source at its offsets;
2. settle the first placement (:func:`hetgmp.trainer.run.placement.initial_placement`);
3. build the trainer, load the checkpoint into it, serve its metrics;
4. step until every rank's source has ended (or ``steps``, ``--max-records``, a stop request),
   with the :class:`~hetgmp.trainer.online.OnlineLoop` repartitioning, migrating rows and
   checkpointing around every step;
5. push pending replica updates, score the held-out records, gather the counters.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming import ClickBatch
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import KINDS, Comm, StepCounters, Totals
from hetgmp.trainer.model import Bags, param_names
from hetgmp.trainer.online import (
    Observer,
    Observers,
    OnlineLoop,
    RunView,
    build_parts,
    check_compatible,
    restore,
)
from hetgmp.trainer.run.evaluation import (
    Progressive,
    TaskScores,
    score_batches_tasks,
    score_heldout_tasks,
)
from hetgmp.trainer.run.job import Job, RankResult
from hetgmp.trainer.run.placement import Start, initial_placement
from hetgmp.trainer.sources import KafkaSpec, Resume, Source, open_source
from hetgmp.trainer.step import Trainer, scaled

__all__ = ["gather_totals", "run_jobs", "run_rank"]

log = logging.getLogger(__name__)

# Recent samples behind the rolling AUC metric, and how often it is recomputed (steps).
_PROGRESSIVE_METRIC = 20_000
_AUC_EVERY = 20


def run_rank(comm: Comm, job: Job, clock: Clock | None = None) -> RankResult:
    """Train one rank of ``job`` (every rank of the job calls it) and report."""
    clock = clock or SystemClock()
    manifest = find_checkpoint(job, comm)
    resume = None if manifest is None else Resume(manifest.records, manifest.offsets,
                                                  manifest.topic_id)
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(open_source(
            job.source, job.train.global_batch, comm.rank, comm.world, resume=resume,
            max_records=job.online.max_records, stop=comm.stop_requested))
        schema = source.schema
        bags = Bags.of(schema)
        # Tables of several widths: the graph places each block of a row (trainer.model.widths).
        start = initial_placement(job, comm, source, clock, manifest,
                                  bags.widths(job.model, len(schema.sparse)))
        trainer = Trainer(comm, start.placement, len(schema.sparse), len(schema.dense),
                          model=job.model, store=job.store, train=job.train, bags=bags,
                          clock=clock)
        shape = model_shape(job, len(schema.sparse), len(schema.dense), bags, trainer.model)
        if manifest is not None:
            check_compatible(manifest, shape, source.topic)
            rows = restore(trainer, manifest)
            log.info("rank %d: resumed from %s (step %d, %d records): %d rows", comm.rank,
                     manifest.path, manifest.step, manifest.records, rows)
        metrics = _serve_metrics(job, comm, source)
        observers = Observers.build(job.observers, comm.rank)
        parts = build_parts(
            comm, trainer, job.online, job.train, clock, stack, seed=job.seed, metrics=metrics,
            observers=observers, schedule=job.schedule,
            partition=job.partitions_online and comm.world > 1, resumed=manifest, extra=shape,
            sink=open_delta_sink(job, comm), run_records=job.run_records)
        loop = OnlineLoop(comm, trainer, source, parts, job.online, clock, metrics=metrics,
                          fresh_start=manifest is None)
        if metrics is not None:
            loop.publish_placement()
        logs = _Logs(job, metrics, trainer, schema=schema)
        view = RunView(comm.rank, comm.world, comm, trainer)
        observers.on_start(view)
        seconds, idle = _train(comm, trainer, source, loop, start, logs, clock, job, observers)
        loop.finish()
    result = _result(comm, job, trainer, loop, logs, start, seconds, manifest)
    result.observed = observers.on_end(view)
    result.idle_seconds = idle
    reports = comm.all_gather_object(source.report())
    result.source = {k: int(sum(r.get(k, 0) for r in reports))
                     for k in sorted({k for r in reports for k in r})}
    if metrics is not None and job.metrics_linger_s > 0:
        _linger(comm, clock, job.metrics_linger_s)
    return result


@dataclass
class _Logs:
    """What a run keeps of its steps beyond the counters: the recent samples of the
    progressive AUC, the held-out records, and the steps short of a global batch."""

    job: Job
    metrics: Any
    trainer: Trainer
    progressive: Progressive | None = None
    held: list[ClickBatch] = field(default_factory=list)  # --heldout-after: scored at the end
    schema: Any = None
    again: bool = False  # a later pass (--passes) has begun: records are seen again
    short_steps: int = 0
    min_step_samples: int | None = None

    def __post_init__(self) -> None:
        if self.job.progressive or self.metrics is not None:
            self.progressive = Progressive(max(self.job.progressive or _PROGRESSIVE_METRIC, 1))

    def hold_out(self, batch: ClickBatch, again: bool = False) -> ClickBatch:
        """What of ``batch`` is trained: records appended before ``--heldout-after``; the
        others are kept to be scored after training, once: a later pass (``--passes``) hands
        the same records out again, and scoring them K times counted each K times."""
        self.again = self.again or again
        after = self.job.heldout_after_ms
        if after is None or not len(batch):
            return batch
        late = batch.timestamps_ms >= after
        if not late.any():
            return batch
        if not again:
            self.held.append(batch.take(np.flatnonzero(late)))
        return batch.take(np.flatnonzero(~late))

    def add(self, batch: ClickBatch, c: StepCounters) -> None:
        tr = self.trainer
        # The step's samples over all ranks: the same count on every rank, no collective.
        if c.global_samples < self.job.train.global_batch:
            self.short_steps += 1
        if self.min_step_samples is None or c.global_samples < self.min_step_samples:
            self.min_step_samples = c.global_samples
        if self.progressive is not None:
            # Whole steps of the job: the ranks' shares together are the job's last samples.
            self.progressive.add(tr.last_labels, tr.last_logits, c.global_samples)
            if self.metrics is not None and tr.step_index % _AUC_EVERY == 0:
                aucs = self.progressive.local_task_aucs()
                self.metrics.on_heldout_auc(aucs[0])
                if len(aucs) > 1:
                    self.metrics.on_task_aucs(dict(zip(self.schema.labels, aucs)))


def _train(comm: Comm, trainer: Trainer, source: Source, loop: OnlineLoop, start: Start,
           logs: _Logs, clock: Clock, job: Job, observers: Observer) -> tuple[float, float]:
    """Step until the job ends; the wall time of the loop and of its steps that trained
    nothing anywhere (waiting for records, the idle time before a source ends), both the
    slowest rank's."""
    train, buffered = job.train, start.buffered
    comm.barrier()
    t0 = clock.monotonic()
    idle = 0.0
    while not train.steps or trainer.step_index < train.steps:
        t_step = clock.monotonic()
        ctl = loop.control()
        loop.between_steps(ctl)
        if ctl.stop:  # every rank agreed: the ranks end together at this step
            batch, done = ClickBatch.empty(source.schema), True
        else:
            batch = buffered.pop(0) if buffered else source.next_batch(loop.read_cap())
            done = not buffered and source.exhausted
        handed = len(batch)
        batch = logs.hold_out(batch, again=source.passes_done > 0)
        if trainer.store.prefetching:  # the next batch's spilled rows, while this one trains
            trainer.prefetch(source.upcoming_ids(), batch)
        c = trainer.step(batch, exhausted=done)
        if handed:
            source.mark_trained()  # the step applied it: a checkpoint may now cover it
        if c is None or c.global_samples == 0:
            idle += clock.monotonic() - t_step
            loop.note_read(len(batch))
            if c is None:
                break
            continue
        loop.after_step(batch, c, clock.monotonic() - t_step - loop.checkpoint_seconds,
                        loop.moved_chunk)
        logs.add(batch, c)
        observers.on_step(batch, c)
        if comm.rank == 0 and train.log_every and trainer.step_index % train.log_every == 0:
            _log_progress(trainer, clock.monotonic() - t0, loop)
    trainer.finish_step()  # the last step's dense update is part of the training time
    times = comm.all_gather_object((clock.monotonic() - t0, idle))
    return float(max(t for t, _ in times)), float(max(i for _, i in times))


def _result(comm: Comm, job: Job, trainer: Trainer, loop: OnlineLoop, logs: _Logs,
            start: Start, seconds: float, manifest: ckpt.Manifest | None) -> RankResult:
    """Score, gather and report (collective)."""
    result = RankResult(comm.rank, comm.world, trainer.totals, Totals(), seconds,
                        trainer.step_index, placement=start.info,
                        resumed_from=manifest.step if manifest else None,
                        resumed_records=manifest.records if manifest else 0)
    # A job-wide condition (a per-rank one would leave ranks in different collectives).
    labels = logs.schema.labels
    if job.heldout is not None and trainer.placement.replica_counts().sum() > 0:
        result.heldout_auc_local, result.heldout_logloss_local = score_heldout_tasks(
            trainer, job.heldout, comm, local_view=True)[0]
    trainer.flush()
    if job.heldout is not None:
        scores = score_heldout_tasks(trainer, job.heldout, comm)
        result.heldout_auc, result.heldout_logloss = scores[0]
        _by_task(result, labels, "heldout", scores)
        if result.heldout_auc_local is None:
            result.heldout_auc_local = result.heldout_auc
            result.heldout_logloss_local = result.heldout_logloss
    if job.progressive and logs.progressive is not None:
        scores = logs.progressive.job_task_scores(comm)
        result.progressive_auc, result.progressive_logloss = scores[0]
        _by_task(result, labels, "progressive", scores)
    result.progressive_in_sample = any(comm.all_gather_object(logs.again))
    result.short_steps, result.min_step_samples = logs.short_steps, logs.min_step_samples
    if job.heldout_after_ms is not None:
        scores, result.heldout_records = score_batches_tasks(trainer, logs.held, comm,
                                                             logs.schema)
        result.heldout_auc, result.heldout_logloss = scores[0]
        _by_task(result, labels, "heldout", scores)
    result.job_totals = gather_totals(comm, trainer.totals)
    # Everything every rank sent, the loop's traffic between steps included (by kind).
    result.sent_by_kind = dict(zip(KINDS, np.sum(
        comm.all_gather_object(comm.traffic.sent.astype(np.int64)), axis=0).tolist()))
    result.online = loop.report()
    result.store = _store_totals(comm.all_gather_object(trainer.store.counts()))
    p = trainer.placement
    result.placement.update(version=p.version, explicit_ids=int(p.ids.size),
                            replicas=[int(r.size) for r in p.replicas])
    if result.online.get("placement_auto") is not None:
        result.placement.update(_auto_in_force(result.online["placement_auto"], comm.rank == 0))
    elif result.placement.get("kind") == "online" and not loop.placements.computes:
        # One rank: no partitioner ever ran, hash (every row here) stayed in force.
        result.placement["kind"] = "hash"
    return result


def _by_task(result: RankResult, labels: tuple[str, ...], kind: str, scores: TaskScores
             ) -> None:
    """Each task's ``kind`` AUC and log-loss into ``result.tasks`` (several labels only)."""
    if len(labels) < 2:
        return
    for name, (auc_, logloss) in zip(labels, scores):
        result.tasks.setdefault(name, {}).update(
            {f"{kind}_auc": auc_, f"{kind}_logloss": logloss})


def _auto_in_force(auto: dict[str, Any], say: bool) -> dict[str, object]:
    """What ``--placement auto`` ended on, from its report (:meth:`AutoPlacement.report`): the
    placement it chose (``kind``: graph, hash, or ``undecided`` when the run ended before it
    compared the two), the one ``in_force``, auto's state and its last decision (``"none
    yet"``). The start's ``online`` would hide all of it."""
    decisions = auto.get("decisions") or []
    out = {"kind": auto["kind"], "in_force": auto["in_force"], "auto_state": auto["state"],
           "auto_decision": decisions[-1]["decision"] if decisions else "none yet"}
    if auto["kind"] == "undecided" and say:
        left = auto.get("records_to_decision")
        log.warning("--placement auto reached no decision: %s (the %s placement was in "
                    "force)", "the run ended before a graph placement was computed and "
                    "migrated in (--warmup records, then a partition)" if left is None else
                    f"the run ended {left:,} records before the graph placement's trial (two "
                    "--repartition-interval lengths) was over", auto["in_force"])
    return out


def find_checkpoint(job: Job, comm: Comm) -> ckpt.Manifest | None:
    """The checkpoint a resumed job starts from (rank 0 looks; every rank gets its path)."""
    root = job.online.checkpoint_dir
    if not job.online.resume:
        if root:
            used = comm.broadcast_object(
                bool(ckpt.latest(root, verify=False)) if comm.rank == 0 else None)
            if used:
                raise ckpt.CheckpointError(
                    f"{root} holds checkpoints of an earlier run: pass --resume to continue "
                    "it, or use another --checkpoint-dir")
        return None
    path, error = None, None
    if comm.rank == 0:
        found = ckpt.latest(root)
        if found is not None:
            path = str(found.path)
            ckpt.set_aside_newer(root, found)  # it warns for each one
        elif ckpt.has_manifest(root):
            # Starting fresh would train a new model and commit offsets past the old one's.
            error = (f"--resume: no checkpoint in {root} passes its checks (see the warnings "
                     "above); move them away to start a new run there, or restore them")
        else:
            log.warning("--resume: no complete checkpoint in %s; starting fresh", root)
    path, error = comm.broadcast_object((path, error))
    if error is not None:
        raise ckpt.CheckpointError(error)
    return None if path is None else ckpt.read_manifest(Path(path))


def model_shape(job: Job, n_fields: int, n_dense: int, bags: Bags | None = None,
                model: Any = None) -> dict[str, Any]:
    """The settings a checkpoint must share with the run that loads it (and what a serving
    process needs to rebuild the model: the rows' initial values come from their seed and
    scale; the fields pooled by mean, when some are; a user's ``model``'s parameter names,
    which place the dense buffer in its exported program)."""
    m = job.model
    pooled: dict[str, Any] = {"mean": list(bags.mean)} \
        if bags is not None and any(bags.mean) else {}
    if bags is not None and any(bags.sequence):
        # Sequence fields (pooling = "none"): serve rebuilds the model's features as the
        # trainer does (their names, their lengths, the tables the model's factory is told).
        pooled.update(names=list(bags.names), sequence=list(bags.sequence),
                      max_len=list(bags.max_len), tables=list(bags.tables))
    if model is not None and ":" in m.model:
        pooled["dense_names"] = param_names(model)
    if bags is not None and bags.tasks > 1:
        # Several labels: the model's logit columns, named (serve answers one score each).
        pooled["labels"] = list(bags.labels)
    if bags is not None:
        widths = bags.widths(m, n_fields)
        if not widths.as_stored or widths.row_dim != m.row_dim:
            # Tables of their own widths (or first-order weights of their own): serve cuts
            # the rows in the same blocks; a resume must have the same.
            pooled.update(widths.record(), row_dim=widths.row_dim)
    return {"model": m.model, "row_dim": m.row_dim, **pooled, "hidden": list(m.hidden),
            "cross_layers": m.cross_layers, "cross_rank": m.cross_rank,
            "bottom": list(m.bottom), "dtype": m.dtype, "fields": n_fields,
            "dense": n_dense, "row_optimizer": job.store.optimizer,
            "dense_optimizer": job.train.dense_optimizer, "row_seed": job.store.seed,
            "row_init_scale": job.store.init_scale,
            # Recorded, not required equal at resume (check_compatible says when it differs).
            "batch_scaling": scaled(job.train, job.store).record()}


def open_delta_sink(job: Job, comm: Comm) -> Any:
    """The rank's producer on the delta-log topic, or None: the log needs a Kafka source (the
    watermark is its append time), checkpoints (its snapshots) and a publish interval."""
    online = job.online
    if not isinstance(job.source, KafkaSpec) or online.publish_interval <= 0:
        return None
    if not online.checkpoint_dir:
        if comm.rank == 0:
            log.info("no model delta log without --checkpoint-dir (serving starts from a "
                     "checkpoint)")
        return None
    from hetgmp.streaming import ensure_topic
    from hetgmp.trainer.serving import KafkaDeltaSink, load_signer

    topic = online.model_topic or f"{job.source.consumer.topic}.model"
    if comm.rank == 0:  # before any other rank's metadata request could auto-create it
        ensure_topic(job.source.kafka, topic, comm.world)
    comm.barrier()
    return KafkaDeltaSink(job.source.kafka, topic, comm.rank,
                          load_signer(online.delta_key_file), client=job.source.consumer.client)


def _serve_metrics(job: Job, comm: Comm, source: Source) -> Any:
    if not job.metrics_port:
        return None
    from prometheus_client import CollectorRegistry

    from hetgmp.trainer.run.metrics import TrainerMetrics, serve_rank

    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, comm.rank, job.train.staleness)
    for collector in source.collectors({"rank": str(comm.rank)}):
        registry.register(collector)
    port = serve_rank(registry, job.metrics_port, comm.rank, job.metrics_host)
    log.info("rank %d: metrics on http://%s:%d/metrics", comm.rank, job.metrics_host, port)
    return metrics


def _linger(comm: Comm, clock: Clock, seconds: float) -> None:
    """Keep the process (and its metrics server) up for ``seconds`` or until asked to stop."""
    deadline = clock.monotonic() + seconds
    while clock.monotonic() < deadline and not comm.stop_requested():
        clock.sleep(0.1)


def _store_totals(ranks: list[dict[str, int]]) -> dict[str, float]:
    """Every rank's store counts summed, and the memory tier's hit rate where there is a disk
    tier (the share of ids looked up that did not have to be read back from disk)."""
    out: dict[str, float] = {}
    for counts in ranks:
        for key, value in counts.items():
            out[key] = out.get(key, 0) + value
    if "restored" in out:
        out["memory_hit_rate"] = round(1 - out["restored"] / max(out["looked_up"], 1), 4)
    return out


def gather_totals(comm: Comm, totals: Totals) -> Totals:
    """Every rank's ``totals`` merged, the same on every rank (collective)."""
    merged = Totals()
    for t in comm.all_gather_object(totals):
        merged = merged.merge(t) if merged.steps else t
    return merged


def run_jobs(comm: Comm, jobs: list[Job]) -> list[RankResult]:
    """Run several jobs one after the other on the same ranks (one launch, one group)."""
    return [run_rank(comm, job) for job in jobs]


def _log_progress(trainer: Trainer, seconds: float, loop: OnlineLoop) -> None:
    t = trainer.totals
    log.info(
        "step %d: %.0f samples/s (rank 0), loss %.4f (rank 0), %.0f bytes/sample sent (rank 0), "
        "%.2f remote rows/sample (rank 0), max staleness %d (reads of rank 0's rows), "
        "placement v%d%s",
        trainer.step_index, t.samples / max(seconds, 1e-9),
        t.loss_sum / max(t.loss_samples, 1), t.per_sample(t.embedding_bytes),
        t.per_sample(t.counts["remote_rows"] + t.counts["replica_refreshes"]), t.max_staleness,
        trainer.placement.version, " (migrating)" if loop.migrating else "",
    )
