"""Plan diff: exact, minimal, and its apply rebuilds the target placement."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from hetgmp.partitioner import Placement, default_owner, migrated_bytes, migrated_rows, plan_diff


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_apply_of_diff_gives_the_new_placement(
        seed: int, random_placement: Callable[..., Placement]) -> None:
    old = random_placement(seed, version=4)
    new = random_placement(seed + 100, version=5)
    plan = plan_diff(old, new, row_bytes=64)
    assert plan.apply(old) == new
    # Exactly the ids whose effective owner differs move, each from its old to its new owner.
    touched = np.union1d(old.ids, new.ids)
    differs = touched[old.owner_of(touched) != new.owner_of(touched)]
    assert np.array_equal(plan.moved_ids, differs)
    assert np.array_equal(plan.src, old.owner_of(differs))
    assert np.array_equal(plan.dst, new.owner_of(differs))


def test_known_small_diff() -> None:
    free = 1000
    default = int(default_owner(np.array([free]), 2)[0])
    old = Placement(0, 2, np.array([1, 2]), np.array([0, 1]))
    # 1 keeps worker 0, 2 moves to 0, `free` enters the table on its default owner (no move).
    new = Placement(1, 2, np.array([1, 2, free]), np.array([0, 0, default]),
                    (np.array([], dtype=np.int64), np.array([1])))
    plan = plan_diff(old, new, row_bytes=100)
    assert plan.moved_ids.tolist() == [2] and plan.src.tolist() == [1]
    assert plan.dst.tolist() == [0]
    assert migrated_rows(plan) == 1 and migrated_bytes(plan) == 100
    assert plan.replica_adds[1].tolist() == [1] and plan.replica_rows_added == 1
    assert migrated_bytes(plan, include_replicas=True) == 200
    assert plan.sends(1)[0].tolist() == [2] and plan.receives(0)[1].tolist() == [1]
    assert plan.apply(old) == new


def test_diff_of_a_placement_with_itself_moves_nothing(
        random_placement: Callable[..., Placement]) -> None:
    a = random_placement(9)
    plan = plan_diff(a, a.with_version(1), row_bytes=8)
    assert plan.rows_moved == 0 and plan.replica_rows_added == 0
    assert plan.apply(a) == a.with_version(1)


def test_dropping_an_entry_moves_the_row_back_to_its_default_owner() -> None:
    row = np.array([77])
    default = int(default_owner(row, 4)[0])
    elsewhere = (default + 1) % 4
    old = Placement(0, 4, row, np.array([elsewhere]))
    plan = plan_diff(old, Placement.hash(4, version=1), row_bytes=1)
    assert plan.release_ids.tolist() == [77]
    assert plan.src.tolist() == [elsewhere] and plan.dst.tolist() == [default]


def test_apply_refuses_another_starting_placement(
        random_placement: Callable[..., Placement]) -> None:
    a, b = random_placement(1, version=0), random_placement(2, version=1)
    plan = plan_diff(a, b, row_bytes=1)
    with pytest.raises(ValueError):
        plan.apply(b)
