"""The progressive window keeps device scores as tensors and reads them back only when asked."""

from __future__ import annotations

import numpy as np
import torch

from trainer.run.evaluation import Progressive
from trainer.step import SyncCounter


def test_tensor_scores_match_numpy_ones_and_wait_only_when_read() -> None:
    rng = np.random.default_rng(0)
    steps = [(rng.integers(0, 2, 50).astype(np.float32), rng.standard_normal(50))
             for _ in range(7)]
    host, device = Progressive(120), Progressive(120)
    with SyncCounter("cpu") as waits:
        for labels, logits in steps:
            host.add(labels, logits)
            device.add(labels, torch.from_numpy(logits))
    assert waits.count == 0
    with SyncCounter("cpu") as waits:
        y, p = device.arrays()
    assert waits.count == 1  # one copy for the whole window
    want_y, want_p = host.arrays()
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(p, want_p)
    assert y.size == 150  # the window: the fewest whole steps holding 120 samples
    assert device.local_auc() == host.local_auc()
