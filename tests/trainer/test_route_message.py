"""Routed samples travel with their header in one all-to-all while global batches are whole."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.launcher import WorkerFailed, launch

pytestmark = pytest.mark.distributed

SHARE = 60


def test_samples_arrive_once_on_either_path(targets) -> None:
    # whole, whole, rank 0 short, whole, rank 1 empty, whole
    sizes = [[SHARE, SHARE], [SHARE, SHARE], [25, SHARE], [SHARE, SHARE], [SHARE, 0],
             [SHARE, SHARE]]
    ranks = launch(targets.route_steps, sizes, LaunchConfig(device="cpu", workers=2, timeout_s=120))
    stream = SyntheticStream(SyntheticConfig(vocab_max=5_000, seed=5))
    # One collective from the step after a whole global batch on; two after a short one.
    assert [step[0] for step in ranks[0]] == [False, True, True, False, True, False]
    assert [step[0] for step in ranks[1]] == [False, True, True, False, True, False]
    start = 5_000
    for t, step in enumerate(sizes):
        sent = np.concatenate([np.array(r[t][1], dtype=np.int64).reshape(-1, 26) for r in ranks])
        expected = stream.feature_ids(start, sum(step))
        order = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731
        assert np.array_equal(order(sent), order(expected)), f"step {t}"
        # With epsilon 0 a whole share splits into two exactly full blocks: the one message
        # carries what header and samples cost apart (3 header ints, 30 samples of 33 ints
        # sent on), and it keeps that size when a share is short or empty (padding).
        assert [r[t][2] for r in ranks] == [(3 + SHARE // 2 * 33) * 8] * 2, f"step {t}"
        start += sum(step)


def test_a_batch_over_the_share_is_refused(targets) -> None:
    with pytest.raises(WorkerFailed, match="more than its share of the global batch"):
        launch(targets.route_steps, [[SHARE, SHARE], [SHARE + 1, SHARE]],
               LaunchConfig(device="cpu", workers=2, timeout_s=120))
