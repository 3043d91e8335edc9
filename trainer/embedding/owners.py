"""Owners of ids on the device: a placement's ``owner_of`` without the host, and a sorted search.
"""

from __future__ import annotations

import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer.embedding.device_init import fmix64_mod

__all__ = ["DevicePlacement", "find_in"]


class DevicePlacement:
    """A placement's owners as tensors on one device: ``Placement.owner_of`` without the host."""

    def __init__(self, placement: Placement, device: torch.device) -> None:
        """Copy the explicit table to ``device`` (once per placement: the copy waits).

        Args:
            placement: Owners and replicas of rows.
            device: Where the ids to place are.
        """
        self.placement = placement
        self.world = placement.num_workers
        self._ids = torch.tensor(placement.ids, dtype=torch.int64, device=device)
        self._owners = torch.tensor(placement.owners, dtype=torch.int64, device=device)

    def owner_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Owner of each id (int64, shape of ``ids``): explicit owner, else the default."""
        owner = fmix64_mod(ids, self.world)
        if self._ids.numel():
            pos = torch.searchsorted(self._ids, ids).clamp_(max=self._ids.numel() - 1)
            owner = torch.where(self._ids[pos] == ids, self._owners[pos], owner)
        return owner


def find_in(sorted_ids: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Position of each of ``ids`` in ``sorted_ids`` (clamped) and whether it is there."""
    if sorted_ids.numel() == 0:
        zero = torch.zeros_like(ids)
        return zero, zero.bool()
    pos = torch.searchsorted(sorted_ids, ids).clamp_(max=sorted_ids.numel() - 1)
    return pos, sorted_ids[pos] == ids
