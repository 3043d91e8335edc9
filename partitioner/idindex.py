"""A vectorised map from int64 feature ids to dense slots (open addressing, linear probing).

The embedding store has no fixed vocabulary: ids are 63-bit hashes, so rows live in dense arrays
and this index maps an id to its row's slot. A Python dict would cost ~100 bytes and a
Python-level call per id; this table costs 16 bytes per bucket (an id and its value side by side,
at load <= 1/2) and resolves a whole batch of ids with a few numpy operations per probe round
(one or two rounds at that load). Side by side, a probe's one gather brings the id and its value
from the same cache line: for tables past the core's cache, the gathers' misses are what a batch
lookup costs. It lives in the partitioner because placements use it too: routing probes every
entry of a batch (``Placement.holders``), and the trainer imports the partitioner, never the
reverse.

Bulk deletion is by rebuild (:meth:`IdIndex.rebuild`): eviction happens in bulk every few steps,
and rebuilding from the survivors is simpler and faster than tombstones that would lengthen probes.
Small deletions between steps (rows migrating away, a chunk at a time) use tombstones
(:meth:`IdIndex.remove`) so that they cost what they delete, not the whole table; tombstones are
dropped at the next growth or rebuild.
"""

from __future__ import annotations

import numpy as np

from hetgmp.runtime import fmix64

__all__ = ["IdIndex"]

_EMPTY = np.int64(-1)
_DEAD = np.int64(-2)  # a removed entry: probes go on past it, inserts do not reuse it
_ENTRY = np.dtype([("key", np.int64), ("val", np.int64)])


class IdIndex:
    """int64 id -> int64 slot for non-negative ids.

    Attributes:
        size: Number of ids stored.
    """

    def __init__(self, capacity: int = 1024, max_load: float = 0.5) -> None:
        """Create an empty index.

        Args:
            capacity: Initial bucket count (rounded up to a power of two).
            max_load: The table doubles before holding more than this fraction of its buckets.
        """
        if not 0.0 < max_load < 1.0:
            raise ValueError("max_load must lie in (0, 1)")
        self._max_load = max_load
        self.size = 0
        self._dead = 0
        self._alloc(_pow2(capacity))

    def _alloc(self, buckets: int) -> None:
        self._table = np.zeros(buckets, dtype=_ENTRY)
        self._table["key"] = _EMPTY
        # Strided views of the two fields, for the probe rounds past the first and for inserts.
        self._keys = self._table["key"]
        self._vals = self._table["val"]
        self._mask = np.uint64(buckets - 1)

    @property
    def buckets(self) -> int:
        """Current number of buckets."""
        return int(self._keys.size)

    @property
    def nbytes(self) -> int:
        """Bytes held by the table."""
        return int(self._table.nbytes)

    def _home(self, ids: np.ndarray, hashed: np.ndarray | None = None) -> np.ndarray:
        """Home bucket of each id (``hashed``: ``fmix64(ids)``, when the caller has it)."""
        h = fmix64(ids) if hashed is None else hashed
        return (h & self._mask).view(np.int64)  # h & mask is a fresh array: the view owns it

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id, -1 where absent (any shape; returns the same shape)."""
        query = np.ascontiguousarray(ids, dtype=np.int64)
        values, found = self.lookup(query.ravel())
        values[~found] = -1
        return values.reshape(query.shape)

    def lookup(self, flat: np.ndarray, hashed: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Value of each id of a flat int64 array, and whether it is present.

        Args:
            flat: 1-d int64 ids.
            hashed: ``fmix64(flat)``, when the caller has it already.

        Returns:
            (int64 value of each id, unspecified where absent; bool presence of each id).
        """
        if flat.size == 0 or self.size == 0:
            return np.zeros(flat.size, dtype=np.int64), np.zeros(flat.size, dtype=bool)
        _, entries, found, rest, later = self._search(flat, hashed)
        values = np.ascontiguousarray(entries["val"])
        hit = later >= 0
        values[rest[hit]] = self._vals[later[hit]]
        found[rest[hit]] = True
        return values, found

    def locate(self, flat: np.ndarray, hashed: np.ndarray | None = None) -> np.ndarray:
        """Bucket of each id of a flat int64 array, -1 where absent.

        Buckets are stable until the next insert, growth or rebuild.

        Args:
            flat: 1-d int64 ids.
            hashed: ``fmix64(flat)``, when the caller has it already.
        """
        if flat.size == 0 or self.size == 0:
            return np.full(flat.size, -1, dtype=np.int64)
        pos, _, found, rest, later = self._search(flat, hashed)
        out = np.where(found, pos, -1)
        out[rest] = later
        return out

    def _search(self, flat: np.ndarray, hashed: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Probe for every id of ``flat`` (a non-empty table).

        The first round gathers whole entries (id and value together) on whole arrays: at
        load <= 1/2 most ids end there, found or at an empty bucket. Only the rest go on,
        bucket by bucket, gathering through the shrinking set of survivors.

        Returns:
            (home bucket of each id, its entry there, whether that entry holds it, the ids
            that went on probing, and for each of those its bucket or -1 where absent).
        """
        pos = self._home(flat, hashed)
        entries = self._table[pos]
        keys = entries["key"]
        found = keys == flat
        rest = np.flatnonzero(~found & (keys != _EMPTY))
        mask = np.int64(self._mask)
        later = np.full(rest.size, -1, dtype=np.int64)
        active, want, at = np.arange(rest.size), flat[rest], (pos[rest] + 1) & mask
        while active.size:
            k = self._keys[at]
            hit = k == want
            later[active[hit]] = at[hit]
            # A miss continues past occupied (or removed) buckets; an empty one ends the probe.
            go_on = ~hit & (k != _EMPTY)
            active, want, at = active[go_on], want[go_on], (at[go_on] + 1) & mask
        return pos, entries, found, rest, later

    def remove(self, ids: np.ndarray) -> int:
        """Remove ids (absent ones are ignored); returns how many were present."""
        buckets = self.locate(np.ascontiguousarray(ids, dtype=np.int64).ravel())
        buckets = np.unique(buckets[buckets >= 0])
        self._keys[buckets] = _DEAD
        self.size -= int(buckets.size)
        self._dead += int(buckets.size)
        return int(buckets.size)

    def copy(self) -> IdIndex:
        """An independent copy (one array copy, no rehash)."""
        other = IdIndex.__new__(IdIndex)
        other._max_load, other.size, other._dead = self._max_load, self.size, self._dead
        other._table = self._table.copy()
        other._keys, other._vals = other._table["key"], other._table["val"]
        other._mask = self._mask
        return other

    def assign(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Set the slots of ids already present (raises if one is absent)."""
        flat = np.ascontiguousarray(ids, dtype=np.int64).ravel()
        buckets = self.locate(flat)
        if (buckets < 0).any():
            raise KeyError(f"{int((buckets < 0).sum())} id(s) not in the index, e.g. "
                           f"{int(flat[buckets < 0][0])}")
        self._vals[buckets] = np.ascontiguousarray(slots, dtype=np.int64).ravel()

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Add ids (unique, non-negative, not yet present) with their slots."""
        new = np.ascontiguousarray(ids, dtype=np.int64).ravel()
        vals = np.ascontiguousarray(slots, dtype=np.int64).ravel()
        if new.shape != vals.shape:
            raise ValueError("ids and slots must have the same length")
        if new.size == 0:
            return
        if int(new.min()) < 0:
            raise ValueError("ids must be non-negative (negative values are sentinels)")
        if (self.size + self._dead + new.size) > self._max_load * self.buckets:
            self._grow(self.size + new.size)
        self._place(new, vals)
        self.size += int(new.size)

    def _place(self, new: np.ndarray, vals: np.ndarray) -> None:
        pos = self._home(new)
        active = np.arange(new.size)
        mask = np.int64(self._mask)
        while active.size:
            p = pos[active]
            free = self._keys[p] == _EMPTY
            # Several new ids may probe the same empty bucket in one round: the first of each
            # bucket takes it, the others move on like any id that met an occupied bucket.
            buckets, first = np.unique(p[free], return_index=True)
            winners = active[free][first]
            self._keys[buckets] = new[winners]
            self._vals[buckets] = vals[winners]
            placed = np.zeros(new.size, dtype=bool)
            placed[winners] = True
            active = active[~placed[active]]
            pos[active] = (pos[active] + 1) & mask

    def _grow(self, needed: int) -> None:
        keys, vals = self.items()
        buckets = self.buckets
        while needed > self._max_load * buckets:
            buckets *= 2
        self._alloc(buckets)
        self._dead = 0
        self._place(keys, vals)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, slots) of every entry, in bucket order."""
        used = self._keys >= 0
        return self._keys[used].copy(), self._vals[used].copy()

    def rebuild(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Replace the content with exactly these entries (how removal is done)."""
        keep = np.ascontiguousarray(ids, dtype=np.int64).ravel()
        self.size = 0
        self._dead = 0
        buckets = 16
        while keep.size > self._max_load * buckets:
            buckets *= 2
        # Shrink too, so that a burst of ids does not pin memory after it has been evicted.
        self._alloc(max(buckets, 16))
        self.insert(keep, slots)


def _pow2(n: int) -> int:
    p = 16
    while p < n:
        p *= 2
    return p
