"""A batch's distinct ids on the device, without reading their number back.

``torch.unique`` sizes its output by the number of distinct ids, so on CUDA it waits for the
device to count them before it returns. :func:`unique_padded` computes the same ids and inverse
with sort, compare, cumulative sum and scatters into arrays of the input's length: the count
stays on the device, where the caller can read it together with whatever else it needs (the
device step reads it once with the store's count of absent ids and the last step's loss).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Unique", "unique_padded"]


class Unique(NamedTuple):
    """Distinct ids of a flat tensor, padded to its length.

    Attributes:
        ids: The distinct ids in ascending order in ``ids[:n]``; what follows is padding
            (ids of the input, not distinct).
        inverse: For each input element, the position of its id in ``ids``
            (``ids[inverse]`` is the input).
        n: Number of distinct ids, a 0-d int64 tensor on the input's device.
        order: The input's positions sorted by id (the sort's permutation).
        rank: ``inverse[order]``, non-decreasing: the distinct id of each sorted element.
            With ``order`` it lists each distinct id's occurrences together, which a
            gradient summed per distinct id reads (:func:`hetgmp.trainer.model.pool_bags`).
    """

    ids: torch.Tensor
    inverse: torch.Tensor
    n: torch.Tensor
    order: torch.Tensor
    rank: torch.Tensor


def unique_padded(flat: torch.Tensor) -> Unique:
    """``torch.unique(flat, sorted=True, return_inverse=True)`` with no wait for the device.

    Args:
        flat: A 1-d tensor (any sortable dtype).

    Returns:
        The distinct ids, the inverse and their count (see :class:`Unique`). ``ids[:n]``
        and ``inverse`` equal ``torch.unique``'s.
    """
    if flat.dim() != 1:
        raise ValueError(f"unique_padded takes a 1-d tensor, got shape {tuple(flat.shape)}")
    if flat.numel() == 0:
        none = torch.zeros(0, dtype=torch.int64, device=flat.device)
        return Unique(flat.clone(), none, torch.zeros((), dtype=torch.int64, device=flat.device),
                      none, none)
    ordered, order = torch.sort(flat)
    first = torch.ones_like(ordered, dtype=torch.bool)
    torch.ne(ordered[1:], ordered[:-1], out=first[1:])
    rank = torch.cumsum(first, 0) - 1  # each sorted element's distinct id
    inverse = torch.empty_like(rank).scatter_(0, order, rank)
    # Equal ids write the same value to their rank: the scatter's result does not depend on
    # which write lands last. Positions past n keep the sorted input's values.
    ids = ordered.clone().scatter_(0, rank, ordered)
    return Unique(ids, inverse, rank[-1] + 1, order, rank)
