"""Full (METIS) partition: known answers, balance, determinism, default owners."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from hetgmp.partitioner import (
    FullPartitioner,
    PartitionConfig,
    WindowGraph,
    default_owner,
    plan_diff,
    remote_rows_per_sample,
    route,
)
from hetgmp.partitioner.assemble import balance_rows, match_labels
from hetgmp.partitioner.full import metis_owners
from hetgmp.partitioner.graph import compact


def test_two_disjoint_communities_on_two_workers_have_no_remote_rows(
        two_communities: WindowGraph, config: Callable[..., PartitionConfig]) -> None:
    placement = FullPartitioner(config(2)).partition(two_communities, None)
    batch = two_communities.indices.reshape(200, 4)
    workers = route(batch, placement)
    assert remote_rows_per_sample(batch, workers, placement) == 0.0
    # Each community's rows sit together, on different workers.
    assert len(set(placement.owner_of(np.arange(1, 13)).tolist())) == 1
    assert len(set(placement.owner_of(np.arange(101, 113)).tolist())) == 1
    assert placement.owner_of(np.array([1]))[0] != placement.owner_of(np.array([101]))[0]


def test_balance_holds_on_skewed_input(make_stream: Callable[..., np.ndarray],
                                       config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(4000, seed=1)
    window = WindowGraph.from_dense(ids)
    cfg = config(4, epsilon=0.05)
    cw, sample_part, _, _ = metis_owners(window, cfg)
    samples = np.bincount(sample_part, minlength=4)
    # METIS keeps samples within (1 + eps) of the mean, up to a vertex of slack.
    assert samples.max() <= 1.05 * samples.mean() + 1
    placement = FullPartitioner(cfg).partition(window, None)
    eligible = cw.ids[cw.degree >= cfg.min_count]
    rows = np.bincount(placement.owner_of(eligible), minlength=4)
    assert rows.max() <= max(np.ceil(rows.mean()), np.floor(1.05 * rows.mean()))
    workers = route(ids, placement)
    assert np.bincount(workers, minlength=4).max() <= np.floor(1.05 * 1000)


def test_same_seed_same_placement(make_stream: Callable[..., np.ndarray],
                                  config: Callable[..., PartitionConfig]) -> None:
    window = WindowGraph.from_dense(make_stream(2000, seed=2))
    a = FullPartitioner(config(3, seed=5)).partition(window, None)
    b = FullPartitioner(config(3, seed=5)).partition(window, None)
    assert a == b


def test_ids_never_seen_keep_their_default_owner(
        two_communities: WindowGraph, config: Callable[..., PartitionConfig]) -> None:
    placement = FullPartitioner(config(2)).partition(two_communities, None)
    unseen = np.arange(10_000, 10_100, dtype=np.int64)
    assert np.array_equal(placement.owner_of(unseen), default_owner(unseen, 2))
    assert placement.version == 1


def test_labels_are_matched_to_the_current_owners(
        two_communities: WindowGraph, config: Callable[..., PartitionConfig]) -> None:
    assert match_labels(np.array([0, 0, 1, 1, 2]), np.array([2, 2, 0, 0, 1]), 3).tolist() == [
        2, 0, 1]
    partitioner = FullPartitioner(config(2))
    first = partitioner.partition(two_communities, None)
    second = partitioner.partition(two_communities, first)
    assert second.version == 2
    assert plan_diff(first, second, row_bytes=4).rows_moved == 0


def test_degenerate_windows_give_valid_placements(
        config: Callable[..., PartitionConfig]) -> None:
    empty = WindowGraph(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert FullPartitioner(config(3)).partition(empty, None).ids.size == 0
    unique = WindowGraph.from_dense(np.arange(600).reshape(100, 6))  # every id seen once
    placement = FullPartitioner(config(3)).partition(unique, None)
    assert placement.ids.size == 0  # nothing worth placing: all keep their default owner
    single = FullPartitioner(config(1)).partition(unique, None)
    assert np.all(single.owner_of(np.arange(600)) == 0)


def test_balance_counts_fixed_rows_and_moves_only_movable_ones() -> None:
    flat = np.zeros((16, 3))  # no affinity: any row may go
    # Worker 0's 12 fixed rows alone pass the cap (22 rows: 8 a worker), so its 10 movable
    # rows go to the others, none of them over the cap; rows not movable stay.
    owner = balance_rows(np.zeros(16, np.int32), flat, np.arange(16) < 10, 3, 0.0,
                         fixed=np.array([12, 0, 0]))
    moved = np.bincount(owner[:10], minlength=3)
    assert moved[0] == 0 and moved.max() <= 8 and (owner[10:] == 0).all()
    # Worker 0 is over the cap with nothing movable: worker 1 still sheds its excess.
    owner = balance_rows(np.ones(16, np.int32), flat, np.ones(16, bool), 3, 0.0,
                         fixed=np.array([20, 0, 0]))
    assert list(np.bincount(owner, minlength=3)) == [0, 12, 4]


def test_without_pymetis_placements_work_and_a_partition_says_what_is_missing() -> None:
    # A GPU box or a serving host may lack the pymetis wheel: the trainer and hash placements
    # import and run; partitioning a graph says what to install.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pymetis'] = None\n"
        "import numpy as np\n"
        "import hetgmp.trainer.step\n"
        "from hetgmp.partitioner import FullPartitioner, PartitionConfig, Placement, WindowGraph\n"
        "assert Placement.hash(2).owner_of(np.arange(4)).size == 4\n"
        "w = WindowGraph.from_dense(np.arange(400).reshape(100, 4) % 37)\n"
        "try:\n"
        "    FullPartitioner(PartitionConfig(num_workers=2, global_batch=10)).partition(w, None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "install pymetis" in out.stdout


def test_metis_with_no_sample_in_the_mask_leaves_everything_out() -> None:
    from hetgmp.partitioner.metis import bipartite_parts

    cw = compact(WindowGraph.from_dense(np.arange(40).reshape(10, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples, ids = bipartite_parts(cw, np.ones(cw.num_ids, bool), 2,
                                       id_edge_weight=np.ones(cw.num_ids, np.int64), ufactor=50,
                                       seed=0, sample_mask=np.zeros(10, bool))
    assert (samples == -1).all() and samples.size == 10
    assert (ids == -1).all() and ids.size == cw.num_ids
