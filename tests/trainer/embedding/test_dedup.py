"""unique_padded answers torch.unique's distinct ids and inverse, with no wait for the device."""

from __future__ import annotations

import pytest
import torch

from hetgmp.trainer.embedding.dedup import unique_padded
from hetgmp.trainer.step import SyncCounter


@pytest.mark.parametrize("case", ["random", "empty", "one", "all_equal", "extremes"])
def test_matches_torch_unique(case: str) -> None:
    g = torch.Generator().manual_seed(3)
    flat = {
        "random": torch.randint(0, 500, (4_000,), generator=g),
        "empty": torch.zeros(0, dtype=torch.int64),
        "one": torch.tensor([42]),
        "all_equal": torch.full((97,), 7),
        "extremes": torch.tensor([2**63 - 1, 0, 2**63 - 1, 5, 0]),
    }[case]
    u = unique_padded(flat)
    want, inverse = torch.unique(flat, sorted=True, return_inverse=True)
    n = int(u.n)
    assert n == want.numel()
    assert torch.equal(u.ids[:n], want)
    assert torch.equal(u.inverse, inverse)
    assert u.ids.shape == flat.shape


def test_queues_everything() -> None:
    flat = torch.randint(0, 100, (1_000,), generator=torch.Generator().manual_seed(0))
    with SyncCounter("cpu") as s:
        unique_padded(flat)
    assert s.count == 0, dict(s.seen)


def test_refuses_a_batch_that_is_not_flat() -> None:
    with pytest.raises(ValueError, match="1-d"):
        unique_padded(torch.zeros((2, 3), dtype=torch.int64))
