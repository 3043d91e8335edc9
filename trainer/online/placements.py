"""Where the placements a run moves to come from: the loop's placement source.

The online loop (:mod:`hetgmp.trainer.online.loop`) asks its source, at fixed points that every rank
reaches together, what to propose in the control round, what to make of the round's sums, and
what to do between two steps; the migration driver then moves the rows. Two sources:

* :class:`StreamPlacements`: placements computed from the stream. Rank 0's repartitioner
  (:class:`~hetgmp.trainer.online.repartition.Repartitioner`) decides when a placement is due (an
  interval, drift, the cold start) and computes it in the partitioner process beside training,
  fed by the window (:class:`~hetgmp.trainer.online.window.WindowFeed`); with ``--placement auto``
  (:class:`~hetgmp.trainer.online.auto.AutoPlacement`) a graph placement is kept only while the bytes
  the ranks send say it pays, and hash comes back otherwise.
* :class:`FixedSchedule`: the placements of a given schedule, at its steps (tests, experiments).
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from hetgmp.partitioner import Placement, default_owner
from hetgmp.runtime import Clock
from hetgmp.streaming import ClickBatch
from hetgmp.trainer.dist import StepCounters
from hetgmp.trainer.online.auto import AutoPlacement
from hetgmp.trainer.online.control import Control
from hetgmp.trainer.online.migration import MigrationDriver
from hetgmp.trainer.online.repartition import Repartitioner
from hetgmp.trainer.online.stats import LoopStats
from hetgmp.trainer.online.window import WindowFeed
from hetgmp.trainer.step import Trainer

__all__ = ["FixedSchedule", "PlacementSource", "StreamPlacements"]


class PlacementSource(abc.ABC):
    """Where placements come from; every method is called by every rank at the same point."""

    #: Whether placements are computed from the stream.
    computes = False

    @property
    def feeding(self) -> bool:
        """Whether trained samples go to the partitioner's window."""
        return False

    def propose(self, records: int, now: float, migrating: bool) -> tuple[bool, bool]:
        """This rank's share of the control round: (a partition is due, a computed placement
        is ready to be switched to)."""
        return False, False

    def observe(self, ctl: Control, records: int, migrating: bool) -> bool:
        """What the control round's sums say (the drift level, ``--placement auto``'s bytes);
        whether ``--placement auto`` took a decision (its gauges are then out of date)."""
        return False

    @abc.abstractmethod
    def act(self, ctl: Control, records: int, now: float) -> None:
        """Between two steps, before the migration chunk: start a partition, hand a placement
        to the migration driver, or switch back to hash, as decided."""

    def on_migrated(self, records: int) -> None:  # noqa: B027 (optional: nothing by default)
        """A migration finished."""

    def hash_rows(self, batch: ClickBatch, c: StepCounters) -> int:
        """Rows this rank's batch fetches under hash (``--placement auto`` compares them)."""
        return 0

    def report(self) -> dict[str, Any] | None:
        """What ``--placement auto`` decided (None: no such choice)."""
        return None

    def choice(self) -> tuple[bool, float | None, float | None] | None:
        """``--placement auto``: (graph in force, hash's and graph's bytes a sample at the last
        decision); None without auto."""
        return None

    def close(self) -> None:  # noqa: B027 (optional: nothing by default)
        """Stop what runs beside training (a placement still being computed is dropped)."""


class FixedSchedule(PlacementSource):
    """The placements of ``schedule`` (``(step, placement)`` pairs), each once its step has
    come and no migration is in progress."""

    def __init__(self, schedule: tuple[tuple[int, Placement], ...], trainer: Trainer,
                 migrations: MigrationDriver) -> None:
        self.schedule = dict(sorted(schedule))
        self.trainer, self.migrations = trainer, migrations

    def act(self, ctl: Control, records: int, now: float) -> None:
        if self.migrations.active or not self.schedule:
            return
        due = [s for s in self.schedule if s <= self.trainer.step_index]
        if due:
            # Through the broadcast, as a computed placement comes: rank 0 sends it as a
            # difference from the last one, the others rebuild it (and tests of schedules
            # check that path).
            placement = self.schedule.pop(due[0])
            computed = (placement, 0.0, "scheduled", None) if self.trainer.comm.rank == 0 else None
            self.migrations.receive(computed, records)


class StreamPlacements(PlacementSource):
    """Placements computed from the stream (rank 0's ``repartitioner``; None elsewhere), with
    ``--placement auto``'s choice when ``auto`` is given.

    Args:
        trainer: This rank's trainer (its placement, routing).
        window: The window feed (rank 0 holds the samples).
        migrations: The migration driver.
        stats: Where events are logged.
        repartitioner: Rank 0's; None on the other ranks.
        auto: ``--placement auto``'s chooser (the same decisions on every rank), or None.
    """

    computes = True

    def __init__(self, trainer: Trainer, window: WindowFeed, migrations: MigrationDriver,
                 stats: LoopStats, clock: Clock, *, repartitioner: Repartitioner | None,
                 auto: AutoPlacement | None) -> None:
        self.trainer, self.window, self.migrations = trainer, window, migrations
        self.stats, self.clock = stats, clock
        self.repartitioner, self.auto = repartitioner, auto
        self.rank, self.world = trainer.comm.rank, trainer.comm.world
        self._says: str | None = None
        self._reported = 0
        self._records = 0  # records trained as of the last control round
        self.routes()

    @property
    def feeding(self) -> bool:
        return self.auto is None or self.auto.feeding

    def propose(self, records: int, now: float, migrating: bool) -> tuple[bool, bool]:
        rep = self.repartitioner
        if rep is None:
            return False, False
        due = rep.due(records, now, migrating or not self.feeding)
        if due == "drift":
            self.stats.event("drift", step=self.trainer.step_index, records=records,
                             level=rep.drift.level, baseline=rep.drift.baseline)
        return bool(due), rep.ready and not migrating

    def observe(self, ctl: Control, records: int, migrating: bool) -> bool:
        if self.repartitioner is not None and ctl.samples:
            self.repartitioner.observe(ctl.rows_not_held / ctl.samples, migrating)
        self._records = records
        if self.auto is None:
            return False
        # A placement about to be received counts as a migration: no decision this round.
        self._says = self.auto.observe(
            records=records, samples=ctl.samples, embedding_bytes=ctl.embedding_bytes,
            loop_bytes=ctl.loop_bytes, hash_rows=ctl.hash_rows, migrating=migrating or ctl.ready)
        return self._report()

    def act(self, ctl: Control, records: int, now: float) -> None:
        if self._says is not None:
            self._switch(self._says, records, now)
        rep = self.repartitioner
        if ctl.repartition and rep is not None:
            kind = rep.start(self.window.take(), self.trainer.placement, records, now)
            self.stats.event("repartition", step=self.trainer.step_index, records=records,
                             kind=kind)
        if ctl.ready:
            self.migrations.receive(rep.take() if rep is not None else None, records)
            if self.auto is not None:
                self.auto.on_graph()
                self.routes()

    def on_migrated(self, records: int) -> None:
        if self.auto is not None:
            self.auto.on_migrated(records)

    def hash_rows(self, batch: ClickBatch, c: StepCounters) -> int:
        """On hash, the rows the batch did not hold; on graph, the distinct ids it read that
        hash gives another rank (``--placement auto`` only)."""
        if self.auto is None:
            return 0
        if self.auto.on_hash:
            return c.rows_not_held
        ids = np.unique(self.trainer.blocks(batch).values)  # every block is a row
        return int(np.count_nonzero(default_owner(ids, self.world) != self.rank))

    def routes(self) -> None:
        """``--route auto`` under ``--placement auto``: samples are routed while graph is."""
        if self.auto is not None and self.trainer.train_config.route == "auto":
            self.trainer.routes = self.auto.routes and self.world > 1

    def report(self) -> dict[str, Any] | None:
        if self.auto is None:
            return None
        return self.auto.report(self._records)

    def choice(self) -> tuple[bool, float | None, float | None] | None:
        if self.auto is None:
            return None
        d = self.auto.decisions[-1] if self.auto.decisions else {}

        def figure(key: str) -> float | None:
            value = d.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        return (self.auto.state in ("trial", "graph"), figure("hash_bytes_per_sample"),
                figure("graph_bytes_per_sample"))

    def close(self) -> None:
        if self.repartitioner is not None:
            self.repartitioner.close()
            self.repartitioner = None

    def _switch(self, says: str, records: int, now: float) -> None:
        """``--placement auto`` decided (every rank, the same step): back to hash, or try graph
        again after a rest."""
        self._says = None
        if self.repartitioner is not None:  # rank 0: the next partition is a cold start's
            self.repartitioner.cold(records, now)
        if says == "hash":
            self.window.clear()
            self.migrations.start(
                Placement.hash(self.world, version=self.trainer.placement.version + 1), records)
        self.routes()

    def _report(self) -> bool:
        """A new decision of ``--placement auto`` goes to the events; whether there was one."""
        assert self.auto is not None
        if len(self.auto.decisions) == self._reported:
            return False
        self._reported = len(self.auto.decisions)
        self.stats.event("placement_auto", step=self.trainer.step_index,
                         **self.auto.decisions[-1])
        return True
