"""Measures with hand-computed answers."""

from __future__ import annotations

import numpy as np

from hetgmp.partitioner import (
    Placement,
    imbalance,
    remote_ids,
    remote_rows,
    remote_rows_per_sample,
    row_imbalance,
    sample_imbalance,
)


def test_remote_rows_counts_distinct_unheld_ids_per_worker() -> None:
    placement = Placement(0, 2, np.array([1, 2, 3, 4]), np.array([0, 0, 1, 1]),
                          (np.array([3], dtype=np.int64), np.array([], dtype=np.int64)))
    batch = np.array([[1, 3], [1, 4], [2, 4], [3, 1]])
    workers = np.array([0, 0, 1, 1])
    # Worker 0 uses {1, 3, 4}: owns 1, replicates 3 -> remote {4}.
    # Worker 1 uses {2, 4, 3, 1}: owns 3, 4 -> remote {1, 2}.
    assert remote_rows(batch, workers, placement).tolist() == [1, 2]
    assert [ids.tolist() for ids in remote_ids(batch, workers, placement)] == [[4], [1, 2]]
    assert remote_rows_per_sample(batch, workers, placement) == 3 / 4


def test_two_disjoint_communities_placed_apart_have_no_remote_rows() -> None:
    placement = Placement(0, 2, np.array([1, 2, 11, 12]), np.array([0, 0, 1, 1]))
    batch = np.array([[1, 2], [11, 12], [2, 1]])
    assert remote_rows_per_sample(batch, np.array([0, 1, 0]), placement) == 0.0


def test_imbalance_values() -> None:
    assert imbalance(np.array([2, 2, 2, 2])) == 1.0
    assert imbalance(np.array([4, 2, 1, 1])) == 2.0
    assert imbalance(np.zeros(3)) == 1.0
    assert sample_imbalance(np.array([0, 0, 0, 1]), 2) == 1.5
    placement = Placement(0, 2, np.array([1, 2, 3]), np.array([0, 0, 1]))
    assert row_imbalance(placement) == 2 / 1.5
