"""The 64-bit mixer every process agrees on: MurmurHash3's finaliser (fmix64).

Feature ids (:mod:`hetgmp.streaming.hashing`), default owners (:func:`hetgmp.partitioner.default_owner`),
index buckets and the initial rows of the embedding table all use it, here on numpy arrays and
Python integers. (The device computes the same bits in 16-bit limbs, since torch has no uint64
arithmetic: :mod:`hetgmp.trainer.embedding.device_init`, checked against this one.) Python's
``hash()`` is never used: it is salted per process, and owners and ids must agree across
processes, runs and machines.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FMIX_C1", "FMIX_C2", "fmix64", "fmix64_int"]

FMIX_C1 = 0xFF51AFD7ED558CCD
FMIX_C2 = 0xC4CEB9FE1A85EC53
_M64 = (1 << 64) - 1


def fmix64(x: np.ndarray, *, inplace: bool = False) -> np.ndarray:
    """fmix64 of each element of an integer array (any shape), as uint64.

    Args:
        x: int64 or uint64 values (int64 are taken as their two's-complement bits).
        inplace: Mix a uint64 array in place (else a new array).
    """
    h = x if inplace else np.asarray(x).astype(np.uint64, copy=True)
    # uint64 arithmetic wraps modulo 2**64, which is exactly what the mixer needs.
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= np.uint64(FMIX_C1)
        h ^= h >> np.uint64(33)
        h *= np.uint64(FMIX_C2)
        h ^= h >> np.uint64(33)
    return h


def fmix64_int(h: int) -> int:
    """fmix64 of one non-negative Python integer below 2**64."""
    h ^= h >> 33
    h = (h * FMIX_C1) & _M64
    h ^= h >> 33
    h = (h * FMIX_C2) & _M64
    h ^= h >> 33
    return h
