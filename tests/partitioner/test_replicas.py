"""Replica selection: budget, ranking, never the owner's own rows."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.partitioner import PartitionConfig, WindowGraph
from hetgmp.partitioner.graph import compact
from hetgmp.partitioner.replicas import choose_replicas


def test_hottest_foreign_rows_are_replicated_within_the_budget() -> None:
    # Worker 1's 40 samples all use id 7 (owned by 0) and, in 5 of them, id 8 (owned by 0);
    # each sample also has a private id. Worker 1 touches 42 distinct rows: a 3% budget is 1.
    rows = [[7, 100 + i] + ([8] if i < 5 else [9]) for i in range(40)]
    window = WindowGraph.from_dense(np.array(rows))
    cw = compact(window)
    owner = np.where(np.isin(cw.ids, [7, 8]), 0, 1).astype(np.int32)
    workers = np.ones(40, dtype=np.int32)
    replicas = choose_replicas(cw, owner, workers, 2, fraction=0.03, batch_per_worker=8)
    assert replicas[1].tolist() == [7]
    assert replicas[0].size == 0  # worker 0 runs no sample: it touches nothing
    wider = choose_replicas(cw, owner, workers, 2, fraction=0.05, batch_per_worker=8)
    assert wider[1].tolist() == [7, 8]


def test_budget_is_a_fraction_of_the_rows_each_worker_touches() -> None:
    rng = np.random.default_rng(3)
    window = WindowGraph.from_dense(rng.integers(0, 3000, size=(2000, 8)))
    cw = compact(window)
    owner = (cw.ids % 4).astype(np.int32)
    workers = rng.integers(0, 4, size=2000).astype(np.int32)
    replicas = choose_replicas(cw, owner, workers, 4, fraction=0.01, batch_per_worker=128)
    for worker in range(4):
        touched = np.unique(window.indices.reshape(2000, 8)[workers == worker]).size
        assert 0 < replicas[worker].size <= int(0.01 * touched)
        assert not np.any(replicas[worker] % 4 == worker)  # never its own rows


def test_window_basis_gives_every_worker_a_fraction_of_the_whole_window() -> None:
    rng = np.random.default_rng(5)
    window = WindowGraph.from_dense(rng.integers(0, 3000, size=(2000, 8)))
    cw = compact(window)
    owner = (cw.ids % 4).astype(np.int32)
    # Worker 3 runs few samples: it touches far fewer rows than the window holds.
    workers = np.where(rng.random(2000) < 0.05, 3, rng.integers(0, 3, size=2000)).astype(np.int32)
    touched = choose_replicas(cw, owner, workers, 4, fraction=0.02, batch_per_worker=128)
    table = choose_replicas(cw, owner, workers, 4, fraction=0.02, batch_per_worker=128,
                            budget_rows=cw.num_ids)
    budget = int(0.02 * cw.num_ids)
    for worker in range(4):
        mine = np.unique(window.indices.reshape(2000, 8)[workers == worker])
        foreign = np.count_nonzero(mine % 4 != worker)
        assert table[worker].size == min(budget, foreign)
        assert touched[worker].size == int(0.02 * mine.size)
        # The wider budget keeps the touched basis's choice and adds to it.
        assert np.isin(touched[worker], table[worker]).all()
    assert table[3].size > 2 * touched[3].size


def test_an_unknown_budget_basis_is_refused() -> None:
    with pytest.raises(ValueError, match="'touched' or 'window'"):
        PartitionConfig(num_workers=2, replica_basis="rows")
