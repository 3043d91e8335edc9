"""What one rank of a training job does, from its source to its report.

:func:`run_rank` is the function :func:`trainer.launch.launch` runs on every rank (and the one
single-process training runs with a ``LocalComm``):

1. open the rank's source (its share of the synthetic stream or of the topic's partitions);
2. settle the placement: the one given, the hash placement, or a graph placement computed on
   rank 0 from an access window and broadcast (torchrec's planner pattern). The window is
   either a range of synthetic records before the training range (``Job.window``), or the
   first ``warmup`` records the ranks read, which are then trained on too;
3. step until every rank's source has ended (or ``steps``, ``--max-records``, a stop request),
   counting everything; around every step the :class:`~trainer.online.OnlineLoop` repartitions,
   migrates rows and checkpoints (a resumed run starts from the latest checkpoint);
4. push pending replica updates, score the held-out records, gather the counters.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from partitioner import FullPartitioner, PartitionConfig, Placement, WindowGraph
from streaming.runtime import Clock, SystemClock
from streaming.synthetic import SyntheticStream, auc
from streaming.types import ClickBatch
from trainer import checkpoint as ckpt
from trainer.comm import Comm
from trainer.counters import StepCounters, Totals
from trainer.exchange import Audit
from trainer.online import OnlineLoop, check_compatible, restore
from trainer.sources import (
    KafkaShard,
    KafkaSpec,
    Source,
    SyntheticShard,
    SyntheticSpec,
    open_source,
)
from trainer.step import ModelState, Trainer
from trainer.types import ModelConfig, OnlineConfig, StoreConfig, TrainConfig

__all__ = ["Job", "RankResult", "run_rank", "run_jobs", "gather_totals", "graph_placement"]

log = logging.getLogger(__name__)

_EVAL_CHUNK = 8192
# Recent samples behind the rolling AUC metric, and how often it is recomputed (steps).
_PROGRESSIVE_METRIC = 20_000
_AUC_EVERY = 20


@dataclass(frozen=True)
class Job:
    """Everything a rank needs (picklable: it travels to spawned ranks).

    Attributes:
        source: The training records.
        model: Model settings.
        store: Embedding store settings.
        train: Loop settings.
        placement: A fixed placement (overrides ``train.placement``).
        window: Records (not trained) whose access graph gives the graph placement; None = the
            first ``train.warmup`` records of the source (trained on too).
        heldout: Records scored after training (AUC, log-loss).
        progressive: Recent training samples (over all ranks) scored before their update, for
            the progressive AUC.
        return_state: Return the rank's model (dense parameters and owned rows).
        record_steps: Return every step's counters.
        audit: Return the replica read and owner update logs (:class:`trainer.exchange.Audit`).
        seed: Seed of the partitioner.
        online: The online loop (repartitioning, migration, checkpoints, record budget); by
            default nothing is repartitioned and nothing checkpointed.
        schedule: ``(step, placement)`` pairs: move to these placements at these steps
            (tests), instead of computing placements.
        fault: ``(rank, chunk)``: that rank SIGKILLs itself after that chunk of a migration.
        record_offsets: Return the ``(partition, offset)`` of every record trained.
        metrics_port: Serve Prometheus metrics on this port + rank (0: off).
        metrics_host: Address the metrics are served on.
        metrics_linger_s: Keep serving metrics this long after the run ends (or until a stop
            request), so that a last scrape sees the final figures of a bounded run.
    """

    source: SyntheticSpec | KafkaSpec
    model: ModelConfig = field(default_factory=ModelConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    placement: Placement | None = None
    window: SyntheticSpec | None = None
    heldout: SyntheticSpec | None = None
    progressive: int = 0
    return_state: bool = False
    record_steps: bool = False
    audit: bool = False
    seed: int = 0
    online: OnlineConfig = field(
        default_factory=lambda: OnlineConfig(repartition_interval="0", drift_threshold=0.0))
    schedule: tuple[tuple[int, Placement], ...] = ()
    fault: tuple[int, int] | None = None
    record_offsets: bool = False
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    metrics_linger_s: float = 0.0

    @property
    def partitions_online(self) -> bool:
        """Whether placements are computed from the stream while training (cold start: hash)."""
        return (self.train.placement == "graph" and self.placement is None
                and not self.schedule and self.online.repartition.enabled)


@dataclass
class RankResult:
    """What a rank reports when the job ends.

    Attributes:
        rank: The rank.
        world: Ranks in the job.
        totals: This rank's counters.
        job_totals: Counters summed over ranks (equal on every rank).
        seconds: Wall time of the training loop (the slowest rank's, equal on every rank).
        steps: Steps trained.
        heldout_auc: AUC on the held-out records (None without them), from the owners' rows
            after pending replica updates were pushed: the model a checkpoint holds.
        heldout_logloss: Mean log-loss on the held-out records, likewise.
        heldout_auc_local: AUC with each rank's own view (its replicas for replicated rows,
            before the final push): what the ranks trained with. Equal to ``heldout_auc`` at
            ``s = 0``; the two part when a merge of stale copies has not been trained through.
        heldout_logloss_local: Log-loss with each rank's own view.
        progressive_auc: AUC of the last training samples, scored before their update.
        placement: Explicit ids, replicas per rank and the partition time.
        state: The rank's model, when asked for.
        step_counters: Every step's counters, when asked for.
        audit: The replica read and owner update logs, when asked for.
        online: What the online loop saw: per-step records, events (repartitions,
            migrations, checkpoints), freshness percentiles, the final placement version.
        trained_offsets: int64 ``[n, 2]`` (partition, offset) of every record this rank
            trained, when asked for.
        resumed_from: Step of the checkpoint the run resumed from (None: a fresh start).
    """

    rank: int
    world: int
    totals: Totals
    job_totals: Totals
    seconds: float
    steps: int
    heldout_auc: float | None = None
    heldout_logloss: float | None = None
    heldout_auc_local: float | None = None
    heldout_logloss_local: float | None = None
    progressive_auc: float | None = None
    placement: dict[str, object] = field(default_factory=dict)
    state: ModelState | None = None
    step_counters: list[StepCounters] | None = None
    audit: Audit | None = None
    online: dict[str, Any] = field(default_factory=dict)
    trained_offsets: np.ndarray | None = None
    resumed_from: int | None = None

    @property
    def samples_per_s(self) -> float:
        """Samples trained per second over the job."""
        return self.job_totals.samples / self.seconds if self.seconds > 0 else 0.0


def graph_placement(ids: np.ndarray, world: int, train: TrainConfig, seed: int = 0) -> Placement:
    """The graph placement (METIS partition plus replicas) of an access window ``[n, F]``."""
    config = PartitionConfig(num_workers=world, global_batch=train.global_batch,
                             replica_fraction=train.replica_fraction,
                             replica_basis=train.replica_basis, seed=seed)
    return FullPartitioner(config).partition(WindowGraph.from_dense(ids), None)


def _settle_placement(
    job: Job, comm: Comm, source: Source, clock: Clock, manifest: ckpt.Manifest | None = None
) -> tuple[Placement, list[ClickBatch], dict[str, object]]:
    """The job's placement, the batches read to compute it (to train first), and a summary."""
    world, train = comm.world, job.train
    buffered: list[ClickBatch] = []
    info: dict[str, object] = {"kind": "given" if job.placement else train.placement}
    if manifest is not None:
        info["kind"] = "resumed"
        if manifest.world == world:
            placement = ckpt.load_placement(manifest)
        else:
            # Owners of N ranks mean nothing to M: hash until the online loop places again.
            placement = Placement.hash(world, version=manifest.placement_version + 1)
    elif job.placement is not None:
        placement = job.placement
    elif job.partitions_online:
        placement = Placement.hash(world)
        info["kind"] = "online"
    elif train.placement == "hash" or world == 1:
        placement = Placement.hash(world)
    else:
        t0 = clock.monotonic()
        if job.window is not None:
            ids = None
            if comm.rank == 0:
                w = job.window
                ids = SyntheticStream(w.config).feature_ids(w.start, w.records)
        else:
            share = math.ceil(train.warmup / world)
            got = 0
            while got < share and not source.exhausted and not comm.stop_requested():
                batch = source.next()
                buffered.append(batch)
                got += len(batch)
            local = ClickBatch.concat(buffered).ids if buffered else np.zeros((0, 0), np.int64)
            gathered = comm.all_gather_object(local)
            ids = np.concatenate([g for g in gathered if g.size]) if comm.rank == 0 else None
        computed: Placement | None = None
        if comm.rank == 0:
            assert ids is not None
            computed = graph_placement(ids, world, train, job.seed)
        placement = comm.broadcast_object(computed)
        info["partition_s"] = clock.monotonic() - t0
    info["explicit_ids"] = int(placement.ids.size)
    info["replicas"] = [int(r.size) for r in placement.replicas]
    return placement, buffered, info


def _find_checkpoint(job: Job, comm: Comm) -> ckpt.Manifest | None:
    """The checkpoint a resumed job starts from (rank 0 looks; every rank gets its path)."""
    if not job.online.resume:
        if job.online.checkpoint_dir:
            used = comm.broadcast_object(
                bool(ckpt.latest(job.online.checkpoint_dir, verify=False)) if comm.rank == 0
                else None)
            if used:
                raise ckpt.CheckpointError(
                    f"{job.online.checkpoint_dir} holds checkpoints of an earlier run: pass "
                    "--resume to continue it, or use another --checkpoint-dir")
        return None
    root = job.online.checkpoint_dir
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


def _model_shape(job: Job, n_fields: int, n_dense: int) -> dict[str, Any]:
    m = job.model
    return {"model": m.model, "row_dim": m.row_dim, "hidden": list(m.hidden),
            "cross_layers": m.cross_layers, "dtype": m.dtype, "fields": n_fields,
            "dense": n_dense, "row_optimizer": job.store.optimizer,
            "dense_optimizer": job.train.dense_optimizer}


def _open(job: Job, comm: Comm, manifest: ckpt.Manifest | None) -> Source:
    spec = job.source
    if isinstance(spec, SyntheticSpec):
        skip = manifest.records if manifest is not None else 0
        budget = spec.records - skip
        if job.online.max_records:
            budget = min(budget, job.online.max_records - skip)
        spec = dataclasses.replace(spec, start=spec.start + skip, records=max(budget, 0))
    source = open_source(spec, job.train.global_batch, comm.rank, comm.world)
    if manifest is not None and isinstance(source, KafkaShard):
        source.seek(manifest.offsets)
    return source


def _serve_metrics(job: Job, comm: Comm, source: Source) -> Any:
    if not job.metrics_port:
        return None
    from prometheus_client import CollectorRegistry

    from streaming.metrics import ConsumerCollector
    from trainer.metrics import TrainerMetrics, serve_rank

    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, comm.rank, job.train.staleness)
    if isinstance(source, KafkaShard):
        registry.register(ConsumerCollector(source.consumer, {"rank": str(comm.rank)}))
    port = serve_rank(registry, job.metrics_port, comm.rank, job.metrics_host)
    log.info("rank %d: metrics on http://%s:%d/metrics", comm.rank, job.metrics_host, port)
    return metrics


def run_rank(comm: Comm, job: Job, clock: Clock | None = None) -> RankResult:
    """Train one rank of ``job`` (every rank of the job calls it) and report."""
    clock = clock or SystemClock()
    train = job.train
    manifest = _find_checkpoint(job, comm)
    source = _open(job, comm, manifest)
    loop: OnlineLoop | None = None
    try:
        placement, buffered, info = _settle_placement(job, comm, source, clock, manifest)
        schema = source.schema
        trainer = Trainer(comm, placement, len(schema.sparse), len(schema.dense),
                          model=job.model, store=job.store, train=train, clock=clock)
        shape = _model_shape(job, len(schema.sparse), len(schema.dense))
        if manifest is not None:
            topic = job.source.consumer.topic if isinstance(job.source, KafkaSpec) else None
            check_compatible(manifest, shape, topic)
            rows = restore(trainer, manifest)
            log.info("rank %d: resumed from %s (step %d, %d records): %d rows", comm.rank,
                     manifest.path, manifest.step, manifest.records, rows)
        metrics = _serve_metrics(job, comm, source)
        loop = OnlineLoop(
            comm, trainer, source, job.online, train, clock, seed=job.seed, metrics=metrics,
            schedule=dict(job.schedule), records=manifest.records if manifest else 0,
            partition=job.partitions_online and comm.world > 1, fault=job.fault, extra=shape,
            check_owners=job.audit, resumed_step=manifest.step if manifest else None)
        if metrics is not None:
            loop.publish_placement()
        audit = trainer.exchange.start_audit() if job.audit else None
        steps_log: list[StepCounters] = []
        offsets_log: list[np.ndarray] = []
        recent: list[tuple[np.ndarray, np.ndarray]] = []
        kept = 0
        comm.barrier()
        t0 = clock.monotonic()
        while not train.steps or trainer.step_index < train.steps:
            t_step = clock.monotonic()
            ctl = loop.control()
            loop.between_steps(ctl)
            if ctl.stop:  # every rank agreed: the ranks end together at this step
                batch, done = ClickBatch.empty(source.schema), True
            else:
                batch = buffered.pop(0) if buffered else source.next(loop.read_cap())
                done = not buffered and source.exhausted
            c = trainer.step(batch, exhausted=done)
            if len(batch) and isinstance(source, KafkaShard):
                source.mark_trained()  # the step applied it: a checkpoint may now cover it
            if c is None:
                loop.note_read(len(batch))
                break
            if c.global_samples == 0:
                loop.note_read(len(batch))
                continue
            seconds = clock.monotonic() - t_step - loop.checkpoint_seconds
            loop.after_step(batch, c, seconds, loop.moved_chunk)
            if job.record_offsets and len(batch):
                offsets_log.append(np.stack([batch.partitions.astype(np.int64),
                                             batch.offsets], axis=1))
            if job.record_steps:
                steps_log.append(c)
            if job.progressive or metrics is not None:
                recent.append((trainer.last_labels, trainer.last_logits.cpu().numpy()))
                kept += len(trainer.last_labels)
                keep = max(job.progressive, _PROGRESSIVE_METRIC) // comm.world
                while recent and kept - len(recent[0][0]) >= keep:
                    kept -= len(recent.pop(0)[0])
                if metrics is not None and trainer.step_index % _AUC_EVERY == 0:
                    metrics.on_heldout_auc(_local_auc(recent))
            if comm.rank == 0 and train.log_every and trainer.step_index % train.log_every == 0:
                _log_progress(trainer, clock.monotonic() - t0, loop)
        trainer.finish_step()  # the last step's dense update is part of the training time
        seconds = max(comm.all_gather_object(clock.monotonic() - t0))
        loop.settle()
        loop.checkpoint()
    finally:
        if loop is not None:
            loop.close()
        source.close()
    result = RankResult(comm.rank, comm.world, trainer.totals, Totals(), seconds,
                        trainer.step_index, placement=info,
                        resumed_from=manifest.step if manifest else None)
    # A job-wide condition (a per-rank one would leave ranks in different collectives).
    if job.heldout is not None and trainer.placement.replica_counts().sum() > 0:
        result.heldout_auc_local, result.heldout_logloss_local = _score_heldout(
            trainer, job.heldout, comm, local_view=True)
    trainer.flush()
    if job.heldout is not None:
        result.heldout_auc, result.heldout_logloss = _score_heldout(trainer, job.heldout, comm)
        if result.heldout_auc_local is None:
            result.heldout_auc_local = result.heldout_auc
            result.heldout_logloss_local = result.heldout_logloss
    if job.progressive:
        result.progressive_auc = _progressive_auc(recent, comm)
    result.job_totals = gather_totals(comm, trainer.totals)
    result.online = loop.report()
    result.placement.update(version=trainer.placement.version,
                            explicit_ids=int(trainer.placement.ids.size),
                            replicas=[int(r.size) for r in trainer.placement.replicas])
    if job.return_state:
        result.state = trainer.state()
    if job.record_steps:
        result.step_counters = steps_log
    if job.record_offsets:
        result.trained_offsets = (np.concatenate(offsets_log) if offsets_log
                                  else np.zeros((0, 2), np.int64))
    result.audit = audit
    if metrics is not None and job.metrics_linger_s > 0:
        _linger(comm, clock, job.metrics_linger_s)
    return result


def _linger(comm: Comm, clock: Clock, seconds: float) -> None:
    """Keep the process (and its metrics server) up for ``seconds`` or until asked to stop."""
    deadline = clock.monotonic() + seconds
    while clock.monotonic() < deadline and not comm.stop_requested():
        clock.sleep(0.1)


def _local_auc(recent: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Progressive AUC of this rank's recent samples (each scored before its update)."""
    if not recent:
        return float("nan")
    y = np.concatenate([r[0] for r in recent])
    p = np.concatenate([r[1] for r in recent])
    return auc(y, p) if 0 < y.sum() < y.size else float("nan")


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


def _score_heldout(trainer: Trainer, spec: SyntheticSpec, comm: Comm,
                   local_view: bool = False) -> tuple[float, float]:
    """AUC and mean log-loss of the held-out records, each rank scoring its share."""
    shard = SyntheticShard(spec, _EVAL_CHUNK, comm.rank, comm.world)
    labels, scores = [], []
    while not shard.exhausted:
        batch = shard.next()
        labels.append(batch.labels)
        scores.append(trainer.predict(batch, local_view=local_view))
    parts = comm.all_gather_object((np.concatenate(labels), np.concatenate(scores)))
    y = np.concatenate([p[0] for p in parts])
    p = np.clip(np.concatenate([p[1] for p in parts]), 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return auc(y, p), logloss


def _progressive_auc(recent: list[tuple[np.ndarray, np.ndarray]], comm: Comm) -> float:
    mine = (np.concatenate([r[0] for r in recent]) if recent else np.zeros(0),
            np.concatenate([r[1] for r in recent]) if recent else np.zeros(0))
    parts = comm.all_gather_object(mine)
    return auc(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
