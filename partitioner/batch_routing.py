"""Batch-aware routing: a sample is cheap on the worker that already fetches its rows this batch.

:func:`hetgmp.partitioner.route` sends each sample to the worker holding most of its rows, one sample
at a time. But a worker fetches each remote row once per batch, however many of its samples use
it: what a sample costs on a worker is the rows it needs there that nothing else routed there
fetches already (HET-GMP's soft cost). :func:`route_batch` starts from :func:`route`'s answer and
improves it by rounds of moves under the same capacity cap:

1. for the assignment in force, count per worker and distinct id how many of its samples need
   the id (held there: not needed);
2. a sample's cost where it is: its ids only it needs there (rows that would no longer be
   fetched if it left); its cost on another worker: its ids needed there and not fetched yet;
3. per pair of workers, samples trade places in order of gain while a pair's summed gain is
   positive, and samples with a positive gain move to a worker with room under the cap;
4. the round is kept only if the rows fetched by all workers together went down (costs are
   computed against the assignment before the round, so moves in one round can interfere);
   otherwise, or after ``rounds`` rounds, routing stops.

Routing never changes what is computed (every sample is trained once, on some rank), so the
s = 0 equivalence holds whatever it decides; it changes only which rows travel.
"""

from __future__ import annotations

import numpy as np

from hetgmp.partitioner.routing import Samples, as_csr, capacity_of, route, sample_sizes
from hetgmp.partitioner.types import Placement

__all__ = ["fetched_rows", "refine_counted", "refine_routing", "route_batch"]


def route_batch(batch_ids: Samples, placement: Placement, capacity_epsilon: float = 0.05,
                rounds: int = 3) -> np.ndarray:
    """Destination worker of each sample, batch-aware (see the module docstring).

    Args:
        batch_ids: The batch's ids (``[B, F]``, or a CSR of any number of ids a sample).
        placement: The placement in force.
        capacity_epsilon: Allowed excess over the mean samples per worker.
        rounds: Most rounds of moves after :func:`route` (0: :func:`route` alone).

    Returns:
        int32 ``[B]`` worker of each sample, at most ``capacity(B, N, capacity_epsilon)`` a
        worker (rows, when samples differ in length), never more rows fetched in all than
        :func:`route`'s answer.
    """
    start = route(batch_ids, placement, capacity_epsilon)
    return refine_routing(batch_ids, placement, start, capacity_epsilon, rounds)


def fetched_rows(batch_ids: Samples, workers: np.ndarray, placement: Placement) -> int:
    """Rows all workers fetch for this batch routed this way (distinct, per worker, not held)."""
    indptr, values = as_csr(batch_ids)
    inverse, need = _needs(values, placement)
    owner = _sample_of(indptr)
    return _tally(inverse, need, np.asarray(workers, dtype=np.int64)[owner])[0]


def refine_routing(batch_ids: Samples, placement: Placement, workers: np.ndarray,
                   capacity_epsilon: float = 0.05, rounds: int = 3) -> np.ndarray:
    """``workers`` improved by rounds of moves that lower the rows fetched (module docstring).

    The answer never fetches more rows than ``workers`` and keeps every worker under the cap
    (a worker already over it in ``workers`` only loses samples).
    """
    return refine_counted(batch_ids, placement, workers, capacity_epsilon, rounds)[0]


def refine_counted(batch_ids: Samples, placement: Placement, workers: np.ndarray,
                   capacity_epsilon: float = 0.05, rounds: int = 3
                   ) -> tuple[np.ndarray, int, int]:
    """:func:`refine_routing`, and the rows all workers fetch for the batch routed as
    ``workers`` and as the answer (:func:`fetched_rows` of each, counted on the way)."""
    indptr, values = as_csr(batch_ids)
    assigned = np.asarray(workers, dtype=np.int64).copy()
    n, b = placement.num_workers, indptr.size - 1
    inverse, need = _needs(values, placement)
    sample = _sample_of(indptr)  # the sample of each entry
    best, users = _tally(inverse, need, assigned[sample])
    start = best
    if n < 2 or b < 2 or rounds < 1:
        return assigned.astype(np.int32), start, start
    sizes = sample_sizes(indptr)
    cap = capacity_of(sizes, b, n, capacity_epsilon)
    weight = np.ones(b, np.int64) if sizes is None else sizes
    samples = np.arange(b)
    for _ in range(rounds):
        # users[w, u]: samples on w that need distinct id u there (0 where w holds it); a
        # sample's entries are summed per sample by a bincount over the entries.
        alone = np.bincount(sample, users[assigned[sample], inverse] == 1,
                            minlength=b).astype(np.int64)
        gain = np.empty((b, n), np.int64)
        for w in range(n):
            fetched_new = need[w][inverse] & (users[w][inverse] == 0)
            gain[:, w] = alone - np.bincount(sample, fetched_new, minlength=b).astype(np.int64)
        gain[samples, assigned] = np.iinfo(np.int64).min // 2
        moved = _moves(assigned, gain, n, cap, weight)
        total, moved_users = _tally(inverse, need, moved[sample])
        if total >= best or (sizes is not None and _over(moved, assigned, weight, n, cap)):
            break
        best, users, assigned = total, moved_users, moved
    return assigned.astype(np.int32), start, best


def _over(moved: np.ndarray, assigned: np.ndarray, weight: np.ndarray, n: int,
          cap: int) -> bool:
    """Whether trades of samples of different lengths took a worker past the cap (or past its
    load before the round, where that was over already): such a round is not kept."""
    before = np.bincount(assigned, weights=weight, minlength=n)
    return bool((np.bincount(moved, weights=weight, minlength=n) > np.maximum(cap, before)).any())


def _sample_of(indptr: np.ndarray) -> np.ndarray:
    """The sample each entry of a CSR belongs to."""
    return np.repeat(np.arange(indptr.size - 1), np.diff(indptr))


def _needs(values: np.ndarray, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """Each entry's distinct-id index and, per worker, whether it must fetch each distinct id
    (bool ``[N, U]``)."""
    distinct, inverse = np.unique(values, return_inverse=True)
    masks = placement.holders(distinct)
    need = np.stack([~placement.held_by(w, masks) for w in range(placement.num_workers)])
    return inverse.reshape(-1), need


def _tally(inverse: np.ndarray, need: np.ndarray, worker_of_entry: np.ndarray
           ) -> tuple[int, np.ndarray]:
    """Rows fetched in all, and per worker and distinct id the entries there that need it
    (a sample that reads an id twice counts twice: it still needs it once it is alone)."""
    n, u = need.shape
    users = np.bincount(worker_of_entry * u + inverse, minlength=n * u).reshape(n, u)
    users *= need
    return int(np.count_nonzero(users)), users


def _moves(assigned: np.ndarray, gain: np.ndarray, n: int, cap: int,
           weight: np.ndarray) -> np.ndarray:
    """One round of trades and moves into free room, each pair of workers in turn (room and
    ``cap`` in ``weight``: 1 a sample, or its rows)."""
    out = assigned.copy()
    for a in range(n):
        for b in range(a + 1, n):
            ab = np.flatnonzero((assigned == a) & (out == a))
            ba = np.flatnonzero((assigned == b) & (out == b))
            ab = ab[np.argsort(-gain[ab, b], kind="stable")]
            ba = ba[np.argsort(-gain[ba, a], kind="stable")]
            g_ab, g_ba = gain[ab, b], gain[ba, a]
            k = min(ab.size, ba.size)
            # Both lists are sorted by gain: the pairs worth trading are a prefix.
            trade = int(np.count_nonzero(g_ab[:k] + g_ba[:k] > 0))
            out[ab[:trade]], out[ba[:trade]] = b, a
            ab, g_ab, ba, g_ba = ab[trade:], g_ab[trade:], ba[trade:], g_ba[trade:]
            for src, dst, gains in ((ab, b, g_ab), (ba, a, g_ba)):
                room = cap - int(weight[out == dst].sum())
                movers = src[gains > 0]
                out[movers[np.cumsum(weight[movers]) <= room]] = dst
    return out
