"""Migration plan: the exact difference between two placements and the rows it moves."""

from __future__ import annotations

import numpy as np

from hetgmp.partitioner.types import MigrationPlan, Placement, find_sorted

__all__ = ["plan_diff"]


def plan_diff(old: Placement, new: Placement, row_bytes: int) -> MigrationPlan:
    """Diff two placements into the minimal set of row moves and replica changes.

    A row moves only if its effective owner changes; ids entering or leaving the explicit table
    on the owner they already had move nothing. Work is proportional to the two explicit tables
    (ids outside both keep their default owner in both).

    Args:
        old: The placement in force.
        new: The placement to move to (same ``num_workers``).
        row_bytes: Bytes per row (embedding, optimizer state and version), for the byte counts.

    Returns:
        The plan; ``plan.apply(old) == new``.

    Raises:
        ValueError: If the worker counts differ or ``row_bytes`` is negative.
    """
    if old.num_workers != new.num_workers:
        raise ValueError("placements have different worker counts")
    if row_bytes < 0:
        raise ValueError("row_bytes must be non-negative")
    touched = np.union1d(old.ids, new.ids).astype(np.int64)
    before = old.owner_of(touched)
    after = new.owner_of(touched)
    moving = before != after

    # Explicit-table changes: entries that are new or whose owner changed, and entries dropped.
    pos = find_sorted(old.ids, new.ids)
    changed = pos < 0
    kept = np.flatnonzero(~changed)
    changed[kept] = old.owners[pos[kept]] != new.owners[kept]
    released = np.setdiff1d(old.ids, new.ids, assume_unique=True)

    adds = tuple(np.setdiff1d(n, o, assume_unique=True) for o, n in zip(old.replicas,
                                                                         new.replicas))
    drops = tuple(np.setdiff1d(o, n, assume_unique=True) for o, n in zip(old.replicas,
                                                                          new.replicas))
    return MigrationPlan(
        from_version=old.version,
        to_version=new.version,
        num_workers=new.num_workers,
        row_bytes=row_bytes,
        moved_ids=touched[moving],
        src=before[moving],
        dst=after[moving],
        assign_ids=new.ids[changed],
        assign_owners=new.owners[changed],
        release_ids=released,
        replica_adds=adds,
        replica_drops=drops,
    )
