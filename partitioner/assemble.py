"""Steps shared by the partitioners: label matching, row balance, and building the placement."""

from __future__ import annotations

import math

import numpy as np

from hetgmp.partitioner.graph import CompactWindow, per_worker_counts, route_compact, soft_batches
from hetgmp.partitioner.replicas import choose_replicas
from hetgmp.partitioner.types import PartitionConfig, Placement, default_owner, find_sorted

__all__ = ["balance_rows", "build_placement", "match_labels", "replica_matrix"]


def match_labels(parts: np.ndarray, current_owner: np.ndarray, num_workers: int) -> np.ndarray:
    """Permutation of part labels that keeps the most rows where they are.

    Graph partitioners number their parts arbitrarily; renaming part ``a`` to worker ``perm[a]``
    so that the overlap with the current owners is largest turns most of a fresh partition's
    apparent churn into rows that simply stay. Exact (dynamic programming over subsets) up to 12
    workers, greedy on the overlap matrix beyond.

    Args:
        parts: Part of each row (0..N-1).
        current_owner: Current owner of each row.
        num_workers: N.

    Returns:
        int64 ``perm`` of length N.
    """
    n = num_workers
    overlap = np.bincount(parts * n + current_owner, minlength=n * n).reshape(n, n)
    if n > 12:
        perm = np.full(n, -1, dtype=np.int64)
        free_rows, free_cols = set(range(n)), set(range(n))
        for flat in np.argsort(-overlap, axis=None, kind="stable"):
            a, b = divmod(int(flat), n)
            if a in free_rows and b in free_cols:
                perm[a] = b
                free_rows.discard(a)
                free_cols.discard(b)
        return perm
    # best[mask]: largest overlap giving parts 0..popcount(mask)-1 the workers in mask.
    size = 1 << n
    best = np.full(size, -1, dtype=np.int64)
    choice = np.zeros(size, dtype=np.int64)
    best[0] = 0
    for mask in range(size):
        if best[mask] < 0:
            continue
        a = bin(mask).count("1")
        if a == n:
            continue
        for b in range(n):
            if not mask >> b & 1:
                value = best[mask] + overlap[a, b]
                if value > best[mask | 1 << b]:
                    best[mask | 1 << b] = value
                    choice[mask | 1 << b] = b
    perm = np.zeros(n, dtype=np.int64)
    mask = size - 1
    for a in range(n - 1, -1, -1):
        perm[a] = choice[mask]
        mask &= ~(1 << int(choice[mask]))
    return perm


def balance_rows(owner: np.ndarray, affinity: np.ndarray, movable: np.ndarray,
                 num_workers: int, epsilon: float,
                 fixed: np.ndarray | None = None) -> np.ndarray:
    """Move the rows that matter least until no worker owns more than ``(1 + eps)`` x the mean,
    as far as the movable rows allow.

    Load is the ``movable`` rows a worker owns plus its ``fixed`` ones; only movable rows move.
    A worker whose fixed rows alone pass the cap keeps them (it gives away all its movable
    rows). From the most loaded worker to the least loaded one, the rows whose affinity to their
    owner exceeds their affinity to the receiver by the least are moved first (for cold rows
    that difference is close to zero).

    Args:
        owner: int32 owner of each row (a copy is returned).
        affinity: float ``[rows, N]``, e.g. soft fetch counts from each worker.
        movable: bool mask of the rows that are balanced (and may move).
        num_workers: N.
        epsilon: Tolerance.
        fixed: Rows each worker owns besides these, which stay where they are (an incremental
            pass balances the window's rows, moving only those it looks at).
    """
    owner = owner.copy()
    rows = np.flatnonzero(movable)
    if rows.size == 0:
        return owner
    base = np.zeros(num_workers, np.int64) if fixed is None else np.asarray(fixed, np.int64)
    total = rows.size + int(base.sum())
    cap = max(math.ceil(total / num_workers), math.floor((1 + epsilon) * total / num_workers))
    for _ in range(num_workers * num_workers):
        mine = np.bincount(owner[rows], minlength=num_workers)
        load = base + mine
        # Only the movable rows move: a worker over the cap with none left keeps its fixed
        # rows, and the others are balanced as far as their movable rows allow.
        over = np.where(mine > 0, load, np.iinfo(np.int64).min)
        src = int(np.argmax(over))
        dst = int(np.argmin(load))
        if over[src] <= cap:
            break
        amount = min(int(load[src] - cap), int(cap - load[dst]), int(mine[src]))
        if amount <= 0:
            break
        candidates = rows[owner[rows] == src]
        loss = affinity[candidates, src] - affinity[candidates, dst]
        picked = candidates[np.argsort(loss, kind="stable")[:amount]]
        owner[picked] = dst
    return owner


def replica_matrix(placement: Placement, cw: CompactWindow) -> np.ndarray:
    """Which workers hold a replica of each compact id of the window: bool ``[G, N]``."""
    out = np.zeros((cw.num_ids, placement.num_workers), dtype=bool)
    for worker, ids in enumerate(placement.replicas):
        pos = find_sorted(cw.ids, ids)
        out[pos[pos >= 0], worker] = True
    return out


def build_placement(cw: CompactWindow, owner: np.ndarray, current: Placement | None,
                    config: PartitionConfig, version: int,
                    window_rows: int | None = None,
                    fixed_rows: np.ndarray | None = None) -> Placement:
    """Balance rows, pick replicas and write the explicit table of a new placement.

    The explicit table keeps every entry of ``current`` for ids outside the window (rows nobody
    touched recently stay where they are: moving them saves nothing) and takes ``owner`` for the
    window's ids; entries equal to the default owner are left out, since they change nothing.

    Args:
        cw: The compacted window.
        owner: int32 owner of each compact id (already the current owner for ids not decided).
        current: The placement in force, if any.
        config: Partitioner settings.
        version: Version of the new placement.
        window_rows: Distinct rows of the whole window, when ``cw`` is only part of it
            (default: ``cw``'s own). The replica budget is defined on the whole window: the
            ``"window"`` basis counts these rows, the ``"touched"`` one scales each worker's
            touched rows in ``cw`` by ``window_rows / cw.num_ids``.
        fixed_rows: Rows of the window outside ``cw``'s placed ones that each worker owns and
            keeps; rows are then balanced over the whole window, not over ``cw`` alone.
    """
    n = config.num_workers
    eligible = cw.degree >= config.min_count
    # Rows are balanced over the ids the window uses enough to place (plus fixed_rows, when
    # cw is only part of the window).
    first_route = route_compact(cw, owner, None, n, config.epsilon)
    counts = per_worker_counts(cw, first_route, n)
    loads = np.bincount(first_route, minlength=n)
    affinity = soft_batches(counts, float(loads.mean()), config.batch_per_worker)
    balanced = balance_rows(owner, affinity, eligible, n, config.epsilon, fixed_rows)
    # Replicas are chosen against the routing the trainer will see without them.
    routed = first_route
    routed_counts: np.ndarray | None = counts
    if not np.array_equal(balanced, owner):
        routed = route_compact(cw, balanced, None, n, config.epsilon)
        routed_counts = None
    owner = balanced
    if config.replica_basis == "window":
        rows = cw.num_ids if window_rows is None else window_rows
        replicas = choose_replicas(cw, owner, routed, n, config.replica_fraction,
                                   config.batch_per_worker, budget_rows=rows,
                                   counts=routed_counts)
    else:
        scale = 1.0 if window_rows is None else window_rows / max(cw.num_ids, 1)
        replicas = choose_replicas(cw, owner, routed, n, config.replica_fraction * scale,
                                   config.batch_per_worker, counts=routed_counts)

    window_ids = cw.ids
    keep = owner != default_owner(window_ids, n)
    ids = window_ids[keep]
    owners = owner[keep]
    if current is not None and current.ids.size:
        outside = find_sorted(window_ids, current.ids) < 0
        ids = np.concatenate([ids, current.ids[outside]])
        owners = np.concatenate([owners, current.owners[outside]])
        order = np.argsort(ids, kind="stable")
        ids, owners = ids[order], owners[order]
    return Placement(version, n, ids, owners.astype(np.int32), replicas)
