"""Default owners of ids: ``fmix64(id) mod num_workers`` (the mixer: :mod:`hetgmp.runtime.hashing`)."""

from __future__ import annotations

import numpy as np

from hetgmp.runtime import fmix64

__all__ = ["default_owner"]


def default_owner(ids: np.ndarray, num_workers: int, hashed: np.ndarray | None = None) -> np.ndarray:
    """Owner of ids that no placement has placed explicitly: ``fmix64(id) mod num_workers``.

    Args:
        ids: int64 feature ids, any shape.
        num_workers: Number of workers (> 0).
        hashed: ``fmix64(ids)``, when the caller has it already.

    Returns:
        int32 array of owners, same shape as ``ids``.
    """
    h = fmix64(ids) if hashed is None else hashed
    return (h % np.uint64(num_workers)).astype(np.int32)
