"""Placement and WindowGraph values: default owners, lookups, validation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hetgmp.partitioner import Placement, WindowGraph, default_owner
from hetgmp.runtime import fmix64

_M64 = (1 << 64) - 1


def _fmix64_reference(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M64
    return h ^ (h >> 33)


def test_fmix64_matches_scalar_reference() -> None:
    ids = np.array([0, 1, 42, 2**40 + 7, 2**63 - 1], dtype=np.int64)
    expected = [_fmix64_reference(int(i)) for i in ids]
    assert [int(x) for x in fmix64(ids)] == expected


def test_ids_never_seen_get_their_default_owner() -> None:
    placement = Placement(3, 4, np.array([10, 20], dtype=np.int64),
                          np.array([3, 3], dtype=np.int32))
    unseen = np.array([11, 12, 2**50, 7], dtype=np.int64)
    expected = np.array([_fmix64_reference(int(i)) % 4 for i in unseen])
    assert np.array_equal(placement.owner_of(unseen), expected)
    assert np.array_equal(default_owner(unseen, 4), expected)
    assert np.array_equal(placement.owner_of(np.array([20, 10])), [3, 3])


def test_owner_of_keeps_shape_and_spreads_the_hash_placement() -> None:
    placement = Placement.hash(8)
    ids = np.arange(80_000, dtype=np.int64).reshape(400, 200)
    owners = placement.owner_of(ids)
    assert owners.shape == ids.shape and owners.dtype == np.int32
    counts = np.bincount(owners.ravel(), minlength=8)
    assert counts.max() / counts.mean() < 1.03


def test_holds_means_owned_or_replicated() -> None:
    placement = Placement(0, 2, np.array([1, 2], dtype=np.int64),
                          np.array([0, 1], dtype=np.int32),
                          (np.array([2], dtype=np.int64), np.array([1], dtype=np.int64)))
    assert placement.holds(0, np.array([1, 2])).tolist() == [True, True]
    assert placement.holds(1, np.array([1, 2])).tolist() == [True, True]
    unseen = np.array([5])
    owner = int(default_owner(unseen, 2)[0])
    assert placement.holds(owner, unseen).tolist() == [True]
    assert placement.holds(1 - owner, unseen).tolist() == [False]


def test_holders_agree_with_owner_of_and_the_replica_sets() -> None:
    rng = np.random.default_rng(3)
    ids = np.unique(rng.integers(0, 2**62, size=3000))
    owners = rng.integers(0, 5, size=ids.size).astype(np.int32)
    replicas = tuple(np.sort(rng.choice(ids[owners != w], size=200, replace=False))
                     for w in range(5))
    placed = Placement(1, 5, ids, owners, replicas)
    # Placed, replicated and never-seen ids, repeated, in no order: as a batch has them.
    query = rng.permutation(np.concatenate([ids, ids[:500], rng.integers(0, 2**62, size=2000)]))[:5495]
    for placement in (placed, Placement.hash(5)):
        masks = placement.holders(query.reshape(-1, 5))
        owner = placement.owner_of(query)
        for worker in range(5):
            held = (owner == worker) | placement.is_replicated(worker, query)
            assert np.array_equal(placement.held_by(worker, masks), held)
    assert (np.bitwise_count(placed.holders(query)) > 1).any()  # replicas among them
    # The cached index stays behind when a placement is pickled (to a process or a rank).
    shipped = pickle.loads(pickle.dumps(placed))
    assert "_holder_table" in placed.__dict__ and "_holder_table" not in shipped.__dict__
    assert shipped == placed
    assert np.array_equal(shipped.holders(query), placed.holders(query))


@pytest.mark.parametrize("kwargs, message", [
    ({"ids": np.array([2, 1]), "owners": np.array([0, 0])}, "sorted"),
    ({"ids": np.array([1, 2]), "owners": np.array([0, 5])}, "range"),
    ({"ids": np.array([1]), "owners": np.array([0]),
      "replicas": (np.array([1]), np.array([], dtype=np.int64))}, "replicates"),
])
def test_placement_rejects_inconsistent_tables(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Placement(version=0, num_workers=2, **kwargs)


@pytest.mark.parametrize("workers", [0, 65])
def test_placement_needs_one_to_64_workers(workers: int) -> None:
    # Holder masks give each worker a bit of a uint64: a 65th would wrap onto worker 0.
    with pytest.raises(ValueError, match="1..64"):
        Placement.hash(workers)
    assert Placement.hash(64).holders(np.arange(1000)).astype(bool).all()


def test_placement_arrays_are_read_only_and_equality_is_by_value() -> None:
    a = Placement(1, 2, np.array([1, 5]), np.array([1, 0]))
    b = Placement(1, 2, np.array([1, 5]), np.array([1, 0]))
    assert a == b and a != a.with_version(2)
    with pytest.raises(ValueError):
        a.owners[0] = 0


def test_window_graph_from_dense_and_tail() -> None:
    window = WindowGraph.from_dense(np.arange(12).reshape(4, 3), start=100)
    assert window.num_samples == 4
    assert window.sample_of_entry().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    tail = window.tail(2)
    assert tail.indices.tolist() == [6, 7, 8, 9, 10, 11] and tail.start == 102
    with pytest.raises(ValueError):
        WindowGraph(np.array([0, 5]), np.arange(3))
