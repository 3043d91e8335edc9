"""The rows ``hetgmp serve`` holds: by id, each with the version it was published at; past
``memory_rows`` the least recently used go to a disk tier (``--disk-dir``), as a trainer
rank's do (:class:`~hetgmp.trainer.embedding.tier.DiskTier`, RocksDB), so serve can hold a
table larger than its memory.

A row lives in one tier. Reads (``gather``, a request's rows) and writes (``upsert``, a delta)
bring the rows of their ids that lie on disk back into memory first (one batched multi-get)
and count as a use; then, past the cap, the least recently used rows (ties by id) spill whole
(value and version) down to 15/16 of it. ``versions`` reads either tier without moving rows;
``remove`` and ``drop_newer`` reach both; ``export`` merges both in id order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hetgmp.partitioner import IdIndex
from hetgmp.trainer.embedding import DiskTier, initial_rows

__all__ = ["ServingTable"]


class ServingTable:
    """Rows by id, each with the version it was published at.

    Args:
        dim: Row width.
        seed: Seed of the initial rows (answered for ids without a row, as the trainer's).
        init_scale: Their scale.
        capacity: Initial slots.
        memory_rows: Most rows held in memory (0: no bound, no tier).
        disk_dir: Parent of the disk tier (with ``memory_rows``).
    """

    def __init__(self, dim: int, seed: int, init_scale: float, capacity: int = 1024, *,
                 memory_rows: int = 0, disk_dir: str | Path = "") -> None:
        if bool(memory_rows) != bool(disk_dir) or memory_rows < 0:
            raise ValueError("a serving tier needs both memory_rows > 0 and disk_dir")
        self.dim, self.seed, self.init_scale = dim, seed, init_scale
        self.memory_rows = memory_rows
        cap = max(16, capacity)
        self._index = IdIndex(2 * cap)
        self._values = np.zeros((cap, dim), np.float32)
        self._versions = np.zeros(cap, np.int64)
        self._used = np.zeros(cap, np.int64)  # the tick of each slot's last use
        self._tick = 0
        self._free = np.arange(cap - 1, -1, -1, dtype=np.int64)
        self.tier = DiskTier(disk_dir, dim, 0, torch.float32) if disk_dir else None

    def __len__(self) -> int:
        return self._index.size + (len(self.tier) if self.tier is not None else 0)

    @property
    def memory_size(self) -> int:
        """Rows held in memory."""
        return self._index.size

    @property
    def nbytes(self) -> int:
        """Bytes of values, versions and the index in memory."""
        return int(self._values.nbytes + self._versions.nbytes + self._used.nbytes
                   + self._free.nbytes + self._index.nbytes)

    def close(self) -> None:
        """Remove the disk tier's files (its rows are gone)."""
        if self.tier is not None:
            self.tier.close()

    def upsert(self, ids: np.ndarray, values: np.ndarray, version: int) -> int:
        """Rows ``ids`` as of ``version``, where it is newer than the held one (or none is
        held); the number replaced or added. ``ids`` unique."""
        ids = np.asarray(ids, np.int64)
        slots = self._bring_back(ids)
        newer = (slots < 0) | (self._versions[np.maximum(slots, 0)] < version)
        new = np.flatnonzero(newer & (slots < 0))
        if new.size:
            slots[new] = self._create(ids[new])
        take = np.flatnonzero(newer)
        self._values[slots[take]] = values[take]
        self._versions[slots[take]] = version
        self._use(slots)
        return int(take.size)

    def remove(self, ids: np.ndarray, version: int) -> int:
        """Drop rows ``ids`` held at a version older than ``version``; the number dropped."""
        ids = np.asarray(ids, np.int64)
        slots = self._bring_back(ids)
        have = slots >= 0
        older = np.zeros(ids.size, bool)
        older[have] = self._versions[slots[have]] < version
        self._drop(ids[older], slots[older])
        return int(older.sum())

    def drop_newer(self, version: int) -> int:
        """Drop every row held at a version above ``version``; the number dropped."""
        ids, slots = self._index.items()
        newer = self._versions[slots] > version
        self._drop(ids[newer], slots[newer])
        dropped = int(newer.sum())
        if self.tier is not None and len(self.tier):
            gone = [ids_d[versions > version]
                    for ids_d, _, _, versions in self.tier.chunks(1 << 20)]
            gone_ids = np.concatenate(gone)
            self.tier.delete(gone_ids)
            dropped += int(gone_ids.size)
        return dropped

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, int]:
        """Values of ``ids`` (initial values where no row is held) and how many had none."""
        ids = np.asarray(ids, np.int64)
        slots = self._bring_back(ids)
        have = slots >= 0
        out = np.empty((ids.size, self.dim), np.float32)
        out[have] = self._values[slots[have]]
        unknown = int(ids.size - int(have.sum()))
        if unknown:
            out[~have] = initial_rows(ids[~have], self.dim, self.seed, self.init_scale)
        self._use(slots)
        return out, unknown

    def versions(self, ids: np.ndarray) -> np.ndarray:
        """The held version of each id (-1: none), in either tier (nothing moves)."""
        ids = np.asarray(ids, np.int64)
        slots = self._index.find(ids)
        out = np.where(slots >= 0, self._versions[np.maximum(slots, 0)], -1)
        if self.tier is not None and len(self.tier) and (slots < 0).any():
            miss = np.flatnonzero(slots < 0)
            found, _, _, versions = self.tier.get(ids[miss])
            out[miss[found]] = versions
        return out

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row, in either tier: (ids sorted, values, versions)."""
        ids, slots = self._index.items()
        parts = [(ids, self._values[slots], self._versions[slots])]
        if self.tier is not None and len(self.tier):
            d_ids, d_values, _, d_versions = self.tier.items()
            parts.append((d_ids, d_values.numpy(), d_versions))
        all_ids = np.concatenate([p[0] for p in parts])
        order = np.argsort(all_ids)
        return (all_ids[order], np.concatenate([p[1] for p in parts])[order],
                np.concatenate([p[2] for p in parts])[order])

    # -- tiers -----------------------------------------------------------------------------------

    def _bring_back(self, ids: np.ndarray) -> np.ndarray:
        """The memory slots of ``ids`` (-1: no row), the spilled ones read back first."""
        slots = self._index.find(ids)
        if self.tier is None or not len(self.tier):
            return slots
        miss = np.flatnonzero(slots < 0)
        if not miss.size:
            return slots
        found, values, _, versions = self.tier.get(ids[miss])
        if found.any():
            back = miss[found]
            self.tier.delete(ids[back])
            slots[back] = self._create(ids[back])
            self._values[slots[back]] = values.numpy()
            self._versions[slots[back]] = versions
        return slots

    def _use(self, slots: np.ndarray) -> None:
        """Count a use of the rows at ``slots`` (-1 skipped); past the cap, spill the least
        recently used."""
        self._tick += 1
        self._used[slots[slots >= 0]] = self._tick
        if self.tier is None or self._index.size <= self.memory_rows:
            return
        ids, held = self._index.items()
        n = ids.size - self.memory_rows * 15 // 16
        order = np.lexsort((ids, self._used[held]))[:n]  # least recent first, ties by id
        gone, at = ids[order], held[order]
        self.tier.put(gone, torch.from_numpy(self._values[at]),
                      torch.zeros((n, 0)), self._versions[at])
        self._drop(gone, at)

    def _drop(self, ids: np.ndarray, slots: np.ndarray) -> None:
        if ids.size:
            self._index.remove(ids)
            self._free = np.concatenate([self._free, slots[::-1]])

    def _create(self, ids: np.ndarray) -> np.ndarray:
        n = ids.size
        if n > self._free.size:
            old = self._versions.size
            cap = old
            while cap - old + self._free.size < n:
                cap *= 2
            self._values = np.concatenate([self._values, np.zeros((cap - old, self.dim),
                                                                  np.float32)])
            self._versions = np.concatenate([self._versions, np.zeros(cap - old, np.int64)])
            self._used = np.concatenate([self._used, np.zeros(cap - old, np.int64)])
            self._free = np.concatenate([np.arange(cap - 1, old - 1, -1, dtype=np.int64),
                                         self._free])
        slots = self._free[-n:][::-1].copy()
        self._free = self._free[:-n]
        self._index.insert(ids, slots)
        return slots
