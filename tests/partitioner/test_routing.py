"""Routing: locality first, capacity always."""

from __future__ import annotations

import numpy as np

from hetgmp.partitioner import Placement, route
from hetgmp.partitioner.routing import _assign_rounds, assign_with_capacity, capacity


def test_sample_goes_where_most_of_its_rows_are() -> None:
    placement = Placement(0, 3, np.arange(1, 10), np.array([0, 0, 0, 1, 1, 1, 2, 2, 2]))
    batch = np.array([[1, 2, 4], [4, 5, 7], [7, 8, 1]])
    assert route(batch, placement, capacity_epsilon=1.0).tolist() == [0, 1, 2]


def test_replicas_count_as_local() -> None:
    placement = Placement(0, 2, np.arange(1, 5), np.array([0, 0, 1, 1]),
                          (np.array([], dtype=np.int64), np.array([1, 2])))
    # Ids 1, 2 owned by 0 but replicated on 1, id 3 owned by 1: worker 1 holds all three.
    assert route(np.array([[1, 2, 3]]), placement, capacity_epsilon=1.0).tolist() == [1]


def test_capacity_is_respected_when_every_sample_prefers_one_worker() -> None:
    placement = Placement(0, 4, np.arange(100), np.zeros(100, dtype=np.int32))
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 100, size=(1000, 5))
    workers = route(batch, placement, capacity_epsilon=0.05)
    counts = np.bincount(workers, minlength=4)
    assert workers.dtype == np.int32 and workers.shape == (1000,)
    assert counts.max() <= capacity(1000, 4, 0.05) == 262
    assert counts.sum() == 1000


def test_overflow_sends_away_the_samples_that_lose_least() -> None:
    # Worker 0 holds everything of sample 0 and half of sample 1; capacity 1 each.
    placement = Placement(0, 2, np.array([1, 2, 3, 4]), np.array([0, 0, 0, 1]))
    workers = route(np.array([[1, 2], [3, 4]]), placement, capacity_epsilon=0.0)
    assert workers.tolist() == [0, 1]


def test_routing_is_deterministic_and_spreads_ties() -> None:
    placement = Placement.hash(4)
    batch = np.arange(4000, dtype=np.int64).reshape(1000, 4)
    a, b = route(batch, placement), route(batch, placement)
    assert np.array_equal(a, b)
    assert np.bincount(a, minlength=4).max() <= capacity(1000, 4, 0.05)


def test_two_workers_closed_form_matches_the_general_rounds() -> None:
    rng = np.random.default_rng(11)
    for trial in range(300):
        rows = int(rng.integers(1, 60))
        # Small score ranges make ties (equal scores, equal gaps) common.
        scores = rng.integers(0, int(rng.integers(1, 5)), size=(rows, 2))
        if trial % 3 == 0:
            scores[:, 0] += 2  # most samples prefer worker 0: it overflows
        cap = int(rng.integers(-(-rows // 2), rows + 1))
        fast = assign_with_capacity(scores, cap)
        assert fast.tolist() == _assign_rounds(scores, cap).tolist()
        assert np.bincount(fast, minlength=2).max() <= cap
        # Weighted scores (floats) take the closed form too, ties and all.
        weighted = scores * rng.choice([0.25, 0.5, 1.0], size=scores.shape)
        assert assign_with_capacity(weighted, cap).tolist() == \
            _assign_rounds(weighted, cap).tolist()


def test_the_rows_a_sample_alone_reads_outweigh_the_rows_every_sample_reads() -> None:
    # Each sample reads a row of its own (worker 1's) and two rows every sample of the batch
    # reads (worker 0's). Counted 1 each, worker 0 held more of every sample: all went there
    # and worker 0 fetched 40 rows for them. Weighed by what holding them saves (the popular
    # ones are fetched once wherever the samples go), all go to worker 1, which fetches 2.
    own = np.arange(100, 140)
    placement = Placement(1, 2, np.concatenate([[1, 2], own]), np.r_[0, 0, np.ones(40, int)])
    batch = np.column_stack([own, np.ones(40, int), np.full(40, 2)])
    workers = route(batch, placement, capacity_epsilon=1.0)
    assert workers.tolist() == [1] * 40
    from hetgmp.partitioner import fetched_rows
    assert fetched_rows(batch, workers, placement) == 2


def test_float_scores_are_not_outvoted_by_the_tie_break() -> None:
    # The rounds rotate ties over workers with a small offset; it once was 1/(N + 1), which
    # decided between scores closer than that (weighted scores, the greedy pass's costs).
    scores = np.array([[1.1, 1.0, 0.0], [0.0, 1.0, 0.9], [0.9, 0.0, 1.0]])
    assert _assign_rounds(scores, 3).tolist() == [0, 1, 2]  # it was [1, 2, 0]
