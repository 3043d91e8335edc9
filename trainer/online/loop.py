"""The online loop: the placement follows the stream while training goes on.

:class:`OnlineLoop` runs on every rank around the training steps of :func:`hetgmp.trainer.run.run_rank`
and orchestrates its parts (:class:`LoopParts`, built by :func:`build_parts`), one concern each:

* the control vector (:mod:`hetgmp.trainer.online.control`): before each step one all-reduce decides,
  for every rank at once, whether to stop, repartition, switch placement, publish or checkpoint;
* the record budget (:class:`RecordBudget`, ``--max-records``);
* the window feed (:class:`WindowFeed`): every sample trained reaches rank 0's partitioner;
* the placement source (:mod:`hetgmp.trainer.online.placements`): placements computed from the stream
  (rank 0's repartitioner, ``--placement auto``'s choice) or a fixed schedule;
* the migration driver (:class:`MigrationDriver`): the new placement is broadcast, and rows move
  to their new owners one chunk between two steps;
* the checkpointer (:class:`Checkpointer`): checkpoint, then commit the offsets it covers;
* the publisher (:class:`Publisher`): the model's changes to the delta log serving follows;
* the stats (:class:`LoopStats`): bounded history, events and freshness for the report.

Between two steps, in this order: the window samples travel, the placement source acts (a
partition starts on rank 0, a computed placement is switched to), one migration chunk moves, the
changes are published, a checkpoint is written.
"""

from __future__ import annotations

import logging
import math
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetgmp.partitioner import PartitionConfig, Placement
from hetgmp.runtime import Clock
from hetgmp.streaming import ClickBatch
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import EMBEDDING_KINDS, KINDS, Comm, StepCounters
from hetgmp.trainer.online.auto import AutoPlacement
from hetgmp.trainer.online.budget import RecordBudget
from hetgmp.trainer.online.checkpointer import Checkpointer
from hetgmp.trainer.online.config import OnlineConfig
from hetgmp.trainer.online.control import Control, Proposal, agree
from hetgmp.trainer.online.migration import MigrationDriver
from hetgmp.trainer.online.observe import Observer
from hetgmp.trainer.online.placements import FixedSchedule, PlacementSource, StreamPlacements
from hetgmp.trainer.online.publisher import Publisher
from hetgmp.trainer.online.repartition import Repartitioner
from hetgmp.trainer.online.stats import LoopStats, StepRecord
from hetgmp.trainer.online.window import WindowFeed
from hetgmp.trainer.serving import DeltaSink
from hetgmp.trainer.sources import Source
from hetgmp.trainer.step import TrainConfig, Trainer

__all__ = ["Diverged", "LoopParts", "OnlineLoop", "build_parts"]

log = logging.getLogger(__name__)

# Steps between refreshes of the placement gauges (rows owned grow as rows are created).
_PUBLISH_EVERY = 10
# The traffic a placement changes (what --placement auto compares): the embedding path and the
# loop's own window, placement and migration traffic; not the dense all-reduce or the control.
_EMBEDDING = [KINDS.index(k) for k in EMBEDDING_KINDS]
_LOOP = [KINDS.index(k) for k in ("window", "placement", "migrate")]


class Diverged(RuntimeError):
    """The loss became NaN or infinite: the run stops before it checkpoints or commits."""


@dataclass
class LoopParts:
    """The online loop's parts, one concern each (built by :func:`build_parts`).

    Attributes:
        budget: ``--max-records`` and this run's share of it.
        window: The samples trained, on their way to rank 0's partitioner.
        placements: Where new placements come from.
        migrations: Rows moving to the owners of a new placement, a chunk between two steps.
        checkpointer: Checkpoint, then commit the offsets it covers.
        publisher: The model's changes to the delta log.
        stats: Bounded history, events and freshness for the report.
    """

    budget: RecordBudget
    window: WindowFeed
    placements: PlacementSource
    migrations: MigrationDriver
    checkpointer: Checkpointer
    publisher: Publisher
    stats: LoopStats


def build_parts(comm: Comm, trainer: Trainer, config: OnlineConfig, train: TrainConfig,
                clock: Clock, stack: ExitStack, *, seed: int = 0, metrics: Any = None,
                observers: Observer | None = None,
                schedule: tuple[tuple[int, Placement], ...] = (), partition: bool = True,
                resumed: ckpt.Manifest | None = None, extra: dict[str, Any] | None = None,
                sink: DeltaSink | None = None, run_records: int = 0) -> LoopParts:
    """The loop's parts for one rank; what runs beside training (the partitioner process, the
    delta log's producer) is closed by ``stack``.

    Args:
        comm: Collectives of the job.
        trainer: This rank's trainer.
        config: Online-loop settings.
        train: Training settings (batch, replica budget, warm-up, ``--placement``).
        clock: Time source.
        stack: Where the parts that hold resources are entered.
        seed: Seed of the partitioner and of the window sampling.
        metrics: The rank's :class:`hetgmp.trainer.run.metrics.TrainerMetrics`, or None.
        observers: What sees the run from outside (told of migration chunks and checkpoints).
        schedule: A fixed placement schedule, ``(step, placement)`` pairs: the placement source
            instead of the stream.
        partition: Compute placements from the stream (off: only a schedule moves rows).
        resumed: The checkpoint this run resumed from (None: a fresh start).
        extra: Settings recorded in checkpoints and checked at resume.
        sink: Where the delta log goes (None: no delta log).
        run_records: Records this run reads over all ranks (0: until the source ends or
            ``config.max_records``).
    """
    rank, world = comm.rank, comm.world
    records = resumed.records if resumed is not None else 0
    stats = LoopStats(config.history, started_ms=clock.time() * 1000.0)
    budget = RecordBudget(config.max_records, rank, world, records, run_limit=run_records)
    # The window holds what the graph places: a column of ids a block of each row.
    window = WindowFeed(comm, trainer.widths.columns, config.window, config.window_sample, seed,
                        expand=trainer.blocks)
    migrations = MigrationDriver(comm, trainer, config.migration_chunk_bytes, stats, clock,
                                 metrics=metrics, observers=observers)
    checkpointer = Checkpointer(
        comm, config.checkpoint_dir, config.checkpoint, config.keep_checkpoints, stats, clock,
        extra=extra or {}, records=records, full_every=config.checkpoint_full_every,
        resumed=None if resumed is None else (
            resumed.step, resumed.records, dict(resumed.offsets),
            resumed.model.publishes if resumed.model is not None else 0),
        metrics=metrics, observers=observers)
    publisher = Publisher(comm, trainer, sink, config.publish_interval, clock,
                          root=config.checkpoint_dir,
                          resumed=None if resumed is None else resumed.model)
    stack.callback(publisher.close)
    placements: PlacementSource
    if partition and config.repartition.enabled:
        repartitioner = None
        if rank == 0:
            # Passes are judged under the routing the ranks use: batch-aware when the rounds are
            # fixed, `route` under auto (what it chose on every stream measured, and judging
            # under 3 rounds cost a pass 0.6 s more at 2 ranks, on the cores training uses).
            pc = PartitionConfig(num_workers=world, global_batch=train.global_batch,
                                 replica_fraction=train.replica_fraction,
                                 replica_basis=train.replica_basis, seed=seed,
                                 route_rounds=max(train.route_rounds, 0))
            # A placement restored from a checkpoint is repaired incrementally, not replaced.
            repartitioner = Repartitioner(
                trainer.widths.columns, config.window, pc, config.repartition, train.warmup,
                config.drift_threshold, computed=trainer.placement.ids.size > 0,
                records=records, now=clock.monotonic())
        auto = None
        if train.placement == "auto":
            auto = AutoPlacement(config.repartition.count or config.window, config.auto_margin,
                                 graph=trainer.placement.ids.size > 0, records=records)
        placements = StreamPlacements(trainer, window, migrations, stats, clock,
                                      repartitioner=repartitioner, auto=auto)
    else:
        placements = FixedSchedule(schedule, trainer, migrations)
    stack.callback(placements.close)
    return LoopParts(budget, window, placements, migrations, checkpointer, publisher, stats)


class OnlineLoop:
    """Repartitioning, live migration, checkpoints and the record budget around the steps: the
    orchestration of its :class:`LoopParts`.

    Args:
        comm: Collectives of the job.
        trainer: This rank's trainer.
        source: This rank's source (its offsets are committed after checkpoints).
        parts: The loop's parts (:func:`build_parts`).
        config: Online-loop settings.
        clock: Time source.
        metrics: The rank's :class:`hetgmp.trainer.run.metrics.TrainerMetrics`, or None.
        fresh_start: Not resumed from a checkpoint (a first checkpoint comes with the first
            publish under ``--checkpoint-interval auto``).
    """

    def __init__(self, comm: Comm, trainer: Trainer, source: Source, parts: LoopParts,
                 config: OnlineConfig, clock: Clock, *, metrics: Any = None,
                 fresh_start: bool = True) -> None:
        self.comm, self.trainer, self.source, self.clock = comm, trainer, source, clock
        self.cfg, self.metrics = config, metrics
        self.rank, self.world = comm.rank, comm.world
        self.budget, self.window, self.placements = parts.budget, parts.window, parts.placements
        self.migrations, self.checkpointer = parts.migrations, parts.checkpointer
        self.publisher, self.stats = parts.publisher, parts.stats
        self._sent = comm.traffic.sent.copy()
        self._last = Proposal()
        self._caught_up_ms = -1  # when this rank's source was last seen caught up (wall ms)
        self._checkpoint_first_publish = (config.checkpoint_at_first_publish
                                          and self.checkpointer.enabled and fresh_start)
        self.moved_chunk = False
        self.checkpoint_seconds = 0.0

    # -- before a step -----------------------------------------------------------------------

    def control(self) -> Control:
        """The control all-reduce and everything decided by it (collective)."""
        migrating = self.migrations.active
        due, ready = self.placements.propose(self.records, self.clock.monotonic(), migrating)
        sent = self.comm.traffic.sent.copy()
        delta, self._sent = sent - self._sent, sent
        ctl = agree(self.comm, Proposal(
            stop=self.comm.stop_requested(), repartition=due, ready=ready,
            checkpoint=self.rank == 0 and self.checkpointer.due_by_time(),
            publish=self.rank == 0 and self.publisher.due(),
            diverged=self._last.diverged, records=self._last.records, rows_not_held=self._last.rows_not_held,
            samples=self._last.samples, window=self.window.outgoing,
            embedding_bytes=int(delta[_EMBEDDING].sum()), loop_bytes=int(delta[_LOOP].sum()),
            hash_rows=self._last.hash_rows,
            rows_owned=len(self.trainer.store), newest_ms=self._last.newest_ms,
            behind=self._last.behind))
        self.publisher.observe(ctl.newest_ms, -1 if ctl.behind else self._caught_up_ms)
        self.stats.sample_imbalance = ctl.sample_imbalance or self.stats.sample_imbalance
        self.stats.row_imbalance = ctl.row_imbalance or self.stats.row_imbalance
        self._check_diverged(ctl.diverged)
        self.budget.count(ctl.records)
        # By records, the count just agreed on decides: deciding on rank 0 before it, a
        # checkpoint came one step late (an interval of 20,000 records at 2,048 a step was 11
        # steps, not 10).
        ctl.checkpoint = ctl.checkpoint or self.checkpointer.due_by_records(self.records)
        # The first publish of a fresh run is checkpointed too (--checkpoint-interval auto), so
        # hetgmp serve can start while the run trains (it loads a checkpoint, then follows the
        # log from the offsets it records). Every rank decides alike: ctl.publish was agreed.
        if ctl.publish and self._checkpoint_first_publish and not self.checkpointer.written:
            ctl.checkpoint = True
        ctl.stop = ctl.stop or self.budget.spent
        if self.placements.observe(ctl, self.records, migrating):
            self.publish_placement()
        return ctl

    def between_steps(self, ctl: Control) -> None:
        """Window, repartition, placement, migration chunk and checkpoint, as decided.

        Sets :attr:`moved_chunk` (a migration was in progress) and :attr:`checkpoint_seconds`
        (time spent checkpointing, which is not step time).
        """
        self.moved_chunk = self.migrations.active or ctl.ready
        self.checkpoint_seconds = 0.0
        finished = self.migrations.completed
        if ctl.window_words:
            self.window.exchange()
        self.placements.act(ctl, self.records, self.clock.monotonic())
        if self.migrations.active:
            self.migrations.move_chunk(self.records)
        if self.migrations.completed != finished:
            self.placements.on_migrated(self.records)
            self.publish_placement()
        if ctl.publish or ctl.checkpoint:
            self._check_last_loss()
        if ctl.publish:
            self.publisher.publish()
        if ctl.checkpoint:
            t0 = self.clock.monotonic()
            self.checkpoint()
            self.checkpoint_seconds = self.clock.monotonic() - t0

    def read_cap(self) -> int | None:
        """Most records this rank may read this step under ``--max-records`` (None: no cap)."""
        return self.budget.read_cap()

    # -- after a step ------------------------------------------------------------------------

    def after_step(self, batch: ClickBatch, c: StepCounters, seconds: float,
                   migrating: bool) -> None:
        """Account for a trained step: window samples, freshness, history, metrics."""
        tr = self.trainer
        if self.placements.feeding:
            self.window.offer(batch, tr.last_routed_in, tr.last_dest)
        newest = int(batch.timestamps_ms.max()) if len(batch) else -1
        self._last = Proposal(records=len(batch), rows_not_held=c.rows_not_held,
                              samples=c.samples_trained,
                              hash_rows=self.placements.hash_rows(batch, c),
                              diverged=not math.isfinite(c.loss_sum), newest_ms=newest,
                              behind=self._behind())
        fresh = self.stats.freshness_of(batch.timestamps_ms, self.clock.time() * 1000.0)
        self.stats.history.append(StepRecord(
            tr.step_index, self.records, c.rows_not_held, c.samples_trained,
            int(c.traffic.sent.sum()), seconds, migrating, tr.placement.version,
            int(c.traffic.sent[_EMBEDDING].sum())))
        if self.metrics is not None:
            self.metrics.on_step(c, seconds, fresh, migrating)
            self.metrics.on_route_choice(tr.route_choice.gauges())
            self.metrics.on_store(tr.store.counts())
            if tr.step_index % _PUBLISH_EVERY == 0:
                self.publish_placement()

    def note_read(self, n: int) -> None:
        """Records read for a step that trained nothing (counted at the next control round)."""
        self._last = Proposal(records=n, behind=self._behind())

    def _behind(self) -> bool:
        """Whether the source holds records it has not handed out; when it does not, the time
        is noted (a publish then says the model holds every record appended before it)."""
        if not self.source.caught_up():
            return True
        self._caught_up_ms = int(self.clock.time() * 1000)
        return False

    def settle(self) -> None:
        """Count the last step's records (collective): a run ended by ``--steps`` has no next
        control round to count them before its final checkpoint."""
        last = self._last
        t = self.comm.host_all_reduce_sum(np.array([last.records, int(last.diverged)]),
                                          "control")
        self._check_diverged(bool(t[1]))
        self.budget.count(int(t[0]))
        self._last = Proposal()

    def _check_last_loss(self) -> None:
        """Raise on every rank if any rank's last loss was not finite, before a publish or a
        checkpoint (collective).

        A step's loss is read back with the next step's counts, so the control round knows
        each rank's loss of the step before last; the last one is read here. A NaN row can
        spoil one rank's loss alone: the ranks agree (a small all-reduce) so that none goes
        on into the checkpoint's collectives while another stops.
        """
        bad = np.array([int(not self.trainer.loss_finite)])
        self._check_diverged(bool(self.comm.host_all_reduce_sum(bad, "control")[0]))

    def _check_diverged(self, diverged: bool) -> None:
        if diverged:  # every rank raises here, before anything is checkpointed
            raise Diverged(f"the training loss became NaN or infinite at step "
                           f"{self.trainer.step_index} (too high a learning rate, or inputs "
                           f"out of range?); nothing after the last checkpoint was saved or "
                           f"committed")

    # -- state -------------------------------------------------------------------------------

    @property
    def records(self) -> int:
        """Records read over all ranks (those of the run it resumed included)."""
        return self.budget.records

    @property
    def migrating(self) -> bool:
        """Whether a migration is in progress."""
        return self.migrations.active

    @property
    def window_held(self) -> int:
        """Samples rank 0 holds for the next partition."""
        return self.window.held

    def checkpoint(self, final: bool = False) -> ckpt.Manifest | None:
        """Write a checkpoint and then commit the Kafka offsets it covers (collective)."""
        return self.checkpointer.write(self.trainer, self.source, self.records,
                                       publisher=self.publisher, final=final)

    def finish(self) -> ckpt.Manifest | None:
        """The end of a run (collective): count the last step, push every pending update to
        its owner, publish it, and checkpoint (final when the broker stored every delta)."""
        self.settle()
        self._check_last_loss()
        if self.publisher.enabled:
            self.trainer.flush()
            self.publisher.publish()
        stored = self.publisher.flush()
        return self.checkpoint(final=stored)

    def publish_placement(self) -> None:
        """Export the placement in force (version, rows owned and replicated, row balance)."""
        if self.metrics is None:
            return
        tr = self.trainer
        self.metrics.on_placement(tr.placement.version, tr.store.rows, len(tr.replicas),
                                  self.stats.sample_imbalance, self.stats.row_imbalance)
        choice = self.placements.choice()
        if choice is not None:
            self.metrics.on_placement_choice(*choice)

    def report(self) -> dict[str, Any]:
        """What the loop saw on this rank (plain data: it travels back from spawned ranks)."""
        return {**self.stats.report(),
                "placement_auto": self.placements.report(),
                "batch_routing": self.trainer.route_choice.report(),
                "traffic_sent": {k: int(v) for k, v in zip(KINDS, self.comm.traffic.sent)},
                "traffic_received": {k: int(v) for k, v in
                                     zip(KINDS, self.comm.traffic.received)},
                "traffic_calls": {k: int(v) for k, v in zip(KINDS, self.comm.traffic.calls)},
                "records": self.records, "offsets": self.source.snapshot(),
                "publish": self.publisher.report()}


