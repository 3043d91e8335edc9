"""The placements a migration steps through route as freshly built ones would."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.partitioner import FullPartitioner, PartitionConfig, Placement, WindowGraph
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.embedding import Migration


@pytest.mark.parametrize("workers", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_each_step_of_a_migration_routes_like_a_placement_built_from_scratch(workers) -> None:
    stream = SyntheticStream(SyntheticConfig(seed=5))
    ids = stream.feature_ids(0, 12_000)
    config = PartitionConfig(num_workers=workers, global_batch=1024, replica_fraction=0.05)
    old = FullPartitioner(config).partition(WindowGraph.from_dense(ids[:6_000]), None)
    new = FullPartitioner(PartitionConfig(num_workers=workers, global_batch=1024,
                                          replica_fraction=0.05, seed=9)).partition(
        WindowGraph.from_dense(ids[6_000:]), None).with_version(old.version + 1)
    probe = np.concatenate([ids.ravel(), np.arange(1, 500, dtype=np.int64)])
    m = Migration(old, new, row_size=100, chunk_bytes=100 * 400)
    assert m.chunks >= 4
    in_force = m.current()
    in_force.holders(probe[:10])  # built, as a step's routing would
    inherited = 0
    while not m.finished:
        m.next_chunk()
        in_force = m.advance()
        inherited += "_holder_table" in in_force.__dict__
        fresh = Placement(in_force.version, workers, in_force.ids, in_force.owners,
                          in_force.replicas)
        assert np.array_equal(in_force.holders(probe), fresh.holders(probe))
    assert inherited == m.chunks - 1  # all but the last step, which is the new placement
    assert in_force is new


def test_an_index_copy_is_independent_and_assign_needs_present_ids() -> None:
    from hetgmp.partitioner.idindex import IdIndex

    index = IdIndex(64)
    index.insert(np.array([3, 7, 11]), np.array([30, 70, 110]))
    other = index.copy()
    other.assign(np.array([7]), np.array([-1]))
    assert index.lookup(np.array([7]))[0].tolist() == [70]
    assert other.lookup(np.array([3, 7, 11]))[0].tolist() == [30, -1, 110]
    with pytest.raises(KeyError, match="not in the index"):
        other.assign(np.array([5]), np.array([1]))
