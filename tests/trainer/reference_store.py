"""A numpy implementation of the embedding store's contract, the reference the real store
(:class:`hetgmp.trainer.embedding.EmbeddingStore`, in tensors) is checked against on long random
streams: the same calls must give the same rows, decisions and counts.

It is the host store the project trained with until the store moved whole onto the device: its
id index (:class:`hetgmp.partitioner.IdIndex`), versions, last use, free list and admission counts are
numpy arrays, so every decision is plain to read here.
"""

from __future__ import annotations

import numpy as np
import torch

from hetgmp.partitioner import IdIndex
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.embedding.optimizer import RowOptimizer, initial_rows
from hetgmp.trainer.embedding.store import StoreSize, StoreStats

__all__ = ["ReferenceStore"]

class ReferenceStore(StoreSize):
    """Rows owned by one rank (primaries), created on demand, updated by the owner only."""

    _index: IdIndex
    _cand: IdIndex

    def __init__(
        self,
        dim: int,
        config: StoreConfig | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        capacity: int = 1024,
    ) -> None:
        """Create an empty store.

        Args:
            dim: Row width.
            config: Store settings.
            dtype: Float type of values and optimizer state.
            device: Where rows live.
            capacity: Initial row capacity (grows by doubling).
        """
        self.config = c = config or StoreConfig()
        self.dim = dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.optimizer = RowOptimizer(c)
        self.stats = StoreStats()
        self._index = IdIndex(2 * capacity)
        cap = max(16, capacity)
        self._values = torch.zeros((cap, dim), dtype=dtype, device=self.device)
        self._state = torch.zeros((cap, c.state_width), dtype=dtype, device=self.device)
        self._ids = np.full(cap, -1, dtype=np.int64)
        self._version = np.zeros(cap, dtype=np.int64)
        self._last_used = np.zeros(cap, dtype=np.int64)
        self._changed = np.zeros(cap, dtype=bool)  # since it was last published
        self._tombstones: list[np.ndarray] | None = None
        self._free = np.arange(cap - 1, -1, -1, dtype=np.int64)  # a stack: pop from the end
        self._pinned = np.zeros(0, dtype=np.int64)
        self._last_step = 0  # the latest step a lookup was made for
        # Admission candidates: ids seen in fewer than admit_after steps (counts only, no rows).
        self._cand = IdIndex(64)
        self._cand_count = np.zeros(0, dtype=np.int64)
        self._cand_last = np.zeros(0, dtype=np.int64)

    # -- size --------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes held by rows, optimizer state, metadata and both indexes."""
        rows = self._values.numel() * self._values.element_size()
        state = self._state.numel() * self._state.element_size()
        meta = self._ids.nbytes + self._version.nbytes + self._last_used.nbytes + \
            self._changed.nbytes + self._free.nbytes
        cand = self._cand.nbytes + self._cand_count.nbytes + self._cand_last.nbytes
        return int(rows + state + meta + self._index.nbytes + cand)

    # -- rows --------------------------------------------------------------------------------

    def pin(self, ids: np.ndarray) -> None:
        """Rows that are never evicted and are admitted at first use (replicated rows).

        Rows that leave the pinned set count as used at the latest step looked up: their copies'
        reads within the staleness bound never touch the owner's store, so their last use is
        not otherwise known, and they are not to be evicted for it.
        """
        pinned = np.unique(np.asarray(ids, dtype=np.int64))
        released = np.setdiff1d(self._pinned, pinned, assume_unique=True)
        if released.size:
            slots = self._index.find(released)
            self._last_used[slots[slots >= 0]] = self._last_step
        self._pinned = pinned

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id has a row."""
        return self._index.find(ids) >= 0

    def versions(self, ids: np.ndarray) -> np.ndarray:
        """Version (updates applied) of each id's row; 0 for ids without a row."""
        slots = self._index.find(ids)
        return np.where(slots >= 0, self._version[np.maximum(slots, 0)], 0)

    def peek(self, ids: np.ndarray) -> torch.Tensor:
        """Values of rows without creating or touching them (initial values for absent ids)."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = self._index.find(ids)
        out = self._initial(ids)
        have = np.flatnonzero(slots >= 0)
        if have.size:
            out[torch.from_numpy(have).to(self.device)] = self._values[self._t(slots[have])]
        return out

    def lookup(
        self, ids: np.ndarray, step: int, *, with_state: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Values (and optionally optimizer state) of unique ids used in ``step``.

        Admitted ids without a row get one (initial value, fresh state, version 0); ids not yet
        admitted read their initial value and keep no row. Every id read is marked used.

        Args:
            ids: Unique int64 ids.
            step: The current step (for admission counting and eviction).
            with_state: Also return the optimizer state (to ship a row to a replica).

        Returns:
            (values ``[n, dim]``, state ``[n, state_width]`` or None).
        """
        ids = np.asarray(ids, dtype=np.int64)
        self._last_step = max(self._last_step, step)
        self.stats.looked_up += int(ids.size)
        slots = self._index.find(ids)
        missing = np.flatnonzero(slots < 0)
        if missing.size:
            admit = missing[self._admit(ids[missing], step)]
            if admit.size:
                slots[admit] = self._create(ids[admit])
        have = slots >= 0
        self._last_used[slots[have]] = step
        values = torch.empty((ids.size, self.dim), dtype=self.dtype, device=self.device)
        state = None
        if with_state:
            state = self.optimizer.initial_state(ids.size, self.dtype, self.device)
        if bool(have.all()):
            t = self._t(slots)
            values = self._values.index_select(0, t)
            if state is not None:
                state = self._state.index_select(0, t)
            return values, state
        rows, absent = np.flatnonzero(have), np.flatnonzero(~have)
        self.stats.not_admitted_reads += int(absent.size)
        values.index_copy_(0, self._t(absent), self._initial(ids[absent]))
        if rows.size:
            t, src = self._t(rows), self._t(slots[rows])
            values.index_copy_(0, t, self._values.index_select(0, src))
            if state is not None:
                state.index_copy_(0, t, self._state.index_select(0, src))
        return values, state

    def apply(self, ids: np.ndarray, grads: torch.Tensor, counts: np.ndarray,
              increments: torch.Tensor | None = None) -> np.ndarray:
        """Apply one optimizer step per row with its summed gradient; version += its count.

        Args:
            ids: Unique int64 ids.
            grads: ``[n, dim]`` gradient of each row, summed over every contribution.
            counts: int64 ``[n]`` updates the gradient stands for (contributions).
            increments: Optimizer-state increments ``[n, state_width]`` to use instead of
                those of ``grads`` (see :meth:`RowOptimizer.step`).

        Returns:
            Whether each row was there to update (updates of rows without one are dropped).
        """
        slots = self._index.find(ids)
        applied = slots >= 0
        have = np.flatnonzero(applied)
        self.stats.dropped_updates += int(ids.size - have.size)
        if have.size == 0:
            return applied
        s = slots[have]
        h = None if have.size == ids.size else self._t(have)
        g = grads if h is None else grads[h]
        inc = increments if increments is None or h is None else increments[h]
        # Slots are distinct (ids are unique), as RowOptimizer.step requires.
        self.optimizer.step(self._values, self._state, self._t(s), g, inc)
        self._version[s] += np.asarray(counts, dtype=np.int64)[have]
        self._changed[s] = True
        return applied

    def ids(self) -> np.ndarray:
        """Ids that have a row, sorted."""
        return np.sort(self._index.items()[0])

    def export(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """Every row: (ids sorted, values, optimizer state, versions)."""
        ids, slots = self._index.items()
        order = np.argsort(ids)
        ids, slots = ids[order], slots[order]
        t = self._t(slots)
        return ids, self._values[t].clone(), self._state[t].clone(), self._version[slots].copy()

    # -- migration ---------------------------------------------------------------------------

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """Remove the rows of ``ids`` that exist and return them (to hand to a new owner).

        Returns:
            (ids that had a row, values, optimizer state, versions), in the order of ``ids``.
        """
        ids = np.asarray(ids, dtype=np.int64)
        slots = self._index.find(ids)
        have = slots >= 0
        ids, slots = ids[have], slots[have]
        t = self._t(slots)
        values, state = self._values[t].clone(), self._state[t].clone()
        versions = self._version[slots].copy()
        self._index.remove(ids)
        self._ids[slots] = -1
        self._free = np.concatenate([self._free, slots[::-1]])
        return ids, values, state, versions

    def put(self, ids: np.ndarray, values: torch.Tensor, state: torch.Tensor,
            versions: np.ndarray, step: int, *, published: bool = False) -> None:
        """Install rows handed over by their previous owner (replacing any row of those ids).

        Args:
            ids: Unique int64 ids.
            values: ``[n, dim]`` their values.
            state: ``[n, state_width]`` their optimizer state.
            versions: int64 ``[n]`` their versions (updates applied so far).
            step: The current step (counts as their last use).
            published: The delta log holds them already (restored from a checkpoint), rather
                than this rank having to publish them (moved in by a migration).
        """
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return
        slots = self._index.find(ids)
        new = np.flatnonzero(slots < 0)
        if new.size:
            slots[new] = self._create(ids[new])
            self.stats.created -= int(new.size)  # moved in, not created
        t = self._t(slots)
        self._values[t] = values.to(device=self.device, dtype=self.dtype)
        self._state[t] = state.to(device=self.device, dtype=self.dtype)
        self._version[slots] = np.asarray(versions, dtype=np.int64)
        self._last_used[slots] = step
        self._changed[slots] = not published

    # -- the delta log -----------------------------------------------------------------------

    def changes(self) -> tuple[np.ndarray, torch.Tensor]:
        """Rows whose value changed since the last call (or :meth:`unpublish`), ids sorted,
        with their values; they count as published from now on."""
        ids, slots = self._index.items()
        changed = self._changed[slots]
        ids, slots = ids[changed], slots[changed]
        order = np.argsort(ids)
        ids, slots = ids[order], slots[order]
        self._changed[slots] = False
        return ids, self._values.index_select(0, self._t(slots))

    def unpublish(self, ids: np.ndarray | None = None) -> None:
        """Count rows ``ids`` (every row: None) as changed, to publish them again (a send
        failed, or the log holds values these rows do not)."""
        if ids is None:
            self._changed[:] = True
            return
        slots = self._index.find(np.asarray(ids, dtype=np.int64))
        self._changed[slots[slots >= 0]] = True

    def track_evictions(self, on: bool = True) -> None:
        """Keep a tombstone for every evicted row that was ever updated (off: keep none)."""
        self._tombstones = [] if on else None

    def take_tombstones(self) -> np.ndarray:
        """Ids evicted since the last call that were ever updated (sorted)."""
        if not self._tombstones:
            return np.zeros(0, np.int64)
        ids = np.unique(np.concatenate(self._tombstones))
        self._tombstones = []
        return ids

    # -- memory bound ------------------------------------------------------------------------

    def maintain(self, step: int) -> int:
        """Evict rows unused for ``evict_after`` steps and the least recent above ``max_rows``.

        Called between steps (never between a step's reads and its updates). Returns the
        number of rows evicted.
        """
        c = self.config
        ids, slots = self._index.items()
        evict = np.zeros(ids.size, dtype=bool)
        if c.evict_after:
            evict |= self._last_used[slots] < step - c.evict_after
        pinned = np.isin(ids, self._pinned) if self._pinned.size else np.zeros(ids.size, bool)
        evict &= ~pinned
        if c.max_rows and ids.size - int(evict.sum()) > c.max_rows:
            # Least recently used first; ties by id so every run evicts the same rows. Down to
            # a low-water mark below the cap, so that the next steps' new rows fit under it
            # and the scan runs once in many steps, not every step at the cap.
            order = np.lexsort((ids, self._last_used[slots]))
            order = order[~evict[order] & ~pinned[order]]
            excess = ids.size - int(evict.sum()) - self.low_water
            evict[order[:excess]] = True
        self._prune_candidates(step)
        if not evict.any():
            return 0
        gone = slots[evict]
        if self._tombstones is not None:
            # A row never updated holds its initial value: serving has nothing to drop.
            self._tombstones.append(ids[evict][self._version[gone] > 0])
        self._ids[gone] = -1
        self._free = np.concatenate([self._free, gone[::-1]])
        self._index.rebuild(ids[~evict], slots[~evict])
        self.stats.evicted += int(gone.size)
        return int(gone.size)

    # -- internals ---------------------------------------------------------------------------

    def _t(self, index: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64)).to(self.device)

    def _initial(self, ids: np.ndarray) -> torch.Tensor:
        rows = initial_rows(ids, self.dim, self.config.seed, self.config.init_scale)
        return torch.from_numpy(rows).to(device=self.device, dtype=self.dtype)

    def _create(self, ids: np.ndarray) -> np.ndarray:
        n = ids.size
        if n > self._free.size:
            self._grow(n)
        slots = self._free[-n:][::-1].copy()
        self._free = self._free[:-n]
        t = self._t(slots)
        self._values.index_copy_(0, t, self._initial(ids))
        self._state.index_copy_(0, t, self.optimizer.initial_state(n, self.dtype, self.device))
        self._ids[slots] = ids
        self._version[slots] = 0
        self._changed[slots] = False
        self._index.insert(ids, slots)
        self.stats.created += n
        return slots

    def _grow(self, need: int) -> None:
        old = self._ids.size
        cap = old
        while cap - old + self._free.size < need:
            cap *= 2
        extra = cap - old

        def widen(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, torch.zeros((extra, t.shape[1]), dtype=t.dtype, device=t.device)])

        self._values = widen(self._values)
        self._state = widen(self._state)
        self._ids = np.concatenate([self._ids, np.full(extra, -1, np.int64)])
        self._version = np.concatenate([self._version, np.zeros(extra, np.int64)])
        self._last_used = np.concatenate([self._last_used, np.zeros(extra, np.int64)])
        self._changed = np.concatenate([self._changed, np.zeros(extra, bool)])
        self._free = np.concatenate([np.arange(cap - 1, old - 1, -1, dtype=np.int64), self._free])

    def _admit(self, ids: np.ndarray, step: int) -> np.ndarray:
        """Mask of ids (all without a row) admitted now; counts the others once per step."""
        threshold = self.config.admit_after
        if threshold <= 1:
            return np.ones(ids.size, dtype=bool)
        pinned = np.isin(ids, self._pinned) if self._pinned.size else np.zeros(ids.size, bool)
        slots = self._cand.find(ids)
        new = np.flatnonzero(slots < 0)
        if new.size:
            base = self._cand_count.size
            slots[new] = base + np.arange(new.size)
            self._cand_count = np.concatenate([self._cand_count, np.zeros(new.size, np.int64)])
            self._cand_last = np.concatenate([self._cand_last, np.full(new.size, -1, np.int64)])
            self._cand.insert(ids[new], slots[new])
        fresh = self._cand_last[slots] != step  # an id counts once per step, however often read
        self._cand_count[slots[fresh]] += 1
        self._cand_last[slots] = step
        return pinned | (self._cand_count[slots] >= threshold)

    def _prune_candidates(self, step: int) -> None:
        """Drop candidates that got a row or went unused for evict_after steps; compact."""
        if self._cand.size == 0:
            return
        ids, slots = self._cand.items()
        keep = ~self.contains(ids)
        if self.config.evict_after:
            keep &= self._cand_last[slots] >= step - self.config.evict_after
        if self.config.max_rows and int(keep.sum()) > self.config.max_rows:
            order = np.lexsort((ids, -self._cand_last[slots]))
            order = order[keep[order]][: self.config.max_rows]
            keep = np.zeros(ids.size, dtype=bool)
            keep[order] = True
        ids, slots = ids[keep], slots[keep]
        self._cand_count = self._cand_count[slots]
        self._cand_last = self._cand_last[slots]
        self._cand.rebuild(ids, np.arange(ids.size, dtype=np.int64))
