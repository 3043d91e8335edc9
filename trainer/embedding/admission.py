"""Admission counts: the ids used without a row, and in how many steps each was used.

An id gets a trainable row only after it was used in ``admit_after`` steps
(:class:`hetgmp.trainer.embedding.StoreConfig`); until then it is a *candidate*: an entry in an id index
with its count of steps and the last step that counted. Candidates cost two int64 each and no
row, which is what keeps a stream's one-off ids out of the table. Everything is a tensor on the
store's device, and nothing here reads the device back except where a method says so.
"""

from __future__ import annotations

import torch

from hetgmp.trainer.embedding.device_index import DeviceIndex
from hetgmp.trainer.embedding.device_sorted import stable_order

__all__ = ["Candidates"]


class Candidates:
    """The admission candidates of one store.

    Args:
        threshold: Steps an id must be used in to be admitted (``admit_after``; <= 1: every id
            is admitted at first use and no candidate is kept).
        device: Where the counts live.
    """

    def __init__(self, threshold: int, device: torch.device) -> None:
        self.threshold, self.device = threshold, device
        self._index = DeviceIndex(device=device)
        self._count = torch.zeros(0, dtype=torch.int64, device=device)
        self._last = torch.zeros(0, dtype=torch.int64, device=device)

    @property
    def size(self) -> int:
        """Candidates held (a host count)."""
        return self._index.size

    @property
    def nbytes(self) -> int:
        """Bytes of the counts and their index."""
        return int((self._count.numel() + self._last.numel()) * 8 + self._index.nbytes)

    def find(self, ids: torch.Tensor) -> torch.Tensor:
        """Candidate slot of each id, -1 where it is none."""
        return self._index.find(ids)

    def ripe(self, slots: torch.Tensor, step: int) -> torch.Tensor:
        """Whether each candidate (``slots`` from :meth:`find`, -1 for none) is admitted if it
        is used in ``step`` (this step counted once)."""
        known = slots >= 0
        if not self._count.numel():
            return torch.zeros_like(known)
        at = torch.where(known, slots, 0)
        seen = self._count[at] + (self._last[at] != step).to(torch.int64)
        return known & (seen >= self.threshold)

    def count(self, ids: torch.Tensor, step: int,
              known: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
        """Count ``step`` for distinct ids without a row (once per step, however often they are
        read in it); those not candidates yet become ones. Returns whether each reached the
        threshold.

        Args:
            ids: Distinct ids without a row.
            step: The step they are used in.
            known: Their candidate slots and how many are -1 (from :meth:`find`, counted on
                the device and read back by the caller); else they are looked up here, and the
                new ones counted with a readback.
        """
        if known is None:
            slots = self._index.find(ids)
            new = torch.nonzero(slots < 0).reshape(-1)
        else:
            slots = known[0]
            new = torch.nonzero_static(slots < 0, size=known[1]).reshape(-1)
        if new.numel():
            base = int(self._count.numel())
            fresh = torch.arange(base, base + int(new.numel()), dtype=torch.int64,
                                 device=self.device)
            slots[new] = fresh
            grow = torch.zeros(int(new.numel()), dtype=torch.int64, device=self.device)
            self._count = torch.cat([self._count, grow])
            self._last = torch.cat([self._last, grow - 1])
            self._index.insert(ids[new], fresh)
        # Ids are unique, so the slots are distinct: plain indexed updates are exact.
        self._count[slots] += (self._last[slots] != step).to(torch.int64)
        self._last[slots] = step
        return self._count[slots] >= self.threshold

    def kept(self, step: int, has_row: DeviceIndex, evict_after: int, cap: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(keep mask, ids, slots) of the candidates to keep, queued: those without a row in
        ``has_row``, used in the last ``evict_after`` steps (0: any), the ``cap`` most recent
        of them (0: no cap). None: no candidates."""
        if self._index.size == 0:
            return None
        ids, slots = self._index.items()
        keep = has_row.find(ids) < 0
        last = self._last[slots]
        if evict_after:
            keep &= last >= step - evict_after
        if cap and ids.numel() > cap:  # host-known: the cap may bind
            order = stable_order(-last, ids)
            ranked = keep[order]
            keep = torch.zeros_like(keep)
            keep[order] = ranked & (torch.cumsum(ranked, 0) <= cap)
        return keep, ids, slots

    def prune(self, kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor], n: int) -> None:
        """Keep the candidates :meth:`kept` chose (``n`` of them, read back by the caller)."""
        keep, ids, slots = kept
        at = torch.nonzero_static(keep, size=n).reshape(-1)
        ids, slots = ids[at], slots[at]
        self._count = self._count[slots]
        self._last = self._last[slots]
        self._index.rebuild(ids, torch.arange(n, dtype=torch.int64, device=self.device))
