"""Sorted runs searched with ``torch.searchsorted`` (the ``"sorted"`` design, LSM-style).

Two runs, each a sorted int64 key array and its value array ending in a sentinel entry (key
``2**63 - 1``, value -1) that every search result can point at without a bounds check and that
masked scatters use as a sink:

* the main run, rebuilt only by a compaction;
* a buffer run that takes the inserts; when it passes ``buffer_fraction`` of the main run, the
  two are merged and the tombstones dropped (a compaction).

A deleted entry keeps its key and gets value -1 (a tombstone) until the next compaction. Within
the buffer one key may then appear several times (deleted, inserted again, ...): merges put a
new entry before the equal keys already there, so the first of equal keys, the one
``searchsorted`` finds, is always the newest, and it is the only one that can be live. A
compaction keeps the live entries only; their count is the host's ``size``, so it needs no
readback.

Every operation is a fixed sequence of whole-array tensor operations: **no sync** in find,
insert, remove or a compaction. Merging two sorted runs costs no sort: each element's place in
the merged run is its own index plus its rank in the other run (one ``searchsorted`` each way),
and a scatter puts it there; a compaction is a cumulative sum of the live flags and a scatter.
The price is memory traffic: an insert rewrites the buffer, and a compaction the whole table.
"""

from __future__ import annotations

import torch

__all__ = ["Run", "SortedRuns", "among", "compact_run", "make_run", "merge_run", "search_run",
           "stable_order"]

_TOP = 2**63 - 1  # sentinel key: no id sorts after it (an id equal to it sorts before it)
_MIN_BUFFER = 4096  # below this many buffer entries a compaction is not worth it

Run = tuple[torch.Tensor, torch.Tensor]  # (sorted keys, values), the sentinel entry last


def make_run(keys: torch.Tensor, vals: torch.Tensor) -> Run:
    """A run from sorted entries: the arrays with the sentinel appended."""
    top = torch.full((1,), _TOP, dtype=torch.int64, device=keys.device)
    return torch.cat([keys, top]), torch.cat([vals, torch.full_like(top, -1, dtype=vals.dtype)])


def search_run(run: Run, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(position of the first key >= each id, whether it is that id and live)."""
    keys, vals = run
    pos = torch.searchsorted(keys, flat)  # <= the sentinel's index: ids are <= _TOP
    return pos, (keys[pos] == flat) & (vals[pos] >= 0)


def _found(run: Run, flat: torch.Tensor, otherwise: torch.Tensor | None) -> torch.Tensor:
    """The value of each id in ``run``, else ``otherwise`` (None: -1): one search, one gather
    of keys and one of values (in a run of 10^7 the search is most of a lookup's time)."""
    keys, vals = run
    pos = torch.searchsorted(keys, flat)
    val = vals[pos]
    return torch.where((keys[pos] == flat) & (val >= 0), val,
                       -1 if otherwise is None else otherwise)


def merge_run(run: Run, keys: torch.Tensor, vals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge sorted newer entries into a run (sentinel dropped): new before equal old keys.

    Each element's place is its index plus the number of elements of the other array that go
    before it; the tie rule (``side="left"`` one way, ``"right"`` the other) makes the places a
    permutation.
    """
    old_k, old_v = run[0][:-1], run[1][:-1]
    device = keys.device
    to_new = torch.arange(keys.numel(), device=device) + torch.searchsorted(old_k, keys)
    to_old = torch.arange(old_k.numel(), device=device) + torch.searchsorted(keys, old_k, right=True)
    out_k = torch.empty(old_k.numel() + keys.numel(), dtype=torch.int64, device=device)
    out_v = torch.empty_like(out_k, dtype=vals.dtype)
    out_k[to_old], out_v[to_old] = old_k, old_v
    out_k[to_new], out_v[to_new] = keys, vals
    return out_k, out_v


def compact_run(keys: torch.Tensor, vals: torch.Tensor, live: int) -> Run:
    """The run of the live entries (value >= 0) of sorted arrays holding ``live`` of them.

    ``live`` is a host count, so the result's length needs no readback. Should the count be
    short (a caller broke the contract), the surplus lands on the sentinel's place rather
    than out of bounds.
    """
    alive = vals >= 0
    place = torch.cumsum(alive, 0) - 1
    place = torch.where(alive & (place < live), place, live)
    out_k = torch.full((live + 1,), _TOP, dtype=torch.int64, device=keys.device)
    out_v = torch.full_like(out_k, -1, dtype=vals.dtype)
    out_k[place] = keys
    out_v[place] = vals
    out_k[-1], out_v[-1] = _TOP, -1
    return out_k, out_v


class SortedRuns:
    """The ``"sorted"`` design of :class:`hetgmp.trainer.embedding.device_index.DeviceIndex`.

    Attributes:
        size: Number of ids stored (live entries).
    """

    def __init__(self, device: torch.device, buffer_fraction: float = 0.125,
                 value_dtype: torch.dtype = torch.int64) -> None:
        """Create an empty index.

        Args:
            device: Where the tensors live.
            buffer_fraction: The buffer is merged into the main run when it holds more than
                this fraction of the main run's entries (or ``_MIN_BUFFER``, if more).
            value_dtype: How values are held (``torch.int32`` for values below ``2**31``:
                12 bytes an entry instead of 16); they are given and answered as int64.
        """
        if buffer_fraction <= 0.0:
            raise ValueError("buffer_fraction must be > 0")
        self._device = device
        self._fraction = buffer_fraction
        self._dtype = value_dtype
        self.size = 0
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        self._main: Run = make_run(empty, empty.to(value_dtype))
        self._buf: Run = make_run(empty, empty.to(value_dtype))

    @property
    def nbytes(self) -> int:
        """Bytes of both runs' arrays."""
        return sum(t.numel() * t.element_size() for run in (self._main, self._buf) for t in run)

    @property
    def entries(self) -> int:
        """Entries held, tombstones included (sentinels not counted)."""
        return self._main[0].numel() + self._buf[0].numel() - 2

    def find(self, flat: torch.Tensor) -> torch.Tensor:
        """Value of each id, -1 where absent (no sync)."""
        out = _found(self._main, flat, None)
        if self._buf[0].numel() > 1:
            out = _found(self._buf, flat, out)
        return out.long()

    def insert(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Add distinct absent ids to the buffer; compact when it is full (no sync)."""
        keys, order = torch.sort(flat)
        self._buf = make_run(*merge_run(self._buf, keys, values[order].to(self._dtype)))
        self.size += flat.numel()
        if self._buf[0].numel() - 1 > max(self._fraction * (self._main[0].numel() - 1),
                                          _MIN_BUFFER):
            self._compact()

    def remove(self, flat: torch.Tensor) -> None:
        """Turn the entries of distinct present ids into tombstones (no sync)."""
        for run in (self._main, self._buf):
            pos, hit = search_run(run, flat)
            # Misses write -1 over the sentinel's value, which is -1 already.
            run[1][torch.where(hit, pos, run[0].numel() - 1)] = -1
        self.size -= flat.numel()
        # Tombstones cost memory and search depth: drop them once they are half the entries.
        if 2 * (self.entries - self.size) > self.entries:
            self._compact()

    def _compact(self) -> None:
        """Merge the buffer into the main run and drop every tombstone."""
        self._main = compact_run(*merge_run(self._main, *(t[:-1] for t in self._buf)), self.size)
        self._buf = make_run(self._main[0][:0], self._main[1][:0])

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, values) in id order (compacts first; no sync)."""
        self._compact()
        return self._main[0][:-1].clone(), self._main[1][:-1].long()

    def rebuild(self, flat: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the content with exactly these entries (distinct ids)."""
        keys, order = torch.sort(flat)
        vals = values[order].to(self._dtype)
        self._main = make_run(keys, vals)
        self._buf = make_run(keys[:0], vals[:0])
        self.size = flat.numel()


def among(ids: torch.Tensor, sorted_set: torch.Tensor) -> torch.Tensor:
    """``torch.isin(ids, sorted_set)`` for a sorted set, by binary search: isin's own sorting
    path (taken for sets past a few dozen ids) calls unique, which waits on CUDA."""
    if sorted_set.numel() == 0:
        return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    pos = torch.searchsorted(sorted_set, ids).clamp_(max=sorted_set.numel() - 1)
    return sorted_set[pos] == ids


def stable_order(primary: torch.Tensor, secondary: torch.Tensor) -> torch.Tensor:
    """Positions sorted by ``primary``, ties by ``secondary`` (``np.lexsort((secondary,
    primary))``)."""
    first = torch.sort(secondary, stable=True).indices
    return first[torch.sort(primary[first], stable=True).indices]
