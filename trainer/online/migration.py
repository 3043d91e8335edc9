"""The migration driver: a new placement arrives, rows move to their owners a chunk at a time.

When rank 0's partitioner is done, :meth:`MigrationDriver.receive` broadcasts what changed
from the last placement every rank holds (a :class:`~partitioner.MigrationPlan` without its
row moves: the explicit entries assigned and released, the replicas added and dropped), and
every rank applies it: the bytes follow what a pass changed, not the table's size. Every rank
pushes its pending replica updates, switches to the new replica sets and starts a
:class:`~trainer.embedding.Migration`. Then one chunk of at most ``--migration-chunk-bytes``
moves between two steps (:func:`~trainer.embedding.move_chunk`) until every row has its new
owner (invariants 1 and 4: see :mod:`trainer.embedding.migrate`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from partitioner import MigrationPlan, Placement, plan_diff
from runtime import Clock
from trainer.dist import Comm
from trainer.embedding import Migration, move_chunk, row_bytes
from trainer.online.observe import Observer
from trainer.online.repartition import PlacementResult
from trainer.online.stats import LoopStats
from trainer.step import Trainer

__all__ = ["MigrationDriver"]

log = logging.getLogger(__name__)


class MigrationDriver:
    """Placement switches and the migration in progress, on one rank.

    Args:
        comm: Collectives of the job.
        trainer: This rank's trainer.
        chunk_bytes: Most bytes of rows moved between two steps.
        stats: Where events are logged.
        clock: Time source.
        metrics: The rank's metrics (None: none).
        observers: Told after a migration starts (chunk 0) and after every chunk.
    """

    def __init__(self, comm: Comm, trainer: Trainer, chunk_bytes: int, stats: LoopStats,
                 clock: Clock, *, metrics: Any = None, observers: Observer | None = None
                 ) -> None:
        self.comm, self.trainer, self.chunk_bytes = comm, trainer, chunk_bytes
        self.stats, self.clock, self.metrics = stats, clock, metrics
        self.observers = observers or Observer()
        store = trainer.store
        self.row_size = row_bytes(store.dim, store.optimizer.state_width, trainer.dtype)
        self.migration: Migration | None = None
        self.completed = 0
        self._started = 0.0
        self._bytes = 0
        self._chunks = 0
        self._rows_sent = 0
        # The last placement every rank started (equal on all ranks): what the next one is
        # sent as a difference from.
        self._base: Placement | None = None

    @property
    def active(self) -> bool:
        """A migration is in progress."""
        return self.migration is not None

    def receive(self, computed: PlacementResult | None, records: int) -> None:
        """Broadcast rank 0's new placement, as its difference from the last one, and start
        moving to it (collective; ``computed`` is rank 0's, None elsewhere)."""
        base = self._base if self._base is not None else self.trainer.placement
        sent = None
        if computed is not None:
            new, seconds, kind, moves = computed
            sent = (_table_changes(plan_diff(base, new, self.row_size)), seconds, kind, moves)
        diff, seconds, kind, moves = self.comm.broadcast_object(sent)
        placement = diff.apply(base)
        size = diff.assign_ids.nbytes + diff.assign_owners.nbytes + diff.release_ids.nbytes + sum(
            a.nbytes for a in (*diff.replica_adds, *diff.replica_drops))
        if self.comm.rank == 0:
            self.comm.traffic.add("placement", size * (self.comm.world - 1), 0)
            log.info("placement v%d computed (%s) in %.2f s%s", placement.version, kind, seconds,
                     "" if moves is None else f": {moves.describe()}")
        else:
            self.comm.traffic.add("placement", 0, size)
        self.stats.event("placement", step=self.trainer.step_index, records=records,
                         version=placement.version, seconds=seconds, kind=kind,
                         moves=None if moves is None else dataclasses.asdict(moves))
        if self.metrics is not None and kind != "scheduled":  # a schedule is no repartition
            self.metrics.on_repartition(seconds, kind, moves)
        self.start(placement, records)

    def start(self, placement: Placement, records: int) -> None:
        """Push pending replica updates, switch replica sets, and plan the move (collective)."""
        tr = self.trainer
        self._base = placement
        tr.flush()
        tr.replace_replicas(placement.replicas)
        self.migration = m = Migration(tr.placement, placement, self.row_size, self.chunk_bytes)
        tr.set_placement(m.current())
        self.observers.on_migration_chunk(0, m.finished)
        self._started, self._bytes, self._chunks = self.clock.monotonic(), 0, 0
        self.stats.placements += 1
        if self.comm.rank == 0:
            log.info("migrating to placement v%d: %d rows change owner (%.1f MB) in %d chunk(s)",
                     placement.version, m.total, m.total * self.row_size / 1e6, m.chunks)
        self.stats.event("migration_start", step=tr.step_index, records=records,
                         version=placement.version, ids=m.total, chunks=m.chunks)
        if m.finished:
            self._finish(records)

    def move_chunk(self, records: int) -> None:
        """Move the next chunk (collective)."""
        m = self.migration
        assert m is not None
        ids, src, dst = m.next_chunk()
        before = self.comm.traffic.copy()
        tr = self.trainer
        report = move_chunk(tr.comm, tr.store, tr.replicas, ids, src, dst, tr.step_index)
        self.trainer.set_placement(m.advance())
        self._bytes += int((self.comm.traffic - before).sent.sum())
        self._chunks += 1
        self._rows_sent += report.rows_sent
        if self.metrics is not None:
            self.metrics.on_migration_chunk(report.rows_sent, report.bytes_sent)
        self.observers.on_migration_chunk(self._chunks, m.finished)
        if m.finished:
            self._finish(records)

    def _finish(self, records: int) -> None:
        m = self.migration
        assert m is not None
        seconds = self.clock.monotonic() - self._started
        rows = int(sum(self.comm.all_gather_object(self._rows_sent)))
        self._rows_sent = 0
        self.stats.event("migration_done", step=self.trainer.step_index, records=records,
                         version=m.new.version, rows_moved=rows, ids=m.total, seconds=seconds,
                         bytes=self._bytes)
        if self.comm.rank == 0:
            log.info("placement v%d in force: %d rows moved in %.2f s", m.new.version, rows,
                     seconds)
        if self.metrics is not None:
            self.metrics.on_migration_done(seconds)
        self.migration = None
        self.completed += 1


def _table_changes(plan: MigrationPlan) -> MigrationPlan:
    """``plan`` without its row moves (each rank derives those from the placements): what
    travels to rebuild the new placement from the old one."""
    none = plan.moved_ids[:0]
    return dataclasses.replace(plan, moved_ids=none, src=plan.src[:0], dst=plan.dst[:0])
