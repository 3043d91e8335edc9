"""The online loop: the placement follows the stream while training goes on.

:class:`OnlineLoop` runs on every rank around the training steps of :func:`trainer.run.run_rank`
and composes one small object per concern:

* the control vector (:mod:`trainer.online.control`): before each step one all-reduce decides,
  for every rank at once, whether to stop, repartition, switch placement or checkpoint;
* the record budget (:class:`RecordBudget`, ``--max-records``);
* the window feed (:class:`WindowFeed`): every sample trained reaches rank 0's partitioner;
* the repartitioner (:class:`Repartitioner`, rank 0): when a placement is due (interval, drift,
  cold start) and computing it in the partitioner process beside training;
* the placement chooser (:class:`AutoPlacement`, ``--placement auto``): graph kept only while
  the bytes the ranks send say it pays;
* the migration driver (:class:`MigrationDriver`): the new placement is broadcast, and rows move
  to their new owners one chunk between two steps;
* the checkpointer (:class:`Checkpointer`): checkpoint, then commit the offsets it covers;
* the publisher (:class:`Publisher`): the model's changes to the delta log serving follows;
* the stats (:class:`LoopStats`): bounded history, events and freshness for the report.

Between two steps, in this order: the window samples travel, a partition starts (rank 0), a
computed placement is switched to, one migration chunk moves, the changes are published, a
checkpoint is written.
"""

from __future__ import annotations

import logging
import math
from types import TracebackType
from typing import Any

import numpy as np

from partitioner import PartitionConfig, Placement, default_owner
from streaming import ClickBatch
from streaming.runtime import Clock
from trainer import checkpoint as ckpt
from trainer.counters import EMBEDDING_KINDS, KINDS, StepCounters
from trainer.dist import Comm
from trainer.online.auto import AutoPlacement
from trainer.online.budget import RecordBudget
from trainer.online.checkpointer import Checkpointer
from trainer.online.control import Control, Proposal, agree
from trainer.online.migration import MigrationDriver
from trainer.online.observe import Observer
from trainer.online.publisher import Publisher
from trainer.online.repartition import Repartitioner
from trainer.online.stats import LoopStats, StepRecord
from trainer.online.window import WindowFeed
from trainer.serving import DeltaSink
from trainer.sources import Source
from trainer.step import Trainer
from trainer.types import OnlineConfig, TrainConfig

__all__ = ["Diverged", "OnlineLoop"]

log = logging.getLogger(__name__)

# Steps between refreshes of the placement gauges (rows owned grow as rows are created).
_PUBLISH_EVERY = 10
# The traffic a placement changes (what --placement auto compares): the embedding path and the
# loop's own window, placement and migration traffic; not the dense all-reduce or the control.
_EMBEDDING = [KINDS.index(k) for k in EMBEDDING_KINDS]
_LOOP = [KINDS.index(k) for k in ("window", "placement", "migrate")]


class Diverged(RuntimeError):
    """The loss became NaN or infinite: the run stops before it checkpoints or commits."""


class OnlineLoop:
    """Repartitioning, live migration, checkpoints and the record budget around the steps.

    Args:
        comm: Collectives of the job.
        trainer: This rank's trainer.
        source: This rank's source (its offsets are committed after checkpoints).
        config: Online-loop settings.
        train: Training settings (batch, replica budget, warm-up for the cold start).
        clock: Time source.
        seed: Seed of the partitioner and of the window sampling.
        metrics: The rank's :class:`trainer.metrics.TrainerMetrics`, or None.
        observers: What sees the run from outside (told of migration chunks and checkpoints).
        schedule: A fixed placement schedule, ``(step, placement)`` pairs (instead of computed
            placements).
        partition: Compute placements from the stream (off: only the schedule moves rows).
        resumed: The checkpoint this run resumed from (None: a fresh start).
        extra: Settings recorded in checkpoints and checked at resume.
        sink: Where the delta log goes (None: no delta log).
        run_records: Records this run reads over all ranks (0: until the source ends or
            ``config.max_records``).
    """

    def __init__(self, comm: Comm, trainer: Trainer, source: Source, config: OnlineConfig,
                 train: TrainConfig, clock: Clock, *, seed: int = 0, metrics: Any = None,
                 observers: Observer | None = None,
                 schedule: tuple[tuple[int, Placement], ...] = (), partition: bool = True,
                 resumed: ckpt.Manifest | None = None,
                 extra: dict[str, Any] | None = None, sink: DeltaSink | None = None,
                 run_records: int = 0) -> None:
        self.comm, self.trainer, self.source, self.clock = comm, trainer, source, clock
        self.cfg, self.metrics = config, metrics
        self.rank, self.world = comm.rank, comm.world
        records = resumed.records if resumed is not None else 0
        self.schedule = dict(sorted(schedule))
        self.partition = partition and config.repartition.enabled
        self.stats = LoopStats(config.history, started_ms=clock.time() * 1000.0)
        self.budget = RecordBudget(config.max_records, self.rank, self.world, records,
                                   run_limit=run_records)
        self.window = WindowFeed(comm, trainer.n_fields, config.window, config.window_sample,
                                 seed)
        self.migrations = MigrationDriver(comm, trainer, config.migration_chunk_bytes,
                                          self.stats, clock, metrics=metrics,
                                          observers=observers)
        self.checkpointer = Checkpointer(
            comm, config.checkpoint_dir, config.checkpoint, config.keep_checkpoints, self.stats,
            clock, extra=extra or {}, records=records,
            resumed=None if resumed is None else (
                resumed.step, resumed.records, dict(resumed.offsets),
                resumed.model.publishes if resumed.model is not None else 0),
            metrics=metrics, observers=observers)
        self.publisher = Publisher(comm, trainer, sink, config.publish_interval, clock,
                                   root=config.checkpoint_dir,
                                   resumed=None if resumed is None else resumed.model)
        self.repartitioner: Repartitioner | None = None
        if self.rank == 0 and self.partition:
            pc = PartitionConfig(num_workers=self.world, global_batch=train.global_batch,
                                 replica_fraction=train.replica_fraction,
                                 replica_basis=train.replica_basis, seed=seed)
            # A placement restored from a checkpoint is repaired incrementally, not replaced.
            self.repartitioner = Repartitioner(
                trainer.n_fields, config.window, pc, config.repartition, train.warmup,
                config.drift_threshold, computed=trainer.placement.ids.size > 0,
                records=records, now=clock.monotonic())
        self.auto: AutoPlacement | None = None
        if train.placement == "auto" and self.partition:
            interval = config.repartition
            self.auto = AutoPlacement(interval.count or config.window, config.auto_margin,
                                      graph=trainer.placement.ids.size > 0, records=records)
            self._auto_routes()
        self._auto_says: str | None = None
        self._auto_reported = 0
        self._sent = comm.traffic.sent.copy()
        self._last = Proposal()
        self._caught_up_ms = -1  # when this rank's source was last seen caught up (wall ms)
        self._checkpoint_first_publish = (config.checkpoint_at_first_publish
                                          and self.checkpointer.enabled and resumed is None)
        self.moved_chunk = False
        self.checkpoint_seconds = 0.0

    # -- before a step -----------------------------------------------------------------------

    def control(self) -> Control:
        """The control all-reduce and everything decided by it (collective)."""
        rep, migrating = self.repartitioner, self.migrations.active
        resting = self.auto is not None and not self.auto.feeding
        due = rep is not None and rep.due(self.records, self.clock.monotonic(),
                                          migrating or resting)
        if due == "drift" and rep is not None:
            self.stats.event("drift", step=self.trainer.step_index, records=self.records,
                             level=rep.drift.level, baseline=rep.drift.baseline)
        sent = self.comm.traffic.sent.copy()
        delta, self._sent = sent - self._sent, sent
        ctl = agree(self.comm, Proposal(
            stop=self.comm.stop_requested(), repartition=bool(due),
            ready=rep is not None and rep.ready and not migrating,
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
        if rep is not None and ctl.samples:
            rep.observe(ctl.rows_not_held / ctl.samples, migrating)
        if self.auto is not None:
            # A placement about to be received counts as a migration: no decision this round.
            self._auto_says = self.auto.observe(
                records=self.records, samples=ctl.samples, embedding_bytes=ctl.embedding_bytes,
                loop_bytes=ctl.loop_bytes, hash_rows=ctl.hash_rows,
                migrating=migrating or ctl.ready)
            self._auto_report()
        return ctl

    def between_steps(self, ctl: Control) -> None:
        """Window, repartition, placement, migration chunk and checkpoint, as decided.

        Sets :attr:`moved_chunk` (a migration was in progress) and :attr:`checkpoint_seconds`
        (time spent checkpointing, which is not step time).
        """
        self.moved_chunk = self.migrations.active or ctl.ready
        self.checkpoint_seconds = 0.0
        finished = self.migrations.completed
        if int(ctl.window_words.sum()):
            self.window.exchange(ctl.window_words)
        if self._auto_says is not None:
            self._auto_switch(self._auto_says)
        if ctl.repartition and self.repartitioner is not None:
            kind = self.repartitioner.start(self.window.take(), self.trainer.placement,
                                            self.records, self.clock.monotonic())
            self.stats.event("repartition", step=self.trainer.step_index, records=self.records,
                             kind=kind)
        if ctl.ready:
            computed = self.repartitioner.take() if self.repartitioner is not None else None
            self.migrations.receive(computed, self.records)
            if self.auto is not None:
                self.auto.on_graph()
                self._auto_routes()
        elif not self.migrations.active and self.schedule:
            due = [s for s in self.schedule if s <= self.trainer.step_index]
            if due:
                self.migrations.start(self.schedule.pop(due[0]), self.records)
        if self.migrations.active:
            self.migrations.move_chunk(self.records)
        if self.migrations.completed != finished:
            if self.auto is not None:
                self.auto.on_migrated(self.records)
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
        if self.partition and (self.auto is None or self.auto.feeding):
            self.window.offer(batch.ids, tr.last_routed_in, tr.last_dest)
        newest = int(batch.timestamps_ms.max()) if len(batch) else -1
        self._last = Proposal(records=len(batch), rows_not_held=c.rows_not_held,
                              samples=c.samples_trained, hash_rows=self._hash_rows(batch, c),
                              diverged=not math.isfinite(c.loss_sum), newest_ms=newest,
                              behind=self._behind())
        fresh = self.stats.freshness_of(batch.timestamps_ms, self.clock.time() * 1000.0)
        self.stats.history.append(StepRecord(
            tr.step_index, self.records, c.rows_not_held, c.samples_trained,
            int(c.traffic.sent.sum()), seconds, migrating, tr.placement.version))
        if self.metrics is not None:
            self.metrics.on_step(c, seconds, fresh, migrating)
            if tr.step_index % _PUBLISH_EVERY == 0:
                self.publish_placement()

    def _hash_rows(self, batch: ClickBatch, c: StepCounters) -> int:
        """Rows this rank's batch fetches under hash: on hash, those it did not hold; on graph,
        the distinct ids it read that hash gives another rank (``--placement auto`` only)."""
        if self.auto is None:
            return 0
        if self.auto.on_hash:
            return c.rows_not_held
        ids = np.unique(batch.ids)
        return int(np.count_nonzero(default_owner(ids, self.world) != self.rank))

    def _auto_switch(self, says: str) -> None:
        """``--placement auto`` decided (every rank, the same step): back to hash, or try graph
        again after a rest."""
        self._auto_says = None
        rep = self.repartitioner
        if rep is not None:  # rank 0: the next partition is a cold start's, a warm-up on
            rep.cold(self.records, self.clock.monotonic())
        if says == "hash":
            self.window.clear()
            self.migrations.start(
                Placement.hash(self.world, version=self.trainer.placement.version + 1),
                self.records)
        self._auto_routes()

    def _auto_report(self) -> None:
        """A decision of ``--placement auto`` goes to the events and the metrics."""
        auto = self.auto
        assert auto is not None
        if len(auto.decisions) == self._auto_reported:
            return
        self._auto_reported = len(auto.decisions)
        d = auto.decisions[-1]
        self.stats.event("placement_auto", step=self.trainer.step_index, **d)
        self.publish_placement()

    def _auto_routes(self) -> None:
        if self.auto is not None and self.trainer.train_config.route == "auto":
            self.trainer.routes = self.auto.routes and self.world > 1

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
        self.metrics.on_placement(tr.placement.version, len(tr.store), len(tr.replicas),
                                  self.stats.sample_imbalance, self.stats.row_imbalance)
        if self.auto is not None:
            d = self.auto.decisions[-1] if self.auto.decisions else {}
            self.metrics.on_placement_choice(self.auto.state in ("trial", "graph"),
                                             d.get("hash_bytes_per_sample"),
                                             d.get("graph_bytes_per_sample"))

    def report(self) -> dict[str, Any]:
        """What the loop saw on this rank (plain data: it travels back from spawned ranks)."""
        return {**self.stats.report(),
                "placement_auto": None if self.auto is None else {
                    "state": self.auto.state, "decisions": list(self.auto.decisions)},
                "traffic_sent": {k: int(v) for k, v in zip(KINDS, self.comm.traffic.sent)},
                "records": self.records, "offsets": self.source.snapshot(),
                "publish": self.publisher.report()}

    def close(self) -> None:
        """Stop the partitioner (a placement still being computed is dropped) and the delta
        log's producer."""
        self.publisher.close()
        if self.repartitioner is not None:
            self.repartitioner.close()
            self.repartitioner = None

    def __enter__(self) -> OnlineLoop:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

