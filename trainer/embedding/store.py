"""The embedding store of one rank: rows keyed by int64 id, with no fixed vocabulary, and
everything that decides about them in tensors on the rank's device (CPU or CUDA alike).

A row is created on first use with an initial value that is a pure function of ``(seed, id)``
(:func:`~hetgmp.trainer.embedding.initial_rows`), so any rank that becomes a row's owner creates the
same row, and a row that was evicted comes back as a fresh one rather than as whatever its old
slot held. Per row the store keeps the value, the row optimizer's state
(:class:`~hetgmp.trainer.embedding.optimizer.RowOptimizer`) and a version, the number of updates applied (one
update = one rank's gradient for one step; a replica's push of ``p`` accumulated updates counts
``p``). Memory stays bounded on an endless stream through admission (an id gets a trainable row
only after it was used in ``admit_after`` steps) and eviction (rows unused for
``evict_after`` steps, and the least recently used above ``max_rows``). Rows that some rank
replicates are pinned: they are hot by construction, and evicting one would reset it behind
the back of its copies, whose lag the owner counts (see :mod:`hetgmp.trainer.embedding.exchange`).

For the model delta log (:mod:`hetgmp.trainer.serving`) the store marks every row whose value changed
since it was last published; :meth:`EmbeddingStore.changes` gives them, once each however many
updates they took. With :meth:`EmbeddingStore.track_evictions` on, every evicted row that was
ever updated leaves a tombstone. For checkpoints it marks the rows changed since the last one
(:meth:`EmbeddingStore.saved_rows`: a checkpoint's increment). Both in
:mod:`hetgmp.trainer.embedding.changes`.

The id -> slot index (:class:`~hetgmp.trainer.embedding.device_index.DeviceIndex`), versions, last use,
the free list and admission counts are tensors beside the rows. Ids come as int64 tensors or
numpy arrays (moved to the device); masks and versions answer in the kind the ids came in (a
tensor stays on the device, a numpy array costs a readback); what goes through the host anyway
(``export``, ``changes``, ``ids``, ``take``, ``take_tombstones``: checkpoints, the delta log,
migrations) answers ids and versions in numpy, rows in tensors. Host waits per call, on CUDA
(everything else is queued):

* :meth:`~EmbeddingStore.lookup`: one readback, the positions of the ids without a row (its
  length sizes the rows to create); ``admit_after > 1`` adds two.
  :meth:`~EmbeddingStore.lookup_padded` (a step's): one in all, admission included, with the
  caller's own values read in it. New rows' initial values are computed on the device on CUDA
  (:mod:`hetgmp.trainer.embedding.device_init`, bit for bit those of ``initial_rows``); on a CPU
  numpy's unsigned arithmetic computes the same bits 13x faster (8 against 111 ms for 10k rows
  of 65), so it does (``cpu_shortcuts``).
* :meth:`~EmbeddingStore.apply`: none. Updates of ids without a row go to a sink row (the last
  one, never a slot) and are counted on the device; :attr:`~EmbeddingStore.stats` reads the
  count.
* :meth:`~EmbeddingStore.maintain` (every few steps, or a step that passed ``max_rows``): one,
  the counts of its queued decisions (rows to evict, tombstones, candidates kept).
* ``export``, ``changes``, ``take``, ``put``: between steps (checkpoints, the delta log,
  migrations); they read the index's entries or the ids given.

``tests/trainer/reference_store.py`` keeps a numpy implementation of the same
contract (the store this one replaced), and the tests run both on long random streams.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hetgmp.trainer.embedding.admission import Candidates
from hetgmp.trainer.embedding.changes import Changes
from hetgmp.trainer.embedding.config import StoreConfig
from hetgmp.trainer.embedding.device_index import DeviceIndex
from hetgmp.trainer.embedding.device_init import initial_rows_on
from hetgmp.trainer.embedding.device_sorted import among, stable_order
from hetgmp.trainer.embedding.optimizer import RowOptimizer, initial_rows
from hetgmp.trainer.embedding.size import StoreSize
from hetgmp.trainer.embedding.spill import Spilling
from hetgmp.trainer.embedding.tier import DiskTier
from hetgmp.trainer.embedding.types import Found, PaddedLookup, StoreStats

__all__ = ["EmbeddingStore", "StoreSize"]


Ids = torch.Tensor | np.ndarray


def _like(result: torch.Tensor, ids: Ids) -> Ids:
    """``result`` in the kind of ``ids``: a tensor for a tensor, numpy for numpy."""
    return result.cpu().numpy() if isinstance(ids, np.ndarray) else result


class EmbeddingStore(Changes, Spilling, StoreSize):
    """Rows owned by one rank (primaries), created on demand, updated by the owner only, with
    every decision made on the rank's device.

    Args:
        dim: Row width.
        config: Store settings.
        dtype: Float type of values and optimizer state.
        device: Where rows and their metadata live.
        capacity: Initial row capacity (grows by doubling).
    """

    _index: DeviceIndex
    _cand: Candidates

    def __init__(self, dim: int, config: StoreConfig | None = None, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 capacity: int = 1024) -> None:
        self.config = c = config or StoreConfig()
        self.dim = dim
        self.dtype = dtype
        self.device = dev = torch.device(device)
        self.optimizer = RowOptimizer(c)
        self._stats = StoreStats()
        self._dropped = torch.zeros((), dtype=torch.int64, device=dev)
        self._index = DeviceIndex(device=dev, small_values=True)
        cap = max(16, capacity)
        # Row `cap` is the sink: lanes with nothing to write point there.
        self._values = torch.zeros((cap + 1, dim), dtype=dtype, device=dev)
        self._state = torch.zeros((cap + 1, c.state_width), dtype=dtype, device=dev)
        self._version = torch.zeros(cap + 1, dtype=torch.int64, device=dev)
        self._last_used = torch.zeros(cap + 1, dtype=torch.int32, device=dev)  # a step
        self._changed = torch.zeros(cap + 1, dtype=torch.bool, device=dev)  # see .changes
        self._unsaved = torch.zeros(cap + 1, dtype=torch.bool, device=dev)
        self._removed: list[torch.Tensor] = []  # ids dropped since the last checkpoint
        # Slots freed by evictions and migrations, popped from the end before the never-used
        # slots from `_fresh` up are taken.
        self._free = torch.zeros(0, dtype=torch.int64, device=dev)
        self._free_size = 0  # host counts: pops and pushes have host-known lengths
        self._fresh = 0
        self._pinned = torch.zeros(0, dtype=torch.int64, device=dev)
        self._last_step = 0
        self._tombstones: list[torch.Tensor] | None = None
        self._cand = Candidates(c.admit_after, dev)
        # The slots the last lookup found, for an apply of the same ids object (the step's read
        # and write): valid until a row is created, moved or evicted.
        self._looked_up: tuple[object, torch.Tensor] | None = None
        # Shortcuts a CPU allows that would wait on CUDA (on by default on a CPU): new rows'
        # initial values from numpy (13x faster there), and in the device step the distinct-id
        # count read before the rows are found. A sync audit on CPU (trainer.step.syncs) turns them
        # off to count the path CUDA takes.
        self.cpu_shortcuts = dev.type == "cpu"
        # The disk tier (--store-disk-dir): rows past the cap, whole; a row lives in one tier.
        # `_dirty`: ids of spilled rows changed since they were last published (sorted).
        self._tier = DiskTier(c.disk_dir, dim, c.state_width, dtype) if c.disk_dir else None
        self._dirty = np.zeros(0, np.int64)
        # Checkpoint epochs: a spilled row changed in the current one carries it as its mark,
        # and its id is logged (see Spilling).
        self._epoch, self._unsaved_log = 1, []
        self._ahead = []  # reads ahead of spilled rows (Spilling.prefetch)
        self._publishing = self._saving = False  # see Changes
        # Spilled rows idle past evict_after are found by a scan of the tier, this often.
        self.expire_every, self._next_expiry = max(1, c.evict_after // 4), 0

    # -- size --------------------------------------------------------------------------------

    @property
    def _cap(self) -> int:
        return int(self._values.shape[0]) - 1

    @property
    def stats(self) -> StoreStats:
        """What the store has done (reading the dropped-update count waits for the device)."""
        self._stats.dropped_updates = int(self._dropped.item())
        return self._stats

    @property
    def nbytes(self) -> int:
        """Bytes held by rows, optimizer state, metadata and both indexes."""
        tensors = (self._values, self._state, self._version, self._last_used, self._changed,
                   self._unsaved, self._free)
        return int(sum(t.numel() * t.element_size() for t in tensors)
                   + self._index.nbytes + self._cand.nbytes)

    # -- rows --------------------------------------------------------------------------------

    def _ids_t(self, ids: Ids) -> torch.Tensor:
        if isinstance(ids, np.ndarray):
            ids = torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64))
        return ids.to(device=self.device, dtype=torch.int64).reshape(-1)

    def _sunk(self, slots: torch.Tensor) -> torch.Tensor:
        """Slots with the absent ones (-1) sent to the sink row."""
        return torch.where(slots >= 0, slots, self._cap)

    def pin(self, ids: Ids) -> None:
        """Rows that are never evicted and are admitted at first use (replicated rows).

        Rows that leave the pinned set count as used at the latest step looked up: their copies'
        reads within the staleness bound never touch the owner's store, so their last use is
        not otherwise known, and they are not to be evicted for it.
        """
        pinned = torch.unique(self._ids_t(ids))
        if self._pinned.numel():
            released = self._pinned[~torch.isin(self._pinned, pinned)]
            if released.numel():
                self._last_used[self._sunk(self._index.find(released))] = self._last_step
        self._pinned = pinned

    def contains(self, ids: Ids) -> Ids:
        """Whether each id has a row (in memory or on disk)."""
        flat = self._ids_t(ids)
        slots = self._index.find(flat)
        have = slots >= 0
        disk = self._on_disk(flat, slots)
        if disk is not None:
            have[disk[0]] = True
        return _like(have, ids)

    def versions(self, ids: Ids) -> Ids:
        """Version of each id's row; 0 for ids without one."""
        flat = self._ids_t(ids)
        slots = self._index.find(flat)
        out = torch.where(slots >= 0, self._version[self._sunk(slots)], 0)
        disk = self._on_disk(flat, slots)
        if disk is not None:
            out[disk[0]] = torch.from_numpy(disk[3]).to(self.device)
        return _like(out, ids)

    def peek(self, ids: Ids) -> torch.Tensor:
        """Values of rows without creating or touching them (initial values for absent ids;
        a spilled row is read from disk and stays there)."""
        flat = self._ids_t(ids)
        slots = self._index.find(flat)
        out = self._initial(flat)
        have = slots >= 0
        out = torch.where(have[:, None], self._values[self._sunk(slots)], out)
        disk = self._on_disk(flat, slots)
        if disk is not None:
            out[disk[0]] = disk[1]
        return out

    def lookup_padded(self, ids: torch.Tensor, count: torch.Tensor, step: int, *,
                      with_state: bool = False, extra: torch.Tensor | None = None
                      ) -> PaddedLookup:
        """:meth:`lookup` of the distinct ids ``ids[:count]``, the count on the device, with
        one wait (a batch deduplicated by :func:`~hetgmp.trainer.embedding.dedup.unique_padded`).

        The rows are found and the admissions decided for the whole padded array first; then
        one copy brings the counts that size the rest to the host, and with them ``extra``
        (the caller's own values on the device, read in the same wait: the step's last loss).
        With ``cpu_shortcuts`` the count is read first and only the distinct ids are searched
        (a CPU waits for nothing; a padded batch is 5x the distinct ids of the synthetic
        stream's).

        Args:
            ids: int64 ``[N]`` on the device, distinct in ``ids[:count]`` (the rest ignored).
            count: 0-d int64 tensor on the device.
            step: The step of the lookup.
            with_state: Also return the rows' optimizer state.
            extra: Values to read back with the counts (any shape; read as float64).
        """
        flat = self._ids_t(ids)
        self._restore(flat, count, ahead=True)  # spilled rows back first (CUDA: one more wait)
        self._looked_up_once()
        if self.cpu_shortcuts:
            flat = flat[:int(count)]
            valid = torch.ones(flat.numel(), dtype=torch.bool, device=self.device)
        else:
            valid = torch.arange(flat.numel(), device=self.device) < count
        found = self._find_rows(flat, valid, step)
        parts = [count.reshape(1), found.counts]
        if extra is not None:
            parts.append(extra.reshape(-1))
        # counts < 2**53 are exact in float64
        got = torch.cat([t.to(torch.float64) for t in parts]).tolist()  # the wait
        n, *counts = (int(x) for x in got[:4])
        uniq = flat[:n]
        values, state = self._lookup(uniq, uniq, step, with_state, found.head(n), counts)
        return PaddedLookup(uniq, values, state, got[4:])

    def _find_rows(self, flat: torch.Tensor, valid: torch.Tensor, step: int) -> Found:
        """The first half of a lookup in ``step``, queued: the ids' slots and, on the device,
        the counts that size the second half (``valid``: the ids the lookup will take)."""
        slots = self._index.find(flat)
        absent = (slots < 0) & valid
        zero = torch.zeros((), dtype=torch.int64, device=self.device)
        threshold = self.config.admit_after
        if threshold <= 1:
            return Found(slots, None, torch.stack([absent.sum(), zero, zero]))
        # What _admit will decide: a candidate seen in enough steps (this one counted once),
        # or a pinned id, gets its row; an id not yet a candidate becomes one.
        cand = self._cand.find(flat)
        known = cand >= 0
        admitted = absent & (self._cand.ripe(cand, step) | among(flat, self._pinned))
        return Found(slots, cand, torch.stack([absent.sum(), (absent & ~known).sum(),
                                               admitted.sum()]))

    def lookup(self, ids: Ids, step: int, *, with_state: bool = False
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
        flat = self._ids_t(ids)
        self._restore(flat, ahead=True)
        self._looked_up_once()
        return self._lookup(ids, flat, step, with_state, None, None)

    def _lookup(self, ids: object, flat: torch.Tensor, step: int, with_state: bool,
                found: Found | None, counts: Sequence[int] | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`lookup` of ``flat`` (``ids`` as the caller passed them, the key an apply of
        the same object reuses the slots by); with ``found`` (:meth:`_find_rows` of these ids)
        and its counts read back, waiting for nothing (the found slots are updated in
        place)."""
        self._last_step = max(self._last_step, step)
        self._stats.looked_up += int(flat.numel())
        known: tuple[torch.Tensor, int] | None = None
        if found is None or counts is None:
            slots = self._index.find(flat)
            missing = torch.nonzero(slots < 0).reshape(-1)  # the readback
        else:
            slots = found.slots
            missing = torch.nonzero_static(slots < 0, size=counts[0]).reshape(-1)
        absent = missing[:0]
        if missing.numel():
            if found is not None and found.candidates is not None and counts is not None:
                known = (found.candidates[missing], counts[1])
            admit = self._admit(flat[missing], step, known)
            if admit is None:  # every missing id is admitted
                created = missing
            else:
                order = torch.sort((~admit).to(torch.int8), stable=True).indices
                admitted = int(admit.sum().item()) if counts is None else counts[2]
                created, absent = missing[order[:admitted]], missing[order[admitted:]]
            if created.numel():
                slots[created] = self._create(flat[created])
        sunk = self._sunk(slots)
        self._last_used[sunk] = step
        self._looked_up = (ids, slots)
        values = self._values.index_select(0, sunk)
        state = None
        if with_state:
            state = self._state.index_select(0, sunk)
        if absent.numel():
            self._stats.not_admitted_reads += int(absent.numel())
            values[absent] = self._initial(flat[absent])
            if state is not None:
                state[absent] = self.optimizer.initial_state(int(absent.numel()), self.dtype,
                                                             self.device)
        return values, state

    def apply(self, ids: Ids, grads: torch.Tensor, counts: Ids,
              increments: torch.Tensor | None = None, *, count: torch.Tensor | None = None
              ) -> Ids:
        """Apply one optimizer step per row with its summed gradient; version += its count.

        Args:
            ids: Unique int64 ids (the tensor a lookup answered reuses its slots).
            grads: ``[n, dim]`` gradient of each row, summed over every contribution.
            counts: int64 ``[n]`` updates the gradient stands for (contributions).
            increments: Optimizer-state increments ``[n, state_width]`` to use instead of
                those of ``grads`` (see :meth:`RowOptimizer.step`).
            count: A 0-d tensor on the device: only ``ids[:count]`` are updated, the rest is
                padding (:func:`~hetgmp.trainer.embedding.dedup.unique_padded`), written to the sink
                row.

        Returns:
            Whether each row was there to update (updates of rows without one are dropped).
        """
        flat = self._ids_t(ids)
        cached = self._looked_up
        if cached is not None and cached[0] is ids:
            slots = cached[1]
        else:  # not the ids just looked up (a copy's push): a spilled row comes back to update
            self._restore(flat, count)
            slots = self._index.find(flat)
        if count is not None:
            slots = torch.where(torch.arange(flat.numel(), device=self.device) < count, slots, -1)
        applied = slots >= 0
        if flat.numel() == 0:
            return _like(applied, ids)
        index = self._sunk(slots)
        dropped = ~applied
        if count is not None:
            dropped &= torch.arange(flat.numel(), device=self.device) < count
        self._dropped += dropped.sum()
        grads = grads.to(device=self.device, dtype=self.dtype)
        self.optimizer.step(self._values, self._state, index, grads, increments)
        self._version.index_add_(0, index, self._ids_t(counts))
        self._changed[index] = True
        self._unsaved[index] = True
        self._clear_sink()
        return _like(applied, ids)

    def ids(self) -> np.ndarray:
        """Ids that have a row (in either tier), sorted."""
        mem = torch.sort(self._index.items()[0]).values.cpu().numpy()
        if self._tier is None or not len(self._tier):
            return mem
        return np.sort(np.concatenate([mem, self._tier.ids()]))

    def export(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """Every row, in either tier: (ids sorted, values, optimizer state, versions)."""
        ids, slots = self._index.items()
        order = torch.argsort(ids)
        return self._with_disk_rows(self._rows_at(ids[order], slots[order]))

    def _rows_at(self, ids: torch.Tensor, slots: torch.Tensor
                 ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """(ids, values, state, versions) of memory rows, copies."""
        return (ids.cpu().numpy(), self._values[slots].clone(), self._state[slots].clone(),
                self._version[slots].cpu().numpy())

    # -- migration ---------------------------------------------------------------------------

    def take(self, ids: Ids) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """Remove the rows of ``ids`` that exist and return (ids, values, state, versions)."""
        flat = self._ids_t(ids)
        self._restore(flat)  # rows leave from whichever tier holds them
        slots = self._index.find(flat)
        have = slots >= 0
        flat, slots = flat[have], slots[have]
        values, state = self._values[slots].clone(), self._state[slots].clone()
        versions = self._version[slots].clone()
        self._index.remove(flat)
        self._release(torch.flip(slots, (0,)))
        return flat.cpu().numpy(), values, state, versions.cpu().numpy()

    def put(self, ids: Ids, values: torch.Tensor, state: torch.Tensor,
            versions: Ids, step: int, *, published: bool = False, new: bool = False) -> None:
        """Install rows handed over by their previous owner (replacing any row of those ids).

        Args:
            ids: Unique int64 ids.
            values: ``[n, dim]`` their values.
            state: ``[n, state_width]`` their optimizer state.
            versions: int64 ``[n]`` their versions (updates applied so far).
            step: The current step (counts as their last use).
            published: The delta log holds them already (restored from a checkpoint), rather
                than this rank having to publish them (moved in by a migration).
            new: The caller knows no row of these ids is on disk (a restore's disjoint parts):
                the disk tier is not searched for them.
        """
        flat = self._ids_t(ids)
        if flat.numel() == 0:
            return
        if not new:
            self._restore(flat)  # a row lives in one tier: the one put here is in memory
        slots = self._index.find(flat)
        absent = torch.nonzero(slots < 0).reshape(-1)
        if absent.numel():
            slots[absent] = self._create(flat[absent], count=False, fill=False)  # moved in
        self._values[slots] = values.to(device=self.device, dtype=self.dtype)
        self._state[slots] = state.to(device=self.device, dtype=self.dtype)
        self._version[slots] = self._ids_t(versions)
        self._last_used[slots] = step
        self._changed[slots] = not published
        self._unsaved[slots] = True
        if self._tier is not None and self.over_cap:  # a restore larger than memory
            self.maintain(step)

    # -- memory bound ------------------------------------------------------------------------

    def maintain(self, step: int) -> int:
        """Evict rows unused for ``evict_after`` steps and the least recent above ``max_rows``;
        returns the number evicted. With a disk tier the rows past the cap spill instead, and
        the spilled rows unused for ``evict_after`` steps are dropped by a scan of the tier
        every ``expire_every`` steps (a quarter of ``evict_after``). Called between steps
        (never between a step's reads and its updates). Least recently used first, ties by id,
        down to a low-water mark below the cap, so that the next steps' new rows fit under it.

        Every decision is queued first (the rows to evict, the candidates to keep), then one
        readback of their counts sizes the compactions (on CUDA, with the ``sorted`` index,
        the call's one wait).
        """
        c = self.config
        expired = 0  # spilled rows idle too long, dropped by a scan of the tier now and then
        if c.evict_after and self._tier is not None and step >= self._next_expiry:
            expired = self._expire_spilled(step - c.evict_after)
            self._next_expiry = step + self.expire_every
        ids, slots = self._index.items()
        used = self._last_used[slots]
        pinned = among(ids, self._pinned)
        evict = torch.zeros(ids.numel(), dtype=torch.bool, device=self.device)
        if c.evict_after:
            evict |= used < step - c.evict_after
        evict &= ~pinned
        idle = evict.clone() if self._tier is not None else evict
        if c.max_rows and ids.numel() > c.max_rows:  # host-known: the cap may bind
            # Past the cap after the idle rows go, the least recent others go too, down to
            # low_water: the first `kept - low_water` of them in (last use, id) order.
            kept = ids.numel() - evict.sum()
            extra = torch.where(kept > c.max_rows, kept - self.low_water, 0)
            order = stable_order(used, ids)
            eligible = ~evict[order] & ~pinned[order]
            evict[order] = evict[order] | (eligible & (torch.cumsum(eligible, 0) <= extra))
        keep_cand = self._cand.kept(step, self._index, c.evict_after, c.max_rows)
        # With a disk tier the rows the cap chose spill; idle rows are dropped either way.
        spill = evict & ~idle if self._tier is not None else None
        dropped = evict if spill is None else idle
        tomb = dropped & (self._version[slots] > 0)
        counts = [evict.sum(), tomb.sum(), evict.sum() if spill is None else spill.sum()]
        if keep_cand is not None:
            counts.append(keep_cand[0].sum())
        n_gone, n_tomb, n_spill, *n_cand = torch.stack(counts).tolist()  # the readback
        if spill is None:
            n_spill = 0
        if keep_cand is not None:
            self._cand.prune(keep_cand, n_cand[0])
        if n_gone == 0:
            return expired
        if spill is not None and n_spill:
            self._spill(ids, slots, spill, n_spill)
        gone = slots[torch.nonzero_static(evict, size=n_gone).reshape(-1)]
        if self._tombstones is not None:
            self._tombstones.append(ids[torch.nonzero_static(tomb, size=n_tomb).reshape(-1)])
        if self._saving and n_gone > n_spill:  # dropped: the next increment forgets them
            self._removed.append(ids[torch.nonzero_static(dropped, size=n_gone - n_spill)
                                     .reshape(-1)])
        self._release(torch.flip(gone, (0,)))
        stay = torch.nonzero_static(~evict, size=ids.numel() - n_gone).reshape(-1)
        self._index.rebuild(ids[stay], slots[stay])
        self._stats.evicted += n_gone - n_spill
        return n_gone + expired

    # -- internals ---------------------------------------------------------------------------

    def _initial(self, ids: torch.Tensor) -> torch.Tensor:
        c = self.config
        if not self.cpu_shortcuts:
            return initial_rows_on(ids, self.dim, c.seed, c.init_scale, self.dtype)
        rows = initial_rows(ids.cpu().numpy(), self.dim, c.seed, c.init_scale)
        return torch.from_numpy(rows).to(device=self.device, dtype=self.dtype)

    def _clear_sink(self) -> None:
        sink = self._cap
        self._values[sink] = 0
        self._state[sink] = 0
        self._version[sink] = 0
        self._changed[sink] = False
        self._unsaved[sink] = False

    def _release(self, slots: torch.Tensor) -> None:
        """Push freed slots on the free stack (popped last-in first-out)."""
        self._looked_up = None
        self._free = torch.cat([self._free[:self._free_size], slots])
        self._free_size += int(slots.numel())

    def _create(self, ids: torch.Tensor, *, count: bool = True, fill: bool = True
                ) -> torch.Tensor:
        """Slots for rows of ``ids``: initial values, fresh state, version 0 (``fill=False``:
        the caller writes every slot's value, state and version itself)."""
        self._looked_up = None
        n = int(ids.numel())
        reused = min(n, self._free_size)
        fresh = n - reused
        if self._fresh + fresh > self._cap:
            self._grow(self._fresh + fresh)
        top = self._free_size
        slots = torch.cat([torch.flip(self._free[top - reused:top], (0,)),
                           torch.arange(self._fresh, self._fresh + fresh, device=self.device)])
        self._free_size = top - reused
        self._fresh += fresh
        if self._free_size == 0:
            self._free = self._free[:0]
        if fill:
            self._values[slots] = self._initial(ids)
            self._state[slots] = self.optimizer.initial_state(n, self.dtype, self.device)
            self._version[slots] = 0
        self._changed[slots] = False
        self._unsaved[slots] = fill  # a new row; else the caller says
        self._index.insert(ids, slots)
        if count:
            self._stats.created += n
        return slots

    def _grow(self, need: int) -> None:
        """Room for ``need`` slots: half again as many as now (the copies cost a constant a
        row), but with a cap no more than 1/64 past it, as long as that is enough."""
        old = self._cap
        cap = max(need, old + old // 2)
        if self.config.max_rows:
            cap = min(cap, max(need, self.config.max_rows + self.config.max_rows // 64))
        extra = cap - old

        def widen(t: torch.Tensor) -> torch.Tensor:
            pad = torch.zeros((extra + 1, *t.shape[1:]), dtype=t.dtype, device=t.device)
            return torch.cat([t[:old], pad])  # the old sink is dropped, the last row is new

        self._values, self._state = widen(self._values), widen(self._state)
        self._version, self._last_used = widen(self._version), widen(self._last_used)
        self._changed, self._unsaved = widen(self._changed), widen(self._unsaved)

    def _admit(self, ids: torch.Tensor, step: int,
               known: tuple[torch.Tensor, int] | None = None) -> torch.Tensor | None:
        """Mask of ids without a row admitted now (None: all of them); counts the others once
        per step. ``known``: the ids' candidate slots and how many are -1, as ``_find_rows``
        found them (else they are looked up, and counted with a readback)."""
        if self.config.admit_after <= 1:
            return None
        return among(ids, self._pinned) | self._cand.count(ids, step, known)
