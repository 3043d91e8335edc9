"""A training job as a value, and what each rank reports when it ends.

A :class:`Job` is everything a rank needs (it is picklable: it travels to spawned ranks);
:func:`hetgmp.trainer.run.run_rank` runs one rank of it and returns a :class:`RankResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetgmp.partitioner import Placement
from hetgmp.trainer.dist import Totals
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import ObserverFactory, OnlineConfig
from hetgmp.trainer.sources import SourceSpec, SyntheticSpec
from hetgmp.trainer.step import TrainConfig

__all__ = ["Job", "RankResult"]


@dataclass(frozen=True)
class Job:
    """Everything a rank needs.

    Attributes:
        source: The training records.
        model: Model settings.
        store: Embedding store settings.
        train: Loop settings.
        online: The online loop (repartitioning, migration, checkpoints, record budget); by
            default nothing is repartitioned and nothing checkpointed.
        placement: A fixed placement (overrides ``train.placement``).
        window: Records (not trained) whose access graph gives the graph placement; None = the
            first ``train.warmup`` records of the source (trained on too).
        heldout: Records scored after training (AUC, log-loss).
        heldout_after_ms: Kafka source: records appended at or after this time (ms since the
            epoch) are held out: scored after training with the final model, never trained.
        run_records: Records this run reads over all ranks, shared out as ``--max-records``
            is (0: no limit of its own).
        progressive: Recent training samples (over all ranks) scored before their update, for
            the progressive AUC.
        seed: Seed of the partitioner.
        metrics_port: Serve Prometheus metrics on this port + rank (0: off).
        metrics_host: Address the metrics are served on.
        metrics_linger_s: Keep serving metrics this long after the run ends (or until a stop
            request), so that a last scrape sees the final figures of a bounded run.
        schedule: A fixed placement schedule, ``(step, placement)`` pairs: move to these
            placements at these steps instead of computing placements from the stream.
        observers: Factories of observers that see the run from outside (tests, benchmarks:
            :mod:`hetgmp.trainer.online.observe`); each rank builds its own.
    """

    source: SourceSpec
    model: ModelConfig = field(default_factory=ModelConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    online: OnlineConfig = field(
        default_factory=lambda: OnlineConfig(repartition_interval="0", drift_threshold=0.0))
    placement: Placement | None = None
    window: SyntheticSpec | None = None
    heldout: SyntheticSpec | None = None
    heldout_after_ms: int | None = None
    run_records: int = 0
    progressive: int = 0
    seed: int = 0
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    metrics_linger_s: float = 0.0
    schedule: tuple[tuple[int, Placement], ...] = ()
    observers: tuple[ObserverFactory, ...] = ()

    @property
    def partitions_online(self) -> bool:
        """Whether placements are computed from the stream while training (cold start: hash)."""
        return (self.train.placement in ("graph", "auto") and self.placement is None
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
        progressive_logloss: Mean log-loss of the same samples.
        progressive_in_sample: A rank was handed records it had trained in an earlier pass
            (``--passes``): the progressive figures then score samples the model has seen.
        heldout_records: Records scored as held out (all ranks), each once.
        short_steps: Steps of this run that trained fewer samples than the global batch (a
            live source hands out what it has).
        min_step_samples: Fewest samples a step of this run trained (None: no step trained).
        placement: The kind of placement (``--placement auto``: the one in force at the end,
            with auto's state and last decision), explicit ids, replicas per rank and the
            partition time.
        online: What the online loop saw: per-step records, events (repartitions,
            migrations, checkpoints), freshness percentiles, the final placement version.
        resumed_from: Step of the checkpoint the run resumed from (None: a fresh start).
        resumed_records: Records the checkpoint it resumed from had trained (0: a fresh start).
        sent_by_kind: Bytes every rank sent over the whole run, by purpose (the loop's
            traffic between steps included; :data:`hetgmp.trainer.dist.counters.KINDS`).
        idle_seconds: Time of the loop's steps that trained nothing on any rank (waiting for
            records, the ``idle_s`` before a Kafka source ends), part of ``seconds``.
        store: The stores' rows by tier and what they did (created, evicted, spilled,
            restored, ids looked up), summed over ranks; with a disk tier, its bytes and the
            memory tier's hit rate.
        source: The sources' own counts, summed over ranks (a Kafka source: how its
            event-time order went, :meth:`hetgmp.trainer.sources.KafkaShard.report`).
        observed: What the job's observers reported at the end (plain data, by key).
        tasks: With several labels, each task's figures by its label: ``heldout_auc``,
            ``heldout_logloss``, ``progressive_auc``, ``progressive_logloss`` where measured
            (the fields above are the first task's). Empty with one label.
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
    progressive_logloss: float | None = None
    progressive_in_sample: bool = False
    heldout_records: int = 0
    short_steps: int = 0
    min_step_samples: int | None = None
    placement: dict[str, object] = field(default_factory=dict)
    online: dict[str, Any] = field(default_factory=dict)
    resumed_from: int | None = None
    resumed_records: int = 0
    idle_seconds: float = 0.0
    sent_by_kind: dict[str, int] = field(default_factory=dict)
    source: dict[str, int] = field(default_factory=dict)
    store: dict[str, float] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def training_seconds(self) -> float:
        """Wall time of the steps that trained something (``seconds`` less the idle time)."""
        return max(self.seconds - self.idle_seconds, 0.0)

    @property
    def samples_per_s(self) -> float:
        """Samples trained per second of training time (idle waits left out)."""
        t = self.training_seconds
        return self.job_totals.samples / t if t > 0 else 0.0
