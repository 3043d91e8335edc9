"""Initial row values computed on the rows' device, bit for bit those of ``initial_rows``.

:func:`hetgmp.trainer.embedding.optimizer.initial_rows` hashes ``(seed, id, column)`` with the fmix64
mixer in unsigned 64-bit arithmetic. torch has no unsigned 64-bit type on every device, and a
signed product that overflows has no defined result in the C++ kernels behind it, so here every
64-bit value is four 16-bit limbs held in int64 (the last dimension): a limb product is below
2**32 and a column of four of them with its carry stays far inside int64, so every operation is
defined and exact. :func:`initial_rows_on` then gives the device store its new rows without a
copy of their ids to the host and of the values back.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from hetgmp.runtime import FMIX_C1, FMIX_C2
from hetgmp.trainer.embedding.optimizer import column_keys, seed_key

__all__ = ["fmix64_mod", "initial_rows_on"]

_M16 = 0xFFFF


def _limbs_of(values: np.ndarray) -> np.ndarray:
    """uint64 values as int64 limbs ``[..., 4]``, least significant first."""
    v = np.asarray(values, dtype=np.uint64)
    return np.stack([((v >> np.uint64(16 * k)) & np.uint64(_M16)).astype(np.int64)
                     for k in range(4)], axis=-1)


def _limbs(ids: torch.Tensor) -> torch.Tensor:
    """int64 ids (their two's-complement bits) as limbs ``[..., 4]``."""
    return torch.stack([(ids >> (16 * k)) & _M16 for k in range(4)], dim=-1)


def _carry(columns: list[torch.Tensor]) -> torch.Tensor:
    """Limbs from four column sums (each below 2**40), carries propagated, mod 2**64."""
    out, carry = [], None
    for col in columns:
        t = col if carry is None else col + carry
        out.append(t & _M16)
        carry = t >> 16
    return torch.stack(out, dim=-1)


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _carry([a[..., k] + b[..., k] for k in range(4)])


def _mul_const(a: torch.Tensor, c: int) -> torch.Tensor:
    """``a * c mod 2**64`` for a 64-bit constant ``c``."""
    cs = [(c >> (16 * k)) & _M16 for k in range(4)]
    columns = []
    for k in range(4):
        col = a[..., 0] * cs[k]
        for i in range(1, k + 1):
            col = col + a[..., i] * cs[k - i]
        columns.append(col)
    return _carry(columns)


def _xor_shift_33(a: torch.Tensor) -> torch.Tensor:
    """``a ^ (a >> 33)``: 33 bits are two limbs and one bit."""
    shifted = [(a[..., k + 2] >> 1) | ((a[..., k + 3] & 1) << 15) if k + 3 < 4
               else a[..., k + 2] >> 1 if k + 2 < 4 else torch.zeros_like(a[..., 0])
               for k in range(4)]
    return a ^ torch.stack(shifted, dim=-1)


def _fmix64(a: torch.Tensor) -> torch.Tensor:
    a = _xor_shift_33(a)
    a = _mul_const(a, FMIX_C1)
    a = _xor_shift_33(a)
    a = _mul_const(a, FMIX_C2)
    return _xor_shift_33(a)


def fmix64_mod(ids: torch.Tensor, m: int) -> torch.Tensor:
    """``fmix64(ids) mod m`` (unsigned, as :func:`hetgmp.partitioner.default_owner` computes it) where
    ``ids`` are: the default owner of each id for ``m`` ranks, int64, shape of ``ids``."""
    if not 0 < m < 2**31:
        raise ValueError(f"modulus must be in [1, 2**31), got {m}")
    h = _fmix64(_limbs(ids.to(torch.int64)))
    r = h[..., 3] % m
    for k in (2, 1, 0):  # Horner's rule over the limbs: r * 2**16 + limb stays below 2**47
        r = (r * (_M16 + 1) + h[..., k]) % m
    return r


@functools.lru_cache(maxsize=64)
def _keys_on(device: torch.device, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's key and the columns' keys as limbs on ``device``, copied there once (a copy
    from pageable memory waits for the device: it must not run every step)."""
    key = torch.from_numpy(_limbs_of(np.array([seed_key(seed)], dtype=np.uint64)))
    cols = torch.from_numpy(_limbs_of(column_keys(dim)))
    return key.to(device), cols.to(device)


def initial_rows_on(ids: torch.Tensor, dim: int, seed: int, scale: float,
                    dtype: torch.dtype) -> torch.Tensor:
    """``initial_rows(ids, dim, seed, scale)`` computed where ``ids`` are, as ``dtype``.

    Args:
        ids: int64 ids ``[n]`` on any device.
        dim: Row width.
        seed: Seed of the table.
        scale: Half-width of the interval.
        dtype: Float type of the result.
    """
    key, cols = _keys_on(ids.device, dim, seed)
    base = _fmix64(_limbs(ids.to(torch.int64).reshape(-1)) ^ key)
    bits = _fmix64(_add(base[:, None, :], cols[None, :, :]))
    # bits >> 11 is 53 bits: limbs shifted right by 11 and summed exactly in int64.
    top = [(bits[..., k] >> 11) | ((bits[..., k + 1] & 0x7FF) << 5) if k < 3
           else bits[..., k] >> 11 for k in range(4)]
    value = top[0] + (top[1] << 16) + (top[2] << 32) + (top[3] << 48)
    unit = value.to(torch.float64) * (1.0 / (1 << 53))
    return ((2.0 * unit - 1.0) * scale).to(dtype)
