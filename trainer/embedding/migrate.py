"""Live migration: move rows to the owners of a new placement, a bounded chunk between steps.

A :class:`Migration` walks the rows whose owner changes (``plan_diff`` of the placement in force
and the new one) in chunks of at most ``chunk_bytes``. Each chunk is one collective call,
:func:`move_chunk`, made by every rank between two training steps:

1. no rank holds a copy of a chunk row it is about to own (a placement never replicates a row
   where it is owned, and the replica sets switched to the new placement's, every pending
   update pushed, when the migration started), so no copy's unpushed updates are left behind
   when a rank starts reading the row itself; each rank checks this locally, without a
   collective, and stops the job if it is ever broken;
2. each old owner copies the chunk rows it has (value, optimizer state, version) and sends them
   to their new owners; rows never created move nothing (any owner creates the same initial row,
   :func:`hetgmp.trainer.embedding.initial_rows`);
3. new owners install the rows; only then do old owners drop theirs, and every rank switches
   to the placement in which the chunk has moved.

No training step runs while a chunk is in flight (a step is a sequence of collectives every
rank enters; the chunk's collective sits between two of them), so at every step each id has
exactly one owner, the one the transitional placement names, and that owner holds the row with
every update applied so far (invariants 1 and 4). Replica sets switch to the new placement's
when the migration starts, after every pending replica update was pushed: copies kept in both
sets stay, new ones start empty and are filled at their first read. A copy whose row changes
owner is refreshed at its next read (the new owner has no count of its lag).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from hetgmp.partitioner import MigrationPlan, Placement, plan_diff
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.embedding.replicas import ReplicaTable
from hetgmp.trainer.embedding.store import EmbeddingStore

__all__ = ["Migration", "ChunkReport", "move_chunk", "row_bytes"]


def row_bytes(dim: int, state_width: int, dtype: torch.dtype) -> int:
    """Bytes one migrating row costs: value, optimizer state, id and version."""
    return (dim + state_width) * torch.empty(0, dtype=dtype).element_size() + 16


@dataclass
class ChunkReport:
    """What one chunk did on one rank."""

    ids: int = 0
    rows_sent: int = 0
    rows_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0


class Migration:
    """The move from the placement in force to ``new``, cut into chunks.

    Every rank builds the same object from the same two placements, so every rank knows every
    chunk without further messages.

    Args:
        old: The placement in force (what the store holds now).
        new: The placement to reach.
        row_size: Bytes per migrating row (:func:`row_bytes`).
        chunk_bytes: Most bytes a chunk moves (at least one row per chunk).
    """

    def __init__(self, old: Placement, new: Placement, row_size: int, chunk_bytes: int) -> None:
        if old.num_workers != new.num_workers:
            raise ValueError("a migration keeps the number of workers")
        self.old, self.new = old, new
        self.plan: MigrationPlan = plan_diff(old, new, row_size)
        self.chunk_rows = max(1, chunk_bytes // max(row_size, 1))
        self._ids = np.union1d(old.ids, new.ids).astype(np.int64)
        self._owners = old.owner_of(self._ids).astype(np.int32)
        moved = self.plan.moved_ids
        self._pos = np.searchsorted(self._ids, moved)
        self.done = 0
        self._in_force: Placement | None = None

    @property
    def total(self) -> int:
        """Ids whose owner changes."""
        return int(self.plan.moved_ids.size)

    @property
    def chunks(self) -> int:
        """Chunks the migration takes."""
        return math.ceil(self.total / self.chunk_rows)

    @property
    def finished(self) -> bool:
        """Every chunk has moved."""
        return self.done >= self.total

    def next_chunk(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The next chunk's ids, old owners and new owners (not yet marked done)."""
        lo, hi = self.done, min(self.done + self.chunk_rows, self.total)
        p = self.plan
        return p.moved_ids[lo:hi], p.src[lo:hi], p.dst[lo:hi]

    def advance(self) -> Placement:
        """Mark the next chunk moved; the placement in force from now on."""
        lo, hi = self.done, min(self.done + self.chunk_rows, self.total)
        self._owners[self._pos[lo:hi]] = self.plan.dst[lo:hi]
        self.done = hi
        before = self._in_force
        now = self.current()
        if before is not None and now is not self.new:
            # Same ids and replica sets as the step before but for this chunk's rows.
            now.inherit_holders(before, self.plan.moved_ids[lo:hi])
        self._in_force = now
        return now

    def current(self) -> Placement:
        """The placement in force: chunks done have their new owners, the rest their old ones.

        Replicas are the new placement's, less the rows a worker owns at this point (a copy
        of a row still owned there waits, empty, for the row to move away).
        """
        if self.finished:
            return self.new
        owners = self._owners.copy()
        staged = Placement(self.old.version, self.old.num_workers, self._ids, owners)
        replicas = tuple(r[staged.owner_of(r) != w] for w, r in enumerate(self.new.replicas))
        placement = Placement(self.old.version, self.old.num_workers, self._ids, owners, replicas)
        self._in_force = placement
        return placement


def move_chunk(comm: Comm, store: EmbeddingStore, replicas: ReplicaTable,
               ids: np.ndarray, src: np.ndarray, dst: np.ndarray, step: int) -> ChunkReport:
    """Hand the rows of one chunk to their new owners (collective: every rank calls it).

    Args:
        comm: Collectives of the job.
        store: This rank's rows.
        replicas: This rank's copies (none may be of a row coming here).
        ids: The chunk's ids (same on every rank), ``src`` their owners now, ``dst`` the new.
        step: The current step (last use of the installed rows).

    Returns:
        What this rank sent and received.
    """
    me, world = comm.rank, comm.world
    report = ChunkReport(ids=int(ids.size))
    # 1. No copy here of a row coming here (see the module docstring): its updates would be
    # lost. This used to be a flush of those copies, which cost three collectives a chunk and
    # could never push anything.
    incoming = ids[dst == me]
    held = incoming[replicas.slots(incoming) >= 0]
    if held.size:
        raise RuntimeError(f"rank {me} holds copies of {held.size} row(s) it is about to own "
                           f"(e.g. id {int(held[0])}): replica sets and placement out of step")
    # 2. Old owners send what they have, grouped by new owner.
    out = src == me
    mine, to = ids[out], dst[out]
    have = store.contains(mine)
    mine, to = mine[have], to[have]
    perm = np.argsort(to, kind="stable")
    mine, to = mine[perm], to[perm]
    values, state = store.lookup(mine, step, with_state=True) if mine.size else (None, None)
    versions = store.versions(mine)
    counts = np.bincount(to, minlength=world).astype(np.int64)
    heard = comm.exchange_counts(counts[:, None], "migrate")[:, 0]
    ints = np.stack([mine, versions], axis=1).reshape(-1)
    ints_in = comm.all_to_all(torch.from_numpy(np.ascontiguousarray(ints)).to(comm.device),
                              2 * counts, 2 * heard, "migrate").cpu().numpy().reshape(-1, 2)
    width = store.dim + store.optimizer.state_width
    if values is not None:
        assert state is not None
        floats = torch.cat([values, state], dim=1).reshape(-1)
    else:
        floats = torch.zeros(0, dtype=store.dtype, device=comm.device)
    floats_in = comm.all_to_all(floats, width * counts, width * heard, "migrate").view(-1, width)
    # 3. New owners install; then old owners let go.
    store.put(ints_in[:, 0], floats_in[:, :store.dim], floats_in[:, store.dim:], ints_in[:, 1],
              step)
    store.take(mine)
    size = row_bytes(store.dim, store.optimizer.state_width, store.dtype)
    report.rows_sent = int(mine.size - counts[me])
    report.rows_received = int(ints_in.shape[0] - heard[me])
    report.bytes_sent = report.rows_sent * size
    report.bytes_received = report.rows_received * size
    return report
