"""initial_rows_on against initial_rows: the same bits for any id, seed and width."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetgmp.trainer.embedding.device_init import initial_rows_on
from hetgmp.trainer.embedding.optimizer import initial_rows


@pytest.mark.parametrize("seed", [0, 3, -7, 2**62])
def test_rows_are_initial_rows_bit_for_bit(seed: int, device: str) -> None:
    rng = np.random.default_rng(abs(seed) % 1000)
    ids = np.concatenate([
        rng.integers(-2**63, 2**63 - 1, size=500, dtype=np.int64),  # any two's-complement bits
        np.array([0, 1, -1, 2**63 - 1, -2**63, 65535, 65536, 2**32 - 1, 2**32], dtype=np.int64),
    ])
    for dim in (1, 9, 65):
        want = initial_rows(ids, dim, seed, 0.05)
        got = initial_rows_on(torch.from_numpy(ids).to(device), dim, seed, 0.05, torch.float64)
        assert got.device.type == device
        np.testing.assert_array_equal(got.cpu().numpy(), want)


def test_float32_rows_are_the_rounded_float64_ones() -> None:
    ids = np.arange(-50, 50, dtype=np.int64)
    got = initial_rows_on(torch.from_numpy(ids), 8, 1, 0.5, torch.float32)
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), initial_rows(ids, 8, 1, 0.5).astype(np.float32))
