"""Routing: send each sample to the worker that holds most of its rows, under a capacity cap."""

from __future__ import annotations

import math

import numpy as np

from partitioner.types import Placement, WindowGraph

__all__ = [
    "Samples",
    "as_csr",
    "assign_with_capacity",
    "capacity",
    "capacity_of",
    "local_counts",
    "route",
    "route_window",
    "sample_sizes",
]


def capacity(num_samples: int, num_workers: int, epsilon: float) -> int:
    """Most samples one worker may take: ``(1 + epsilon)`` times the mean, never below the mean."""
    if num_workers <= 0 or epsilon < 0:
        raise ValueError("num_workers must be positive and epsilon non-negative")
    mean = num_samples / num_workers
    return max(math.ceil(mean), math.floor((1.0 + epsilon) * mean))


def sample_sizes(indptr: np.ndarray) -> np.ndarray | None:
    """Rows of each sample of a CSR, or None when every sample has as many (one value a field):
    then capacity counts samples, as it always did, and the answers stay what they were."""
    sizes = np.diff(np.asarray(indptr, dtype=np.int64))
    return None if sizes.size == 0 or sizes.min() == sizes.max() else sizes


def capacity_of(sizes: np.ndarray | None, num_samples: int, num_workers: int,
                epsilon: float) -> int:
    """:func:`capacity` in rows when samples have ``sizes`` (never below the largest sample, so
    each fits somewhere), in samples when they all weigh alike."""
    if sizes is None:
        return capacity(num_samples, num_workers, epsilon)
    return max(capacity(int(sizes.sum()), num_workers, epsilon), int(sizes.max()))


def local_counts(indptr: np.ndarray, indices: np.ndarray, placement: Placement) -> np.ndarray:
    """Per sample and worker, how many of the sample's ids the worker holds: int64 ``[B, N]``."""
    n = placement.num_workers
    num_samples = indptr.size - 1
    masks = placement.holders(indices)
    scores = np.empty((num_samples, n), dtype=np.int64)
    running = np.zeros(masks.size + 1, dtype=np.int64)
    for worker in range(n):
        # Held entries counted per sample as differences of a running count: one pass over
        # the entries per worker, samples of any length (empty ones too).
        np.cumsum(placement.held_by(worker, masks), out=running[1:])
        scores[:, worker] = running[indptr[1:]] - running[indptr[:-1]]
    return scores


def assign_with_capacity(scores: np.ndarray, cap: int, sizes: np.ndarray | None = None
                         ) -> np.ndarray:
    """Give each row of ``scores`` a column, best first, at most ``cap`` rows per column (with
    ``sizes``: at most ``cap`` of the rows' sizes, a sample weighing its ids).

    Requires ``cap * columns >= rows`` (the sizes' sum).

    Deferred acceptance in at most N vectorised rounds: every unplaced sample proposes to its
    next-best worker; a worker keeps the proposers that would lose most by going elsewhere (the
    gap to their next choice) up to its remaining room. Total room >= samples, so N rounds place
    every sample (a sample refused by all N workers would mean all of them are full).
    Two workers with integer scores (local counts) take a closed form of the same rounds (see
    ``_assign_two``). With sizes a worker keeps the prefix of its proposers that fits its room;
    room left in pieces can refuse a sample everywhere, and the few so refused after N rounds
    go to the workers with the most room left (a worker may then pass ``cap`` by less than one
    sample).
    """
    if sizes is None and scores.shape[1] == 2 and np.issubdtype(scores.dtype, np.integer):
        return _assign_two(scores, cap)
    return _assign_rounds(scores, cap, sizes)


def _assign_two(scores: np.ndarray, cap: int) -> np.ndarray:
    """``_assign_rounds`` for two workers and integer scores, in a few array operations.

    The first choice is the higher score, ties going to worker 1 for even rows and worker 0 for
    odd ones (the rotation of the general rounds); the gap to the second choice is the score
    difference. Only one worker can be over ``cap`` (``2 * cap >= rows``): it keeps its ``cap``
    proposers with the largest gaps (lower row first among equal gaps), as the first round does,
    and the second round sends the rest to the other worker, which has room for all of them.
    Measured on a 1024-sample batch of the train benchmark: 0.11 ms against 0.57 ms for the
    rounds (the trainer routes every batch of a step).
    """
    num_samples = scores.shape[0]
    diff = scores[:, 0].astype(np.int64) - scores[:, 1]
    odd = np.arange(num_samples) & 1
    first = np.where(diff > 0, 0, np.where(diff < 0, 1, 1 - odd)).astype(np.int32)
    for worker in (0, 1):
        proposers = np.flatnonzero(first == worker)
        if proposers.size > cap:
            order = np.lexsort((proposers, -np.abs(diff[proposers])))
            first[proposers[order[cap:]]] = 1 - worker
    return first


def _assign_rounds(scores: np.ndarray, cap: int, sizes: np.ndarray | None = None) -> np.ndarray:
    """Deferred acceptance for any number of workers (see ``assign_with_capacity``).

    Whole windows come through here (500k samples x 8 workers: 32 MB for each float64
    ``[S, N]`` array), so the tie-break, the negation and the gaps are made in place, a column
    at a time, and the preference order is kept in the narrowest integer type.
    """
    num_samples, n = scores.shape
    rows = np.arange(num_samples)
    # Ties (e.g. a sample none of whose rows is held anywhere) rotate over workers by sample
    # index, so they spread evenly instead of piling onto worker 0.
    key = scores.astype(np.float64)
    for column in range(n):
        key[:, column] += ((column - rows) % n) / (n + 1.0)
    np.negative(key, out=key)
    pref = np.argsort(key, axis=1, kind="stable").astype(np.min_scalar_type(n), copy=False)
    del key
    gaps = np.empty((num_samples, n), dtype=np.float64)
    for column in range(n):
        gaps[:, column] = scores[rows, pref[:, column]]
    for column in range(n - 1):
        gaps[:, column] -= gaps[:, column + 1]
    gaps[:, -1] = np.inf
    assigned = np.full(num_samples, -1, dtype=np.int32)
    room = np.full(n, cap, dtype=np.int64)
    for rnd in range(n):
        open_rows = np.flatnonzero(assigned < 0)
        if open_rows.size == 0:
            break
        choice = pref[open_rows, rnd].astype(np.int64)
        order = np.lexsort((open_rows, -gaps[open_rows, rnd], choice))
        sorted_choice = choice[order]
        starts = np.searchsorted(sorted_choice, np.arange(n))
        if sizes is None:
            rank = np.arange(order.size) - starts[sorted_choice]
            accept = rank < room[sorted_choice]
        else:  # the prefix of each worker's proposers whose sizes fit its room
            weight = sizes[open_rows[order]]
            running = np.cumsum(weight)
            before = np.concatenate([[0], running])[starts][sorted_choice]
            accept = running - before <= room[sorted_choice]
        taken = open_rows[order[accept]]
        assigned[taken] = sorted_choice[accept]
        room -= np.bincount(sorted_choice[accept], minlength=n,
                            weights=None if sizes is None else sizes[taken]).astype(np.int64)
    if sizes is not None:
        for row in np.flatnonzero(assigned < 0):  # refused everywhere: the most room left
            worker = int(np.argmax(room))
            assigned[row] = worker
            room[worker] -= sizes[row]
    return assigned


def _route_csr(indptr: np.ndarray, indices: np.ndarray, placement: Placement,
               capacity_epsilon: float) -> np.ndarray:
    num_samples = indptr.size - 1
    if num_samples == 0:
        return np.zeros(0, dtype=np.int32)
    scores = local_counts(indptr, indices, placement)
    sizes = sample_sizes(indptr)
    cap = capacity_of(sizes, num_samples, placement.num_workers, capacity_epsilon)
    return assign_with_capacity(scores, cap, sizes)


Samples = np.ndarray | tuple[np.ndarray, np.ndarray]
"""A batch's ids: int64 ``[B, F]`` (one id a field), or ``(indptr, values)``, a CSR of samples
by ids (sample ``b`` reads ``values[indptr[b]:indptr[b + 1]]``, any number of them)."""


def as_csr(samples: Samples) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, values)`` of a :data:`Samples` value (no copy of the ids)."""
    if isinstance(samples, tuple):
        indptr, values = samples
        return np.asarray(indptr, dtype=np.int64), np.asarray(values, dtype=np.int64)
    dense = np.asarray(samples, dtype=np.int64)
    if dense.ndim != 2:
        raise ValueError("batch ids must be [B, F] or an (indptr, values) pair")
    b, f = dense.shape
    return np.arange(b + 1, dtype=np.int64) * f, dense.reshape(-1)


def route(batch_ids: Samples, placement: Placement,
          capacity_epsilon: float = 0.05) -> np.ndarray:
    """Destination worker of each sample of a batch.

    Each sample goes to the worker holding (owning or replicating) most of its ids; no worker
    takes more than ``capacity(B, N, capacity_epsilon)`` samples (samples of different lengths:
    rows, see :func:`capacity_of`), samples that would lose least are the ones sent to their
    next choice.

    Args:
        batch_ids: The batch's ids (:data:`Samples`: ``[B, F]`` or a CSR).
        placement: The placement in force.
        capacity_epsilon: Allowed excess over the mean samples per worker.

    Returns:
        int32 ``[B]`` worker of each sample.
    """
    return _route_csr(*as_csr(batch_ids), placement, capacity_epsilon)


def route_window(window: WindowGraph, placement: Placement,
                 capacity_epsilon: float = 0.05) -> np.ndarray:
    """``route`` for a CSR window (samples of any length); capacity over the whole window."""
    return _route_csr(window.indptr, window.indices, placement, capacity_epsilon)
