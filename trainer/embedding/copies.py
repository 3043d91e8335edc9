"""What an owner knows of the copies other ranks hold of its rows: each copy's lag and whether
its holder knows it is stale (the owner side of HET's bounded staleness, on the device).

An owner counts, per copy another rank holds of a row it owns, the updates it applied that the
copy has not got: every update but the holder's own pushes (:meth:`OwnerCopies.age`). A refresh
sets the count to zero (:meth:`OwnerCopies.read`). When a count passes ``s``, the owner tells
the holder (a notice, :meth:`OwnerCopies.notices`) and the copy is stale until it is read and
refreshed. Placement and replica-set changes are followed by the rule both ends apply
(:meth:`OwnerCopies.follow`): a copy keeps its lag only while both its holder's set and its
row's owner stay.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetgmp.partitioner import Placement, find_sorted
from hetgmp.trainer.embedding.dedup import Unique
from hetgmp.trainer.embedding.owners import find_in

__all__ = ["OwnerCopies"]


@dataclass
class _Copies:
    """The copies one rank holds of rows this rank owns.

    Attributes:
        host_ids: Sorted ids of the copies (``ids`` the same on the device).
        lag: Updates applied here that each copy has not got (meaningless while stale).
        stale: The holder knows the copy is to be refreshed at its next read (no copy yet, or
            a notice was sent).
    """

    host_ids: np.ndarray
    ids: torch.Tensor
    lag: torch.Tensor
    stale: torch.Tensor


class OwnerCopies:
    """Per rank, the copies it holds of rows owned by rank ``me``, as ``me`` follows them."""

    def __init__(self, me: int, device: torch.device) -> None:
        self.me, self.device = me, device
        self._by_rank: list[_Copies] = []

    def ids(self, holder: int) -> torch.Tensor:
        """Sorted ids of the copies ``holder`` holds of rows owned here."""
        return self._by_rank[holder].ids

    def follow(self, placement: Placement) -> None:
        """The copies ``placement`` gives (between steps): a copy keeps its lag and staleness
        where its holder had it before and its row was owned here then too; every other copy
        (new, or whose row moved here) is stale, to be refreshed at its next read."""
        out = []
        for holder, reps in enumerate(placement.replicas):
            ids = reps[placement.owner_of(reps) == self.me] if holder != self.me else reps[:0]
            lag, stale = np.zeros(ids.size, np.int64), np.ones(ids.size, bool)
            if self._by_rank and self._by_rank[holder].ids.numel() and ids.size:
                old = self._by_rank[holder]
                pos = find_sorted(old.host_ids, ids)
                kept = np.flatnonzero(pos >= 0)
                lag[kept] = old.lag.cpu().numpy()[pos[kept]]
                stale[kept] = old.stale.cpu().numpy()[pos[kept]]
            # A copy, not a view: a placement's arrays are read-only.
            on = lambda a: torch.tensor(a, device=self.device)  # noqa: E731
            out.append(_Copies(ids, on(ids), on(lag), on(stale)))
        self._by_rank = out

    def notices(self, s: int) -> list[torch.Tensor]:
        """Per holder, a mask of its copies that fell more than ``s`` behind since the last
        notices; they are stale from now on (the owner tells the holder)."""
        told = []
        for c in self._by_rank:
            new = ~c.stale & (c.lag > s)
            c.stale |= new
            told.append(new)
        return told

    def read(self, holder: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``holder`` reads its copies of ``ids`` (rows owned here): which get a row now (the
        stale ones, fresh from now on) and the lag of each read (0 for those refreshed)."""
        if ids.numel() == 0:
            return (torch.zeros(0, dtype=torch.bool, device=self.device),
                    torch.zeros(0, dtype=torch.int64, device=self.device))
        c = self._by_rank[holder]
        at = find_in(c.ids, ids)[0]
        fresh = c.stale[at]
        lag = torch.where(fresh, 0, c.lag[at])
        c.lag[at] = lag
        c.stale[at] = False
        return fresh, lag

    def age(self, u: Unique, counts: torch.Tensor, src: torch.Tensor,
            updates: torch.Tensor) -> None:
        """Copies of rows just updated fall behind by every update but their holder's own.

        Args:
            u: The rows updated (distinct ids, ``u.ids[:u.n]``, and each contribution's row).
            counts: Updates applied to each of ``u``'s rows (0 where the store dropped them).
            src: The rank each contribution came from, ``updates`` the updates it stands for.
        """
        ids, inverse, n = u.ids, u.inverse, u.n
        # The padding past n is not sorted: search an array whose tail repeats the last id.
        last = ids.gather(0, (n - 1).clamp(min=0).reshape(1))
        ordered = torch.where(torch.arange(ids.numel(), device=ids.device) < n, ids, last)
        for holder, c in enumerate(self._by_rank):
            if c.ids.numel() == 0:
                continue
            pos, hit = find_in(ordered, c.ids)
            own = torch.zeros(ids.numel(), dtype=torch.int64, device=ids.device)
            own.index_add_(0, inverse, updates * (src == holder))
            own = torch.where(counts > 0, own, 0)
            c.lag += torch.where(hit & (pos < n), counts[pos] - own[pos], 0)
