"""An incremental pass is judged under the routing the trainer trains with (issue 45, item 4).

The passes choose their moves by soft counts with a capacity over the whole window; the trainer
routes each global batch on its own, batch-aware or not. On a user-item stream (no communities,
power-law degrees) passes judged the old way raised the remote rows of batch-aware routing on
the very samples they looked at (20k records, 4 workers, global batch 4096: 11,756 -> 12,069).
"""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.partitioner import (
    FullPartitioner,
    IncrementalPartitioner,
    PartitionConfig,
    Placement,
    WindowGraph,
    remote_rows,
    route,
    route_batch,
    routed_remote_rows,
)
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

_BATCH = 4096


def _trainer_rows(indptr: np.ndarray, values: np.ndarray, placement: Placement,
                  rounds: int) -> int:
    """Remote rows of the records trained in order, each global batch routed on its own."""
    total = 0
    for lo in range(0, indptr.size - 1, _BATCH):
        hi = min(lo + _BATCH, indptr.size - 1)
        batch = (indptr[lo:hi + 1] - indptr[lo], values[indptr[lo]:indptr[hi]])
        workers = route_batch(batch, placement, 0.05, rounds) if rounds else route(batch, placement)
        total += int(remote_rows(batch, workers, placement).sum())
    return total


@pytest.fixture(scope="module")
def user_item() -> tuple[np.ndarray, np.ndarray]:
    stream = SyntheticStream(SyntheticConfig(seed=0, shape="user_item", drift_every=10**9))
    return stream.sample_csr(stream.take(0, 20_000))


def test_routed_remote_rows_is_the_per_batch_sum(user_item: tuple[np.ndarray, np.ndarray]
                                                 ) -> None:
    indptr, values = user_item
    graph = WindowGraph(indptr, values)
    placement = FullPartitioner(PartitionConfig(num_workers=4, global_batch=_BATCH)).partition(
        graph, None)
    for rounds in (0, 2):
        expected = _trainer_rows(indptr, values, placement, rounds)
        assert routed_remote_rows((indptr, values), placement, _BATCH, rounds) == expected
    assert _trainer_rows(indptr, values, placement, 2) < _trainer_rows(indptr, values,
                                                                       placement, 0)


@pytest.mark.parametrize("rounds", [3, pytest.param(0, marks=pytest.mark.slow)])
def test_a_pass_never_raises_remote_rows_under_the_trainers_routing(
        user_item: tuple[np.ndarray, np.ndarray], rounds: int) -> None:
    indptr, values = user_item
    graph = WindowGraph(indptr, values)
    config = PartitionConfig(num_workers=4, global_batch=_BATCH, min_count=1,
                             replica_basis="touched", route_rounds=rounds)
    # Under route, passes after a full partition of these very records no longer help since
    # route weighs rows by what holding them saves (the guard refuses them); from hash they do.
    placement = FullPartitioner(config).partition(graph, None) if rounds else Placement.hash(4)
    refiner = IncrementalPartitioner(config, recent_fraction=1.0, recent_cap=None)
    moved = 0
    for _ in range(2):
        before = _trainer_rows(indptr, values, placement, rounds)
        repaired = refiner.partition(graph, placement)
        assert refiner.last_pass is not None
        assert _trainer_rows(indptr, values, repaired, rounds) <= before
        moved += refiner.last_pass.moved
        placement = repaired
    if rounds == 0:  # passes that help are let through: the guard judges, it does not veto
        assert moved > 0


def test_the_guard_judges_whole_batches_spread_over_the_pass() -> None:
    # Issue 55, item 4: it judged the newest 65,536 samples of a pass over 500k, and refused
    # passes that helped the rest. Now: whole global batches spread over all of them.
    from hetgmp.partitioner.incremental import _GUARD_SAMPLES
    from hetgmp.partitioner.measures import judged_batches

    lengths = np.random.default_rng(0).integers(1, 5, 300_000)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    window = WindowGraph(indptr, np.arange(indptr[-1]))  # entry k holds id k
    judged = judged_batches(window.tail(200_000), _BATCH, _GUARD_SAMPLES)
    assert judged.num_samples == _GUARD_SAMPLES
    # Each judged sample is a whole sample of the window, newest last; its batches reach
    # back to the first of the pass's 200,000 samples.
    first_id = judged.indices[judged.indptr[:-1]]
    sample_of = np.searchsorted(indptr, first_id, side="right") - 1
    assert np.array_equal(np.diff(judged.indptr), lengths[sample_of])
    assert sample_of[-1] == 299_999 and sample_of[0] < 100_000 + _BATCH
    runs = np.split(sample_of, np.flatnonzero(np.diff(sample_of) != 1) + 1)
    assert all(r.size % _BATCH == 0 for r in runs)  # whole global batches
    # A pass over fewer samples is judged on all of them, as before.
    assert judged_batches(window.tail(50_000), _BATCH, _GUARD_SAMPLES).num_samples == 50_000
