"""Hash tables over groups of slots in torch tensor operations: the ``"probe"`` and ``"stash"``
designs of :class:`trainer.embedding.device_index.DeviceIndex`.

Layout (both): one int64 tensor of ``groups + 1`` rows; a row is a group, ``width`` keys then
their ``width`` values (128 bytes at width 8), so one row gather brings a group's keys and
values together (on a CPU two adjacent cache lines, on CUDA one coalesced read). A free slot
holds key -1. The last row is a sink that no probe visits: the scatters of lanes that must not
write anything point there, which keeps every step a fixed set of whole-batch operations with
no boolean compaction (on CUDA a boolean index is a sync: its result's length is data).

The home group of an id is given by the low bits of :func:`mix_ids`. The designs differ in
where a key goes when its group has no room, and so in how an insert places keys:

``"probe"`` (:class:`OpenAddressing`): to the next group (linear probing on groups). ``reach``,
    the longest displacement of any key stored since the last rehash, is a host integer, so a
    find is ``reach + 1`` fixed rounds of one row gather each: **no sync**. An insert claims
    slots in rounds: every unplaced key picks a free lane of its current group (the first free
    one from a lane given by the top bits of its hash, so that keys sharing a group spread)
    and claims it with ``scatter_reduce_(amax)`` of its key into the table itself. Free slots
    hold -1 and keys are >= 0, so the largest claimant wins and is written in the same
    operation; each claimant reads back whether its own key landed, losers retry, keys whose
    group is full move to the next. The rounds go on until every key is placed, which the host
    learns from one readback per block of rounds: **one sync per block**, and the first block
    places a whole batch in the common case.
``"stash"`` (:class:`StashTable`): into a small sorted overflow run (a "stash", searched with
    ``torch.searchsorted``). A find is one row gather and one search of the stash: **no sync**.
    An insert needs no claim rounds: sorted by home group, the k-th key of a group in the
    batch takes the group's k-th free lane (a cumulative sum over the row's free lanes), and
    the keys past their group's free lanes are merged into the stash. The host needs their
    count to size that merge: **exactly one sync** per insert.

Removal frees a row slot at once in both: no probe ends at an empty slot (the probe design's
rounds are bounded by ``reach``, the stash design looks at one group and the stash), so a freed
slot needs no tombstone mark and the next insert reuses it. A stash entry becomes a tombstone
(value -1) until the stash's next compaction. A removal is a find and a scatter: **no sync**.
Growth and rehashing are host decisions on host counts; the rehash itself reads the device
(rare: the table doubles each time).
"""

from __future__ import annotations

import torch

from trainer.embedding.device_sorted import Run, compact_run, make_run, merge_run, search_run

__all__ = ["OpenAddressing", "StashTable", "mix_ids"]

_EMPTY = -1
_NOT_A_KEY = -3  # what the lanes that claim nothing scatter: below every free mark and key
_M32 = 0xFFFFFFFF
# The multiplier of a well-known 32-bit xorshift-multiply hash: odd (so each step is a bijection
# of 32-bit values) and below 2**27, so that a 32-bit value times it stays far inside int64.
_C32 = 0x045D9F3B
_WIDTH = 8  # slots per group: 64 bytes of keys, one CPU cache line, two CUDA 32-byte sectors
_FIRST_BLOCK = 4  # probe design: rounds before an insert's first readback
_LATER_BLOCK = 8  # probe design: rounds between later readbacks, on the few keys left
_MAX_REACH = 4  # probe design: a longer displacement triggers a rehash (it slows every find)
_STASH_SHARE = 1 / 32  # stash design: a stash above this share of the entries calls a rehash
_MIN_STASH = 1024  # below this many entries the stash is neither compacted nor a reason to grow


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of 32-bit values held in int64 (xorshift-multiply), with no overflow."""
    x = x ^ (x >> 16)
    x = (x * _C32) & _M32
    x = x ^ (x >> 16)
    x = (x * _C32) & _M32
    return x ^ (x >> 16)


def mix_ids(ids: torch.Tensor) -> torch.Tensor:
    """Hash non-negative int64 ids to 32-bit values (in int64), the same on every device.

    Ids are hashes already but their low bits need not be uniform (``field << 40 | value``),
    so they are mixed before choosing a home group. torch has no unsigned 64-bit arithmetic on
    every device, and a signed multiply that overflows has no defined result in the C++ kernels
    behind it, so the mixer works on the two 32-bit halves, each product a 32-bit value times a
    27-bit constant (well inside int64): ``mix32(lo ^ mix32(hi))``. ``mix32`` is a bijection,
    so ids that differ in either half differ before the final mix; the output has 32 bits,
    enough for 2**32 groups.

    Args:
        ids: int64 tensor, values >= 0 (any shape).

    Returns:
        int64 tensor of the same shape with values in ``[0, 2**32)``.
    """
    hi = ids >> 32  # ids are >= 0, so the arithmetic shift leaves 31 bits
    return _mix32((ids & _M32) ^ _mix32(hi))


class _Groups:
    """The group table and the home of an id, shared by both hash designs.

    Attributes:
        size: Number of ids stored.
    """

    def __init__(self, capacity: int, max_load: float, device: torch.device,
                 width: int = _WIDTH) -> None:
        """Create an empty table.

        Args:
            capacity: Entries to hold before the first growth.
            max_load: Fraction of slots in use past which the table doubles.
            device: Where the tensors live.
            width: Slots per group (a power of two).
        """
        if width < 1 or width & (width - 1):
            raise ValueError("width must be a power of two")
        self._device = device
        self._max_load = max_load
        self._width = width
        self._lane = torch.arange(width, dtype=torch.int64, device=device)
        self.size = 0
        self._alloc(self._groups_for(capacity))

    def _groups_for(self, entries: int) -> int:
        groups = 2
        while entries > self._max_load * groups * self._width:
            groups *= 2
        return groups

    def _alloc(self, groups: int) -> None:
        w = self._width
        self._groups = groups
        self._gmask = groups - 1
        self._table = torch.full((groups + 1, 2 * w), _EMPTY, dtype=torch.int64,
                                 device=self._device)
        self._flat = self._table.view(-1)
        self._keys = self._table[:, :w]  # a strided view: gathers of keys alone, for inserts
        self._sink = groups * 2 * w  # the sink row's first key; its first value is w further

    @property
    def slots(self) -> int:
        """Slots in the table (the sink row not counted)."""
        return self._groups * self._width

    def _table_bytes(self) -> int:
        return self._table.numel() * self._table.element_size()

    def _home(self, flat: torch.Tensor) -> torch.Tensor:
        """Home group of each id."""
        return mix_ids(flat) & self._gmask

    def _lane_order(self, flat: torch.Tensor) -> torch.Tensor:
        """Each key's rank of the lanes, cyclically from a first lane of its own.

        The first lane comes from the hash's top bits, the group from its low ones:
        independent until the table has 2**(32 - log2(width)) groups.
        """
        first = mix_ids(flat) >> (32 - (self._width.bit_length() - 1))
        return (self._lane - first.unsqueeze(1)) & (self._width - 1)

    def _value_in(self, flat: torch.Tensor, grp: torch.Tensor) -> torch.Tensor:
        """Value of each id in group ``grp`` (one row gather), -1 where it is not there."""
        rows = self._table.index_select(0, grp)
        w = self._width
        hit = rows[:, :w] == flat.unsqueeze(1)
        return torch.where(hit, rows[:, w:], -1).amax(1)  # values are >= 0: the hit wins

    def _slot_in(self, flat: torch.Tensor, grp: torch.Tensor, miss: torch.Tensor) -> torch.Tensor:
        """Flat key index of each id in group ``grp``, ``miss`` where it is not there."""
        hit = self._keys.index_select(0, grp) == flat.unsqueeze(1)
        lane = (hit * self._lane).sum(1)  # at most one lane holds the id
        return torch.where(hit.any(1), grp * (2 * self._width) + lane, miss)

    def _claim(self, flat: torch.Tensor, values: torch.Tensor, grp: torch.Tensor,
               order: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """One claim round for the ``active`` keys in their group ``grp``.

        ``order`` ranks each key's lanes (``(lane - lane0) mod width``): a key takes the free
        lane it ranks first. Clears ``active`` in place for the keys placed; returns whether
        each key's group had a free slot (the keys whose group was full must go elsewhere).
        """
        w = self._width
        free = self._keys.index_select(0, grp) < 0
        has_free = free.any(1)
        slot = grp * (2 * w) + torch.where(free, order, w).argmin(1)
        claim = active & has_free
        target = torch.where(claim, slot, self._sink)
        self._flat.scatter_reduce_(0, target, torch.where(claim, flat, _NOT_A_KEY), reduce="amax")
        won = claim & (self._flat[target] == flat)
        self._flat[torch.where(won, slot, self._sink) + w] = values
        active &= ~won
        return has_free

    def _row_items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, values) held in the rows (a boolean index: one sync)."""
        w = self._width
        keys = self._table[: self._groups, :w].reshape(-1)
        vals = self._table[: self._groups, w:].reshape(-1)
        used = keys >= 0
        return keys[used], vals[used]

    # What each design gives: its entries, and how it places new ones.
    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _place(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        raise NotImplementedError

    def _check_reach(self) -> None:
        """Raise when an entry lies beyond what a lookup probes (designs that can)."""

    def _rehash(self, groups: int) -> None:
        keys, vals = self.items()
        self._alloc(groups)
        if keys.numel():
            self._place(keys, vals)

    def rebuild(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the content; the table is sized to the entries (so it may shrink)."""
        self._alloc(self._groups_for(flat.numel()))
        self.size = flat.numel()
        if flat.numel():
            self._place(flat, values)
        self._check_reach()


def _first(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` set elements of a bool mask, ``count`` known on the host.

    A stable sort puts them first; unlike ``nonzero`` it needs no readback of the count.
    """
    return torch.sort((~mask).to(torch.uint8), stable=True).indices[:count]


class OpenAddressing(_Groups):
    """The ``"probe"`` design: linear probing on groups, finds bounded by ``reach`` rounds.

    Attributes:
        reach: Longest displacement (in groups) of a key stored since the last rehash.
    """

    def __init__(self, capacity: int, max_load: float, device: torch.device,
                 width: int = _WIDTH) -> None:
        """Create an empty table (arguments as :class:`_Groups`)."""
        self.reach = 0
        # Raised when a rehash cannot bring reach down (ids whose 32-bit hashes are equal share
        # a home group at every size), so that such ids cost longer finds, not endless growth.
        self._reach_limit = _MAX_REACH
        super().__init__(capacity, max_load, device, width)

    def _alloc(self, groups: int) -> None:
        super()._alloc(groups)
        self.reach = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the table."""
        return self._table_bytes()

    def find(self, flat: torch.Tensor) -> torch.Tensor:
        """Value of each id, -1 where absent (no sync: ``reach + 1`` fixed rounds)."""
        out = torch.full_like(flat, -1)
        if flat.numel() == 0 or self.size == 0:
            return out
        grp = self._home(flat)
        for r in range(self.reach + 1):  # a host count: the trip count reads no device data
            g = grp if r == 0 else (grp + r) & self._gmask
            out = torch.maximum(out, self._value_in(flat, g))  # ids are unique: one hit at most
        return out

    def insert(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Add distinct absent ids (one sync per block of rounds, see the module docstring)."""
        n = flat.numel()
        if self.size + n > self._max_load * self.slots:
            self._rehash(self._groups_for(self.size + n))
        self._place(flat, values)
        self.size += n
        self._check_reach()

    def _check_reach(self) -> None:
        if self.reach > self._reach_limit:
            self._rehash(2 * self._groups)
            if self.reach > self._reach_limit:
                self._reach_limit = 2 * self.reach

    def _place(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        grp, order = self._home(flat), self._lane_order(flat)
        disp = torch.zeros_like(flat)
        active = torch.ones_like(flat, dtype=torch.bool)
        rounds = _FIRST_BLOCK
        while True:
            for _ in range(rounds):
                full = active & ~self._claim(flat, values, grp, order, active)
                disp += full
                grp = torch.where(full, (grp + 1) & self._gmask, grp)
            # The data-dependent decision of an insert: on CUDA this readback is a sync (the
            # host waits for the queued rounds), once per block of rounds.
            left, longest = (int(x) for x in torch.stack([active.sum(), disp.max()]).tolist())
            self.reach = max(self.reach, longest)
            if left == 0:
                return
            if longest > self._groups:
                raise RuntimeError("id index: a key probed every group (table full?)")
            keep = _first(active, left)
            flat, values, grp, order, disp = (t[keep] for t in (flat, values, grp, order, disp))
            active = torch.ones_like(flat, dtype=torch.bool)
            rounds = _LATER_BLOCK

    def remove(self, flat: torch.Tensor) -> None:
        """Free the slots of distinct present ids (no sync)."""
        grp = self._home(flat)
        slot = torch.full_like(flat, self._sink)
        for r in range(self.reach + 1):
            slot = self._slot_in(flat, grp if r == 0 else (grp + r) & self._gmask, slot)
        self._flat[slot] = _EMPTY  # absent ids point at the sink, which stays empty
        self.size -= flat.numel()

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, values) in slot order (one sync)."""
        return self._row_items()



class StashTable(_Groups):
    """The ``"stash"`` design: each id in its home group, or else in a sorted overflow stash.

    Attributes:
        stashed: Live entries of the stash as of the last insert (a host count).
    """

    def __init__(self, capacity: int, max_load: float, device: torch.device,
                 width: int = _WIDTH) -> None:
        """Create an empty table (arguments as :class:`_Groups`)."""
        self.stashed = 0
        # Raised when a rehash cannot shrink the stash (ids whose 32-bit hashes are equal
        # overflow one group at every size), so that such ids stay stashed, not grow the table.
        self._stash_limit = _MIN_STASH
        super().__init__(capacity, max_load, device, width)

    def _alloc(self, groups: int) -> None:
        super()._alloc(groups)
        empty = torch.zeros(0, dtype=torch.int64, device=self._device)
        self._stash: Run = make_run(empty, empty)
        # Live stash entries, counted on the device: a removal cannot tell the host how many of
        # its ids were stashed without a sync, and the next insert's readback carries it.
        self._stash_live = torch.zeros((), dtype=torch.int64, device=self._device)
        self.stashed = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the table and the stash."""
        return self._table_bytes() + 2 * 8 * self._stash[0].numel()

    def _stash_used(self) -> bool:
        return self._stash[0].numel() > 1  # more than the sentinel (host-known shape)

    def find(self, flat: torch.Tensor) -> torch.Tensor:
        """Value of each id, -1 where absent (no sync: one row gather and one search)."""
        if flat.numel() == 0 or self.size == 0:
            return torch.full_like(flat, -1)
        out = self._value_in(flat, self._home(flat))
        if self._stash_used():
            pos, hit = search_run(self._stash, flat)
            out = torch.where(hit, self._stash[1][pos], out)
        return out

    def insert(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Add distinct absent ids (exactly one sync, see the module docstring)."""
        n = flat.numel()
        if self.size + n > self._max_load * self.slots:
            self._rehash(self._groups_for(self.size + n))
        self._place(flat, values)
        self.size += n
        if self.stashed > max(self._stash_limit, _STASH_SHARE * self.size):
            self._rehash(2 * self._groups)
            if self.stashed > max(self._stash_limit, _STASH_SHARE * self.size):
                self._stash_limit = 2 * self.stashed

    def _place(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        # One pass, no claims to resolve: sorted by home group, the k-th key of a group in the
        # batch takes the group's k-th free lane; a key past its group's free lanes is left.
        grp, by_group = torch.sort(self._home(flat), stable=True)
        flat, values = flat[by_group], values[by_group]
        run_start = torch.searchsorted(grp, grp)  # first index of each key's group in the batch
        rank = torch.arange(flat.numel(), device=self._device) - run_start
        free = self._keys.index_select(0, grp) < 0
        pick = free & (free.cumsum(1) == (rank + 1).unsqueeze(1))  # one lane, or none
        placed = pick.any(1)
        slot = torch.where(placed, grp * (2 * self._width) + (pick * self._lane).sum(1),
                           self._sink)
        self._flat[slot] = flat
        self._flat[slot + self._width] = values
        # The insert's one sync on CUDA: the host needs the number of keys left over to size
        # the stash merge, and the stash's live count (after any removals) to compact it.
        left, live = (int(x) for x in torch.stack([(~placed).sum(), self._stash_live]).tolist())
        self.stashed = live + left
        if left:
            keep = _first(~placed, left)
            keys, order = torch.sort(flat[keep])
            self._stash = make_run(*merge_run(self._stash, keys, values[keep][order]))
            self._stash_live += left
        held = self._stash[0].numel() - 1
        if held - self.stashed > max(self.stashed, _MIN_STASH):  # mostly tombstones
            self._stash = compact_run(self._stash[0][:-1], self._stash[1][:-1], self.stashed)

    def remove(self, flat: torch.Tensor) -> None:
        """Free the slots of distinct present ids, or tombstone their stash entries (no sync)."""
        self._flat[self._slot_in(flat, self._home(flat), torch.full_like(flat, self._sink))] = (
            _EMPTY)
        if self._stash_used():
            pos, hit = search_run(self._stash, flat)
            sentinel = self._stash[0].numel() - 1  # its value is -1 already
            self._stash[1][torch.where(hit, pos, sentinel)] = -1
            self._stash_live -= hit.sum()
        self.size -= flat.numel()

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, values): the rows' in slot order, then the stash's in id order (one sync)."""
        keys, vals = self._row_items()
        live = self._stash[1][:-1] >= 0
        return (torch.cat([keys, self._stash[0][:-1][live]]),
                torch.cat([vals, self._stash[1][:-1][live]]))

