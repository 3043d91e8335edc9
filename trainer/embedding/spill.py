"""What :class:`~hetgmp.trainer.embedding.store.EmbeddingStore` does with its disk tier
(:mod:`hetgmp.trainer.embedding.tier`): rows spilled past the cap, read back before a step,
found by peeks and migrations where they lie, merged into exports and the delta log's changes.

A mixin of the store: it works on the store's own tensors and index, and keeps beside them
the ids of spilled rows changed since they were last published (``_dirty``, sorted), so that
the delta log publishes a row that left memory before its publish (from disk). A spilled row
changed since the last checkpoint carries the checkpoint epoch (``_epoch``) as its mark on disk,
and its id goes to ``_unsaved_log``: the next checkpoint's increment reads those of them still
so marked, and a row read back knows from its mark alone (no set of ids searched a step).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

import numpy as np
import torch

from hetgmp.trainer.embedding.config import StoreConfig
from hetgmp.trainer.embedding.device_index import DeviceIndex
from hetgmp.trainer.embedding.tier import DiskTier
from hetgmp.trainer.embedding.types import StoreStats

__all__ = ["Spilling"]

Rows = tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]


def _in_id_order(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ids of both (disjoint) sets in order, and where each comes from in the two
    concatenated: the permutation to apply to their rows."""
    both = np.concatenate([first, second])
    order = np.argsort(both, kind="stable")
    return both[order], order


@dataclass(frozen=True)
class _Ahead:
    """A read ahead of spilled rows (:meth:`Spilling.prefetch`)."""

    ids: np.ndarray  # the ids read, sorted
    future: Future[tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]]
    deleted: list[np.ndarray]  # ids the tier deleted since the read began
    skip: int  # lookups before the one it is for


def _split(ids: np.ndarray, marked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``ids`` are in the sorted set ``marked``, and the set without them."""
    if not marked.size:
        return np.zeros(ids.size, bool), marked
    return (np.isin(ids, marked, assume_unique=True),
            marked[~np.isin(marked, ids, assume_unique=True)])


class Spilling:
    """The disk tier's part of the store (a row lives in exactly one tier)."""

    _tier: DiskTier | None
    _ahead: list[_Ahead]  # reads ahead (prefetch), oldest first
    config: StoreConfig
    _dirty: np.ndarray
    _epoch: int
    _unsaved_log: list[np.ndarray]
    _index: DeviceIndex
    _stats: StoreStats
    _values: torch.Tensor
    _state: torch.Tensor
    _version: torch.Tensor
    _changed: torch.Tensor
    _unsaved: torch.Tensor
    _last_used: torch.Tensor
    _last_step: int
    _removed: list[torch.Tensor]
    _publishing: bool
    _saving: bool
    _tombstones: list[torch.Tensor] | None
    device: torch.device
    _create: Callable[..., torch.Tensor]  # the store's: slots for new rows

    @property
    def tier(self) -> DiskTier | None:
        """The disk tier, if the store has one."""
        return self._tier

    @property
    def rows(self) -> int:
        """Rows this store holds, in memory and on disk."""
        return self._index.size + (len(self._tier) if self._tier is not None else 0)

    def counts(self) -> dict[str, int]:
        """Rows in each tier and what the store did, without waiting for the device (the
        dropped-update count, which would, is left out): for metrics and reports."""
        st = self._stats
        out = {"memory_rows": self._index.size, "created": st.created, "evicted": st.evicted,
               "looked_up": st.looked_up}
        if self._tier is not None:
            out.update(disk_rows=len(self._tier), spilled=st.spilled, restored=st.restored,
                       prefetched=st.prefetched, read_ahead=st.read_ahead,
                       disk_bytes=self._tier.disk_bytes)
        return out

    def close(self) -> None:
        """Remove the disk tier's files (its rows are gone); the rows in memory stay."""
        if self._tier is not None:
            self._tier.close()

    def _on_disk(self, flat: torch.Tensor, slots: torch.Tensor, ahead: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray,
                            np.ndarray] | None:
        """Of the ids of ``flat`` without a row in memory (``slots`` < 0), those the disk tier
        holds: (their positions in ``flat``, values, state, versions, marks); None when none
        can be. ``ahead``: rows the last :meth:`prefetch` read are taken from it where still
        valid."""
        if self._tier is None or not len(self._tier):
            return None
        missing = torch.nonzero(slots < 0).reshape(-1)
        if not missing.numel():
            return None
        ids = flat[missing].cpu().numpy()
        pre = self._read_ahead(ids) if ahead else None
        if pre is None:
            found, values, state, versions, marks = self._tier.get_marked(ids)
        else:  # the rest read now, both put back in the ids' order
            hit, p_values, p_state, p_versions, p_marks = pre
            self._stats.read_ahead += int(hit.sum())
            rest = np.flatnonzero(~hit)
            got, values, state, versions, marks = self._tier.get_marked(ids[rest])
            found = hit.copy()
            found[rest[got]] = True
            order = np.argsort(np.concatenate([np.flatnonzero(hit), rest[got]]), kind="stable")
            at_order = torch.from_numpy(order)
            values = torch.cat([p_values, values])[at_order]
            state = torch.cat([p_state, state])[at_order]
            versions = np.concatenate([p_versions, versions])[order]
            marks = np.concatenate([p_marks, marks])[order]
        at = missing[torch.from_numpy(found).to(self.device)]
        return at, values.to(self.device), state.to(self.device), versions, marks

    @property
    def prefetching(self) -> bool:
        """Whether :meth:`prefetch` reads anything (a disk tier and ``--store-prefetch``)."""
        return self._tier is not None and self.config.prefetch

    def prefetch(self, ids: np.ndarray) -> None:
        """Start reading, on a thread, the spilled rows of ``ids``: the batch after the one
        about to be looked up (its ids this rank owns), read while that step trains. The
        lookup after next waits for the read and takes its rows. Nothing in the store changes
        until then, and only rows that have not left the tier since are taken (the tier keeps
        the ids it deleted meanwhile): a hint, never a change in what the store answers."""
        tier = self._tier
        if tier is None or not self.config.prefetch or not len(tier):
            return
        ids = np.unique(np.asarray(ids, np.int64))
        if not ids.size:
            return
        held = (self._index.find(torch.from_numpy(ids).to(self.device)) >= 0).cpu().numpy()
        missing = ids[~held]
        if missing.size:
            future, deleted = tier.read_async(missing)
            self._ahead.append(_Ahead(missing, future, deleted, skip=1))
            self._stats.prefetched += int(missing.size)
            while len(self._ahead) > 2:  # prefetches no lookup came for
                tier.forget(self._ahead.pop(0).deleted)

    def _looked_up_once(self) -> None:
        """A lookup is done: the reads ahead that were for it go, the next ones are due."""
        assert self._tier is not None or not self._ahead
        for a in self._ahead:
            if a.skip == 0:
                self._tier.forget(a.deleted)  # type: ignore[union-attr]
        self._ahead = [replace(a, skip=a.skip - 1) for a in self._ahead if a.skip > 0]

    def _read_ahead(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor,
                                                    np.ndarray, np.ndarray] | None:
        """Of ``ids``, those the read ahead for this lookup read that have not left the tier
        since: (mask over ``ids``, then their values, state, versions and marks in the ids'
        order); None without one."""
        due = [a for a in self._ahead if a.skip == 0]
        if not due:
            return None
        read = due[-1]
        found, values, state, versions, marks = read.future.result()
        ok = np.flatnonzero(found)  # rows read (`read.ids` is sorted, so are their ids)
        if read.deleted:
            keep = ~np.isin(read.ids[ok], np.concatenate(read.deleted))
            ok = ok[keep]
            values, state, versions, marks = values[keep], state[keep], versions[keep], \
                marks[keep]
        rows = read.ids[ok]
        if not rows.size:
            return np.zeros(ids.size, bool), values[:0], state[:0], versions[:0], marks[:0]
        pos = np.minimum(np.searchsorted(rows, ids), rows.size - 1)
        hit = rows[pos] == ids
        at = torch.from_numpy(pos[hit])
        return hit, values[at], state[at], versions[pos[hit]], marks[pos[hit]]

    def _restore(self, flat: torch.Tensor, count: torch.Tensor | None = None,
                 ahead: bool = False) -> None:
        """Bring the spilled rows of ``flat`` (its first ``count``: a padded batch) back into
        memory, whole (before a lookup: the step reads and updates them there). Counts as
        neither created nor admitted. Without spilled rows it costs nothing; with them, on
        CUDA, ``count`` is read back (the tier is read on the host)."""
        if self._tier is None or not len(self._tier):
            return
        if count is not None:
            flat = flat[:int(count)]
        disk = self._on_disk(flat, self._index.find(flat), ahead=ahead)
        if disk is None or not disk[0].numel():
            return
        at, values, state, versions, marks = disk
        ids = flat[at]
        host = ids.cpu().numpy()
        assert self._tier is not None
        self._tier.delete(host)
        dirty, self._dirty = _split(host, self._dirty)
        unsaved = marks == self._epoch
        slots = self._create(ids, count=False, fill=False)
        self._values[slots] = values
        self._state[slots] = state
        self._version[slots] = torch.from_numpy(versions).to(self.device)
        self._changed[slots] = torch.from_numpy(dirty).to(self.device)
        self._unsaved[slots] = torch.from_numpy(unsaved).to(self.device)
        self._last_used[slots] = self._last_step
        self._stats.restored += int(ids.numel())

    def _spill(self, ids: torch.Tensor, slots: torch.Tensor, spill: torch.Tensor,
               n: int) -> None:
        """Write the rows ``spill`` marks (of the index's ``ids``/``slots``) to the disk tier,
        whole; where a delta log follows the store (``_publishing``: it asked for changes or
        tombstones), those changed since their last publish stay due for it (without one the
        ids would only pile up, and merging them cost a step more than the spill itself)."""
        assert self._tier is not None
        at = torch.nonzero_static(spill, size=n).reshape(-1)
        gone, where = ids[at], slots[at]
        host = gone.cpu().numpy()
        unsaved = self._unsaved[where].cpu().numpy()
        self._tier.put(host, self._values[where], self._state[where],
                       self._version[where].cpu().numpy(), self._last_used[where].cpu().numpy(),
                       np.where(unsaved, self._epoch, -1))
        if self._publishing:  # a delta log follows the store
            changed = self._changed[where].cpu().numpy()
            if changed.any():
                self._dirty = np.union1d(self._dirty, host[changed])
        if self._saving and unsaved.any():  # (before a first checkpoint, no increment)
            self._unsaved_log.append(host[unsaved])
        self._stats.spilled += n

    def _with_disk_rows(self, memory: Rows) -> Rows:
        """``memory``'s rows (ids sorted) and every row of the disk tier, in id order."""
        if self._tier is None or not len(self._tier):
            return memory
        disk = self._tier.items()
        ids, order = _in_id_order(memory[0], disk[0])
        at = torch.from_numpy(order).to(self.device)
        return (ids, torch.cat([memory[1], disk[1].to(self.device)])[at],
                torch.cat([memory[2], disk[2].to(self.device)])[at],
                np.concatenate([memory[3], disk[3]])[order])

    def _expire_spilled(self, before: int) -> int:
        """Drop the spilled rows last used before step ``before`` (``--store-evict-after``
        reaching the disk), as eviction drops rows in memory: tombstones for the delta log,
        removals for the next checkpoint's increment. Returns how many."""
        if self._tier is None or not len(self._tier):
            return 0
        ids, versions = self._tier.expire(before)
        if not ids.size:
            return 0
        if self._tombstones is not None:
            self._tombstones.append(torch.from_numpy(ids[versions > 0]).to(self.device))
        if self._saving:
            self._removed.append(torch.from_numpy(ids).to(self.device))
        self._dirty = _split(ids, self._dirty)[1]
        self._stats.evicted += int(ids.size)
        return int(ids.size)

    def _with_unsaved_disk_rows(self, memory: Rows) -> Rows:
        """``memory``'s rows (ids sorted) and the spilled rows changed since the last
        checkpoint (the logged ids still on disk and still so marked), in id order."""
        if not self._unsaved_log:
            return memory
        assert self._tier is not None
        logged = np.unique(np.concatenate(self._unsaved_log))
        found, values, state, versions, marks = self._tier.get_marked(logged)
        keep = marks == self._epoch
        values, state, versions = values[keep], state[keep], versions[keep]
        ids, order = _in_id_order(memory[0], logged[found][keep])
        at = torch.from_numpy(order).to(self.device)
        return (ids, torch.cat([memory[1], values.to(self.device)])[at],
                torch.cat([memory[2], state.to(self.device)])[at],
                np.concatenate([memory[3], versions])[order])

    def _with_dirty_rows(self, ids: np.ndarray, values: torch.Tensor
                         ) -> tuple[np.ndarray, torch.Tensor]:
        """The changed rows of memory (``ids`` sorted, ``values``) and the spilled rows due for
        the delta log, read from disk, in id order; those are then published."""
        if not self._dirty.size:
            return ids, values
        assert self._tier is not None
        dirty, self._dirty = self._dirty, np.zeros(0, np.int64)
        found, disk, _, _ = self._tier.get(dirty)
        merged, order = _in_id_order(ids, dirty[found])
        return merged, torch.cat([values, disk.to(self.device)])[
            torch.from_numpy(order).to(self.device)]

    def _unpublish_spilled(self, flat: torch.Tensor | None, slots: torch.Tensor | None) -> None:
        """Spilled rows of ``flat`` (every spilled row: None) due for the delta log again."""
        if self._tier is None:
            return
        if flat is None or slots is None:
            self._dirty = self._tier.ids()
            return
        disk = self._on_disk(flat, slots)
        if disk is not None:
            self._dirty = np.union1d(self._dirty, flat[disk[0]].cpu().numpy())
