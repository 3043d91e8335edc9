"""The progressive window keeps device scores as tensors and reads them back only when asked."""

from __future__ import annotations

import numpy as np
import torch

from hetgmp.trainer.run.evaluation import Progressive
from hetgmp.trainer.step import SyncCounter


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


def test_ranks_with_unequal_shares_keep_the_steps_one_process_keeps() -> None:
    # Two ranks split each step unequally (graph placement, routing); each keeps its share of
    # the job's last whole steps, so together they hold what one process holds.
    rng = np.random.default_rng(1)
    one, ranks = Progressive(130), [Progressive(130), Progressive(130)]
    for step in range(9):
        n = 40 + 3 * step
        labels, logits = rng.integers(0, 2, n).astype(np.float32), rng.standard_normal(n)
        cut = [5, n - 5][step % 2]  # rank 0 takes 5 samples, then all but 5
        one.add(labels, logits)
        ranks[0].add(labels[:cut], logits[:cut], n)
        ranks[1].add(labels[cut:], logits[cut:], n)
    y, p = one.arrays()
    together = [r.arrays() for r in ranks]
    assert y.size == 64 + 61 + 58  # the fewest whole steps, newest first, holding 130
    assert sorted(p.tolist()) == sorted(np.concatenate([t[1] for t in together]).tolist())
