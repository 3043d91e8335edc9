"""Incremental repartition: moves nothing without news, follows drift, respects its cap."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hetgmp.partitioner import (
    FullPartitioner,
    IncrementalPartitioner,
    PartitionConfig,
    Partitioner,
    Placement,
    WindowGraph,
    plan_diff,
    remote_rows_per_sample,
    route,
)
from hetgmp.partitioner.graph import compact


def _rate(ids: np.ndarray, placement: Placement, batch: int = 64) -> float:
    """Remote rows per sample over steps of ``batch`` samples (the config's global batch)."""
    steps = [ids[lo:lo + batch] for lo in range(0, ids.shape[0], batch)]
    total = sum(remote_rows_per_sample(s, route(s, placement), placement) * len(s) for s in steps)
    return total / ids.shape[0]


def test_both_partitioners_satisfy_the_protocol(config: Callable[..., PartitionConfig]) -> None:
    assert isinstance(FullPartitioner(config(2)), Partitioner)
    assert isinstance(IncrementalPartitioner(config(2)), Partitioner)


def test_an_unchanged_window_moves_nothing(make_stream: Callable[..., np.ndarray],
                                           config: Callable[..., PartitionConfig]) -> None:
    window = WindowGraph.from_dense(make_stream(3000, seed=4), start=0)
    partitioner = IncrementalPartitioner(config(4))
    first = partitioner.partition(window, None)
    assert partitioner.last_pass is None  # a full partition, not a pass
    second = partitioner.partition(window, first)
    plan = plan_diff(first, second, row_bytes=8)
    assert second.version == first.version + 1
    assert plan.rows_moved == 0 and plan.replica_rows_added == 0
    assert partitioner.last_pass is None  # nothing new: no pass ran


def test_incremental_follows_drift_better_than_a_static_placement(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(9000, seed=5, drift_at=4000)
    cfg = config(4)
    before = WindowGraph.from_dense(ids[:4000], start=0)
    static = FullPartitioner(cfg).partition(before, None)
    partitioner = IncrementalPartitioner(cfg)
    partitioner.partition(before, None)
    after = WindowGraph.from_dense(ids[2000:6000], start=2000)
    updated = partitioner.partition(after, static)
    future = ids[6000:9000]
    assert _rate(future, updated) < 0.7 * _rate(future, static)


def test_rows_outside_the_new_samples_never_move(make_stream: Callable[..., np.ndarray],
                                                  config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(6000, seed=6, drift_at=3000)
    partitioner = IncrementalPartitioner(config(4), recent_fraction=0.25)
    first = partitioner.partition(WindowGraph.from_dense(ids[:4000], start=0), None)
    second = partitioner.partition(WindowGraph.from_dense(ids[1000:5000], start=1000), first)
    new_ids = np.unique(ids[4000:5000])
    plan = plan_diff(first, second, row_bytes=8)
    assert plan.rows_moved > 0
    assert np.all(np.isin(plan.moved_ids, new_ids))


def test_the_move_cap_is_respected(make_stream: Callable[..., np.ndarray],
                                   config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(8000, seed=7, drift_at=4000)
    static = FullPartitioner(config(4)).partition(WindowGraph.from_dense(ids[:4000]), None)
    window = WindowGraph.from_dense(ids[2000:6000], start=2000)
    # The cap bounds the moves that improve the placement; balance moves what it must on top.
    # Rows here are balanced already, so every move counts against the cap.
    rows = np.bincount(static.owner_of(np.unique(ids[2000:6000])), minlength=4)
    assert rows.max() <= 1.05 * rows.mean()
    for fraction in (0.0, 0.02):
        partitioner = IncrementalPartitioner(config(4, max_move_fraction=fraction))
        partitioner._last_end = 4000  # as if it had produced `static` from records 0..3999
        updated = partitioner.partition(window, static)
        distinct_new = np.unique(ids[4000:6000]).size
        moved = plan_diff(static, updated, row_bytes=8).rows_moved
        assert moved <= int(fraction * distinct_new)


def _all_on_worker_zero(make_stream: Callable[..., np.ndarray]
                        ) -> tuple[WindowGraph, np.ndarray, Placement]:
    """A 4000-sample window, its ids, and a 4-worker placement giving worker 0 all of them."""
    ids = make_stream(4000, seed=9)
    placed = np.unique(ids)
    return (WindowGraph.from_dense(ids, start=0), placed,
            Placement(1, 4, placed, np.zeros(placed.size, np.int32)))


def test_row_balance_is_restored_whatever_the_move_cap(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig]) -> None:
    # Worker 0 owns every row: the cap on improving moves (here none at all) does not hold
    # back the moves balance requires.
    window, _, skewed = _all_on_worker_zero(make_stream)
    cfg = config(4, max_move_fraction=0.0, min_count=1)
    partitioner = IncrementalPartitioner(cfg, recent_fraction=1.0)
    updated = partitioner.partition(window, skewed)
    uniq, degree = np.unique(window.indices, return_counts=True)
    eligible = uniq[degree >= cfg.min_count]
    owned = np.bincount(updated.owner_of(eligible), minlength=4)
    assert owned.max() <= max(np.ceil(eligible.size / 4), (1 + cfg.epsilon) * eligible.size / 4)
    # The pass says so: every move was balance's, none was the improving steps'.
    report = partitioner.last_pass
    assert report is not None
    assert (report.budget, report.regroup, report.group_balance, report.refine) == (0, 0, 0, 0)
    assert report.ids == uniq.size and report.new_samples == window.num_samples
    changed = int(np.count_nonzero(updated.owner_of(uniq) != skewed.owner_of(uniq)))
    assert report.row_balance == report.moved == changed > 0
    assert f"row balance {changed} (outside the budget)" in report.describe()


def test_rows_outside_the_new_samples_weigh_in_the_balance(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig]) -> None:
    # Every row of the window sits on worker 0 and the pass looks at the last quarter only:
    # worker 0 keeps the older rows, which alone pass its share, so the new samples' rows all
    # go to the others, evenly enough.
    window, placed, skewed = _all_on_worker_zero(make_stream)
    cfg = config(4, max_move_fraction=0.0)
    updated = IncrementalPartitioner(cfg).partition(window, skewed)  # recent: 25%
    cw = compact(window.tail(1000))
    movable = cw.ids[cw.degree >= cfg.min_count]
    fixed = placed.size - movable.size
    cap = max(np.ceil(placed.size / 4), (1 + cfg.epsilon) * placed.size / 4)
    assert fixed > cap and movable.size > 0
    owned = np.bincount(updated.owner_of(movable), minlength=4)
    assert owned[0] == 0 and owned[1:].max() <= cap
    assert (updated.owner_of(np.setdiff1d(placed, movable)) == 0).all()


def test_same_seed_same_incremental_placement(make_stream: Callable[..., np.ndarray],
                                              config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(7000, seed=8, drift_at=3500)
    results = []
    for _ in range(2):
        partitioner = IncrementalPartitioner(config(3, seed=11))
        placement = partitioner.partition(WindowGraph.from_dense(ids[:4000], start=0), None)
        placement = partitioner.partition(WindowGraph.from_dense(ids[2000:6000], start=2000),
                                          placement)
        results.append(placement)
    assert results[0] == results[1] and results[0].version == 2


def test_window_basis_budget_counts_the_whole_window_not_the_new_samples(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(6000, seed=9, drift_at=3000)
    partitioner = IncrementalPartitioner(config(2, replica_fraction=0.05, replica_basis="window"))
    first = partitioner.partition(WindowGraph.from_dense(ids[:4000], start=0), None)
    # The second call looks only at the 2000 new samples, yet the budget is the whole window's.
    window = WindowGraph.from_dense(ids[2000:], start=2000)
    second = partitioner.partition(window, first)
    budget = int(0.05 * np.unique(window.indices).size)
    assert second.replica_counts().tolist() == [budget, budget]
    assert first.replica_counts().tolist() == [int(0.05 * np.unique(ids[:4000]).size)] * 2


def test_counts_kept_across_balance_rounds_equal_a_recount() -> None:
    # _balance_groups counts each sample's local ids once and updates the counts after each
    # round's moves (_recount_moved): they must equal counting again from scratch.
    from hetgmp.partitioner.graph import local_counts_compact
    from hetgmp.partitioner.incremental import _recount_moved
    from hetgmp.partitioner.types import WindowGraph

    rng = np.random.default_rng(4)
    n, samples = 6, 3_000
    lengths = rng.integers(1, 12, samples)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    window = WindowGraph(indptr, rng.zipf(1.3, int(indptr[-1])).astype(np.int64) % 5_000)
    cw = compact(window)
    owner = rng.integers(0, n, cw.num_ids)
    replicas = rng.random((cw.num_ids, n)) < 0.15
    replicas[np.arange(cw.num_ids), owner] = False  # an owner holds no replica of its row
    scores = local_counts_compact(cw, owner, replicas, n)
    for _ in range(5):
        was_owner, was_copied = owner.copy(), replicas.copy()
        rows = rng.choice(cw.num_ids, 300, replace=False)
        owner[rows] = (owner[rows] + rng.integers(1, n, rows.size)) % n
        replicas[rows, owner[rows]] = False
        _recount_moved(cw, scores, was_owner, was_copied, owner)
        assert np.array_equal(scores, local_counts_compact(cw, owner, replicas, n))
