"""The hash every process agrees on: default owners of ids and buckets of the id index."""

from __future__ import annotations

import numpy as np

__all__ = ["default_owner", "fmix64"]


def fmix64(ids: np.ndarray) -> np.ndarray:
    """Mix 64-bit integers with the MurmurHash3 finaliser (fmix64).

    Feature ids are themselves hashes, but their low bits need not be uniform (a producer might
    use ``field << 40 | value``), so the default owner mixes them first. Python's ``hash()`` is
    never used: it is salted per process and owners must agree across processes and runs.

    Args:
        ids: Integer array of any shape (int64 or uint64).

    Returns:
        A uint64 array of the same shape.
    """
    x = np.asarray(ids).astype(np.uint64, copy=True)
    # uint64 arithmetic wraps modulo 2**64, which is exactly what the mixer needs.
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= x >> np.uint64(33)
    return x


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
