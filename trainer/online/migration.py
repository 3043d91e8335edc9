"""The migration driver: a new placement arrives, rows move to their owners a chunk at a time.

When rank 0's partitioner is done, :meth:`MigrationDriver.receive` broadcasts what changed
from the last placement every rank holds (a :class:`~hetgmp.partitioner.MigrationPlan` without its
row moves: the explicit entries assigned and released, the replicas added and dropped), and
every rank applies it: the bytes follow what a pass changed, not the table's size. The
difference travels as int64 words (:func:`plan_words`) by :func:`relay_broadcast`: rank 0
hands every rank a slice, then every rank hands its slice to every other, so that rank 0
sends about two copies rather than one to every rank (at 32 ranks it had sent 31 copies and
moved 2.8x the mean rank's bytes, :mod:`bench.scale`). Every rank
pushes its pending replica updates, switches to the new replica sets and starts a
:class:`~hetgmp.trainer.embedding.Migration`. Then one chunk of at most ``--migration-chunk-bytes``
moves between two steps (:func:`~hetgmp.trainer.embedding.move_chunk`) until every row has its new
owner (invariants 1 and 4: see :mod:`hetgmp.trainer.embedding.migrate`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from hetgmp.partitioner import MigrationPlan, Placement, plan_diff
from hetgmp.runtime import Clock
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.embedding import Migration, move_chunk, row_bytes
from hetgmp.trainer.online.observe import Observer
from hetgmp.trainer.online.repartition import PlacementResult
from hetgmp.trainer.online.stats import LoopStats
from hetgmp.trainer.step import Trainer

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
        words, head = np.zeros(0, np.int64), None
        if computed is not None:
            new, seconds, kind, moves = computed
            words = plan_words(plan_diff(base, new, self.row_size))
            head = (words.size, new.version, seconds, kind, moves)
        # The few values that size the transfer go as control-plane data (not counted).
        size, version, seconds, kind, moves = self.comm.broadcast_object(head)
        words = relay_broadcast(self.comm, words, size, "placement")
        placement = plan_of_words(words, base, version, self.row_size).apply(base)
        if self.comm.rank == 0:
            log.info("placement v%d computed (%s) in %.2f s%s", placement.version, kind, seconds,
                     "" if moves is None else f": {moves.describe()}")
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


def plan_words(plan: MigrationPlan) -> np.ndarray:
    """What rebuilds ``plan``'s new placement from its old one, as int64 words: the counts,
    the ids assigned and released, each worker's replicas added and dropped, then the
    assigned owners as int16, four to a word. The row moves do not travel: each rank derives
    them from the two placements."""
    n = plan.num_workers
    if n > np.iinfo(np.int16).max:
        raise ValueError(f"owners travel as int16: at most 32767 workers, not {n}")
    lists = [plan.assign_ids, plan.release_ids, *plan.replica_adds, *plan.replica_drops]
    owners = np.zeros(-(-plan.assign_owners.size // 4) * 4, np.int16)
    owners[:plan.assign_owners.size] = plan.assign_owners
    return np.concatenate([np.array([a.size for a in lists], np.int64), *lists,
                           owners.view(np.int64)])


def plan_of_words(words: np.ndarray, base: Placement, version: int,
                  row_bytes: int) -> MigrationPlan:
    """The plan :func:`plan_words` encoded, from ``base`` to placement ``version`` (without
    row moves)."""
    n = base.num_workers
    counts = words[:2 + 2 * n]
    ends = 2 + 2 * n + np.cumsum(counts)
    lists = [words[end - c:end] for c, end in zip(counts, ends)]
    assigned = int(counts[0])
    owners = words[int(ends[-1]):].view(np.int16)[:assigned]
    none = np.zeros(0, np.int64)
    return MigrationPlan(base.version, version, n, row_bytes, none, none.astype(np.int32),
                         none.astype(np.int32), lists[0], owners, lists[1],
                         tuple(lists[2:2 + n]), tuple(lists[2 + n:]))


def relay_broadcast(comm: Comm, words: np.ndarray, size: int, kind: str) -> np.ndarray:
    """Rank 0's ``size`` int64 ``words`` on every rank (collective; ``words`` matter on rank
    0 only): rank 0 sends rank r the r-th of ``world`` slices, then every rank sends its slice
    to every other. Rank 0 sends about 2 copies instead of ``world - 1``; all ranks together
    about ``world`` copies, as a broadcast from rank 0 alone would."""
    world, me = comm.world, comm.rank
    if world == 1:
        return words
    bounds = np.arange(world + 1, dtype=np.int64) * size // world
    lengths = np.diff(bounds)
    none = np.zeros(world, np.int64)
    mine = comm.host_all_to_all(
        words if me == 0 else words[:0], lengths if me == 0 else none,
        np.where(np.arange(world) == 0, lengths[me], 0), kind)
    return comm.host_all_to_all(np.tile(mine, world), np.full(world, lengths[me]), lengths, kind)
