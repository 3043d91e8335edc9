"""Routing: send each sample to the worker that holds most of its rows, under a capacity cap.

A batch's rows are fetched once per worker, however many of the worker's samples read them
(HET-GMP's soft cost). :func:`route` therefore counts a held row by what holding it saves in
this batch: an id that ``c`` samples of the batch read weighs ``1/4 + 3/4 * n / (n + c - 1)``
(``n`` workers): 1 for an id only this sample reads, which the worker must fetch for it alone
if it does not hold it; down to 1/4 for an id many read, which a worker fetches anyway as
soon as one of the others lands there. Counting every held row as 1 let a sample's popular
rows outvote its rare ones, which decide where it is cheap: on the user-history shape at 4
workers (100k records, offline), plain counts left 18.4% fewer remote rows than hash where
HET-GMP's own sample assignment left 31.6%. The floor of 1/4 is for rows that are popular
because a community shares them (the samples that read them land on one worker, so elsewhere
they are not fetched anyway): without it (``n / (n + c - 1)`` alone) the segments shape at 8
workers fetched 2.3% more than plain counts; with it, relative to plain counts on the graph
placement, 0.84-0.92 of the rows on the user shapes, 0.87 / 1.00 on segments at 4 / 8
workers, 0.99 / 0.93 on issue 45's recipe, 0.90-0.91 on the tests' small segment stream. Ids
are counted in 2^18 hash buckets of the batch (a collision only makes an id look a little
more read): 1-2 ms a batch of 100k values, against 7 ms for ``np.unique``.
:func:`route_window` keeps the plain counts: a whole window is not one batch.
"""

from __future__ import annotations

import math

import numpy as np

from hetgmp.partitioner.types import Placement, WindowGraph
from hetgmp.runtime import fmix64

__all__ = [
    "Samples",
    "as_csr",
    "assign_with_capacity",
    "batch_weights",
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


def local_counts(indptr: np.ndarray, indices: np.ndarray, placement: Placement,
                 weights: np.ndarray | None = None) -> np.ndarray:
    """Per sample and worker, how many of the sample's ids the worker holds: int64 ``[B, N]``
    (with ``weights``, one per entry: the held entries' weights summed, float64)."""
    n = placement.num_workers
    num_samples = indptr.size - 1
    masks = placement.holders(indices)
    dtype = np.int64 if weights is None else np.float64
    scores = np.empty((num_samples, n), dtype=dtype)
    running = np.zeros(masks.size + 1, dtype=dtype)
    for worker in range(n):
        # Held entries counted per sample as differences of a running count: one pass over
        # the entries per worker, samples of any length (empty ones too).
        held = placement.held_by(worker, masks)
        np.cumsum(held if weights is None else held * weights, out=running[1:])
        scores[:, worker] = running[indptr[1:]] - running[indptr[:-1]]
    return scores


_BUCKET_BITS = 18


_FLOOR = 0.25


def batch_weights(values: np.ndarray, num_workers: int) -> np.ndarray:
    """What holding each entry's row is worth to its sample in this batch (module docstring):
    ``1/4 + 3/4 * n / (n + c - 1)``, ``c`` the batch's entries in the id's hash bucket.
    float64 ``[E]``."""
    if values.size == 0:
        return np.zeros(0, dtype=np.float64)
    bucket = (fmix64(values) & np.uint64((1 << _BUCKET_BITS) - 1)).view(np.int64)
    counts = np.bincount(bucket, minlength=1 << _BUCKET_BITS)[bucket]
    n = float(num_workers)
    return _FLOOR + (1.0 - _FLOOR) * (n / (n + counts - 1.0))


def assign_with_capacity(scores: np.ndarray, cap: int, sizes: np.ndarray | None = None
                         ) -> np.ndarray:
    """Give each row of ``scores`` a column, best first, at most ``cap`` rows per column (with
    ``sizes``: at most ``cap`` of the rows' sizes, a sample weighing its ids).

    Requires ``cap * columns >= rows`` (the sizes' sum).

    Deferred acceptance in at most N vectorised rounds: every unplaced sample proposes to its
    next-best worker; a worker keeps the proposers that would lose most by going elsewhere (the
    gap to their next choice) up to its remaining room. Total room >= samples, so N rounds place
    every sample (a sample refused by all N workers would mean all of them are full).
    Two workers take a closed form of the same rounds (see ``_assign_two``). With sizes a
    worker keeps the prefix of its proposers that fits its room; room left in pieces can
    refuse a sample everywhere, and the few so refused after N rounds go to the workers with
    the most room left (a worker may then pass ``cap`` by less than one sample).
    """
    if sizes is None and scores.shape[1] == 2:
        return _assign_two(scores, cap)
    return _assign_rounds(scores, cap, sizes)


def _assign_two(scores: np.ndarray, cap: int) -> np.ndarray:
    """``_assign_rounds`` for two workers, in a few array operations.

    The first choice is the higher score, ties going to worker 1 for even rows and worker 0 for
    odd ones (the rotation of the general rounds); the gap to the second choice is the score
    difference. Only one worker can be over ``cap`` (``2 * cap >= rows``): it keeps its ``cap``
    proposers with the largest gaps (lower row first among equal gaps), as the first round does,
    and the second round sends the rest to the other worker, which has room for all of them.
    Measured on a 1024-sample batch of the train benchmark: 0.11 ms against 0.57 ms for the
    rounds (the trainer routes every batch of a step).
    """
    num_samples = scores.shape[0]
    diff = scores[:, 0] - scores[:, 1] if scores.dtype.kind == "f" else \
        scores[:, 0].astype(np.int64) - scores[:, 1]
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
    # The rotation only breaks ties: below any difference of integer scores (1), and far
    # below the differences of weighted ones (1/(n+1) would outvote a sample's rarest rows).
    tie = 1.0 / (n + 1.0) if np.issubdtype(scores.dtype, np.integer) else 1e-9 / n
    for column in range(n):
        key[:, column] += ((column - rows) % n) * tie
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
               capacity_epsilon: float, weighted: bool = True) -> np.ndarray:
    num_samples = indptr.size - 1
    if num_samples == 0:
        return np.zeros(0, dtype=np.int32)
    weights = batch_weights(indices, placement.num_workers) if weighted else None
    scores = local_counts(indptr, indices, placement, weights)
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

    Each sample goes to the worker holding (owning or replicating) most of its ids, each id
    weighed by what holding it saves in this batch (:func:`batch_weights`); no worker takes
    more than ``capacity(B, N, capacity_epsilon)`` samples (samples of different lengths:
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
    """``route`` for a CSR window (samples of any length); capacity over the whole window, every
    held id counted 1 (a window is not one batch)."""
    return _route_csr(window.indptr, window.indices, placement, capacity_epsilon,
                      weighted=False)
