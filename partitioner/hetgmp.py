"""HET-GMP's partitioner as its paper describes it, written here: the baseline strategy
``hetgmp-paper`` of ``hetgmp bench partition``, and the full partition's second candidate at
16 workers and more (:class:`~hetgmp.partitioner.FullPartitioner`, ``PartitionConfig.compare_from``).

The algorithm (Miao et al., "HET-GMP", SIGMOD 2022). Samples and ids form a bipartite graph;
every sample gets a worker, every id an owner. With ``M`` samples per worker and ``b`` per
worker batch, an id used by ``c`` of a worker's samples is in ``soft(c) = (M/b)(1 - (1 -
c/M)^b)`` of its batches, and the cost of a placement is ``sum over workers k and ids j of
comm[k, owner(j)] * soft(c_kj)`` (``comm``: 0 on the diagonal, 1 elsewhere here; HET-GMP
takes 0.1 within a machine). From a random start, rounds (5 in the paper) of a greedy pass
over the samples then one over the ids; then each worker copies the ids it does not own
ranked by ``comm x soft(c)^2 x (1/deg + 1/c)``, the top 1%.

Details the paper leaves open, as the public code has them (Hsword/SIGMOD2022_HET-GMP,
``hetuCTR/csrc/partition`` and ``hetuCTR/experimental/partition.py``, read, not copied):

* Start: every sample and every id on a uniformly random worker.
* Sample pass: a sample goes to the worker maximising ``-alpha * samples there (itself not
  counted) - sum over its ids of comm[k, owner] * (soft(c_k + 1) - soft(c_k))``, ``c_k`` its
  ids' counts on ``k`` without itself; ``alpha = 100 / (S / N)``. This is exact coordinate
  descent on ``cost + alpha * sum_k L_k (L_k - 1) / 2`` (``L_k``: samples on ``k``).
* Id pass: an id goes to the worker maximising ``-beta * ids owned there (itself not counted)
  - sum_j comm[j, k] soft(c_j) - 0.01 * served_k * soft(deg)``, ``beta = 100 / (G / N)``,
  ``served_k`` the remote fetches per step ``k`` answers (``b/M`` times the soft counts of the
  other workers over the ids it owns, whatever ``comm``, updated as ids move; recomputed
  after each sample pass): the hot-spot penalty. Coordinate
  descent on ``cost + beta * sum_k n_k (n_k - 1) / 2`` when that penalty is 0; the penalty
  itself is no potential (it weighs a hot id by ``soft(deg)``, not by what it adds to
  ``served``), so a pass may trade cost for spreading hot ids.
* Order: samples then ids, in index order, each round; the code's default is 10 rounds, the
  paper's 5 (ours).
* Replicas: ranked over the ids a worker does not own; ties are not specified (ours: by id).

Chosen here where both are silent or where the code's choice is an accident:

* **Chunks.** The paper's passes are sequential; the code runs each on 16 threads that read
  the counts as the others change them. Here a pass takes a chunk of samples (of ids) at a
  time, all scored against the counts as they stand at the chunk's start, then moved
  together: the same kind of relaxation, vectorised (chunks of 1 are the sequential passes;
  the tests check descent that way). A chunk must be small enough that its moving together
  does not swing the penalties, which are the same for all of it: ``M / 100`` samples (the
  balance term then moves by at most 1, about one id's marginal fetch) and ``M / b`` ids.
  Measured, 4 workers: at 30k records, chunks of 1,024 samples left the cost at 137k after 5
  rounds (all of a chunk fled to the least loaded worker) and chunks of 256 ids at 181k (all
  of a chunk to the least served one), against 67.5k with these sizes and 67.0k sequential;
  at 500k x 26, 10x smaller sample chunks and ids 4 at a time: -75.7% remote rows against
  hash, these sizes -75.5% (8 workers: -78.2% to -78.5% over samples 64 or 625 at a time,
  ids 4 to 64).
* **soft above M.** The code's table gives ``soft(c) = 1`` for ``c >= M`` (a degree above a
  worker's mean share of samples: the hottest ids) where the formula gives ``M/b`` at
  ``c = M``: counts are capped at ``M`` here (``partitioner.graph.soft_batches``), so the
  hot-spot penalty weighs hot ids most, as the paper describes.
* **G and M.** ``G`` is the window's distinct ids (the code: largest id + 1, which counts
  ids absent from the data); ``M = S / N`` (the code: integer division).
* **Budget.** The code keeps ``1%`` of each worker's list of the ids it does not own (all the
  table's, untouched ones ranked last). Here the budget is counted as the bench counts ours
  (``PartitionConfig.replica_basis``: 1% of the window's rows, or of the rows the worker's
  samples touch), and only ids the worker uses are copied (an untouched copy saves nothing).
* **Counts are entries**, as ``partitioner.graph`` counts them (a sample listing an id twice
  counts it twice); the sample-balance penalty counts samples, as the paper's does.
* Sample weights (a decayed window) are refused: the paper has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetgmp.partitioner.graph import dense_numbering, soft_batches
from hetgmp.partitioner.types import (
    PartitionConfig,
    Placement,
    WindowGraph,
    check_replica_basis,
    default_owner,
)

__all__ = [
    "PaperPartition",
    "PaperPartitioner",
    "PaperPasses",
    "PaperSettings",
    "paper_cost",
    "paper_partition",
    "paper_replicas",
    "replica_priority",
    "soft_table",
]


@dataclass(frozen=True)
class PaperSettings:
    """The algorithm's constants (defaults: the paper's and its public code's).

    Attributes:
        rounds: Alternating rounds (sample pass, then id pass).
        balance: Numerator of ``alpha`` and ``beta``: a worker holding one mean share more
            samples (ids) than another is that much less attractive.
        hot_spot: Weight of the hot-spot penalty of the id pass.
        sample_chunk: Samples scored together against the same counts (1: sequential; 0:
            ``M / balance``, so that a chunk moving together shifts the balance penalty by
            at most 1, about one id's marginal fetch; see the module docstring).
        id_chunk: Ids scored together (1: sequential; 0: ``M / b``, a worker's steps over the
            window, so that a chunk moving together shifts the hot-spot load by about one
            id's remote uses; see the module docstring).
    """

    rounds: int = 5
    balance: float = 100.0
    hot_spot: float = 0.01
    sample_chunk: int = 0
    id_chunk: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 0 or self.balance < 0 or self.hot_spot < 0:
            raise ValueError("rounds, balance and hot_spot must be >= 0")
        if self.sample_chunk < 0 or self.id_chunk < 0:
            raise ValueError("chunks must be >= 0 (0: sized from the window)")

    def ids_a_chunk(self, samples_per_worker: float, batch_per_worker: float) -> int:
        """The id pass's chunk for ``M`` samples a worker and ``b`` a batch."""
        if self.id_chunk:
            return self.id_chunk
        return max(1, int(samples_per_worker / max(batch_per_worker, 1.0)))

    def samples_a_chunk(self, samples_per_worker: float) -> int:
        """The sample pass's chunk for ``M`` samples a worker."""
        if self.sample_chunk:
            return self.sample_chunk
        if self.balance == 0:
            return 1 << 12  # no balance term to overshoot: chunks bounded for memory only
        return max(1, int(samples_per_worker / self.balance))


def soft_table(largest: int, samples_per_worker: float, batch_per_worker: float) -> np.ndarray:
    """``soft(c)`` for ``c = 0 .. largest`` (float64), counts above ``M`` capped at ``M``."""
    return soft_batches(np.arange(largest + 1), samples_per_worker, batch_per_worker)


def _default_comm(n: int) -> np.ndarray:
    return 1.0 - np.eye(n)


def paper_cost(counts: np.ndarray, owner: np.ndarray, soft: np.ndarray,
               comm: np.ndarray | None = None) -> float:
    """The placement cost: ``sum_k sum_j comm[k, owner_j] * soft[counts[j, k]]``.

    Args:
        counts: int ``[G, N]`` uses of each id by each worker's samples.
        owner: Owner of each id.
        soft: :func:`soft_table` over the counts.
        comm: ``[N, N]`` cost of worker ``k`` reaching worker ``o`` (default: 0 on the
            diagonal, 1 elsewhere).
    """
    n = counts.shape[1]
    comm = _default_comm(n) if comm is None else np.asarray(comm, dtype=np.float64)
    # comm.T[owner] is [G, N]: entry (j, k) = comm[k, owner_j].
    return float((soft[counts] * comm.T[np.asarray(owner)]).sum())


def replica_priority(counts: np.ndarray, owner: np.ndarray, degree: np.ndarray,
                     soft: np.ndarray, comm: np.ndarray | None = None) -> np.ndarray:
    """The paper's replica priority of each id on each worker: float64 ``[G, N]``.

    ``comm[k, owner_j] * soft(c_kj)^2 * (1/deg_j + 1/c_kj)``, 0 where the worker does not use
    the id or owns it.
    """
    n = counts.shape[1]
    comm = _default_comm(n) if comm is None else np.asarray(comm, dtype=np.float64)
    used = counts > 0
    inverse = np.divide(1.0, counts, out=np.zeros(counts.shape), where=used)
    inverse += (1.0 / np.maximum(np.asarray(degree, dtype=np.float64), 1.0))[:, None]
    priority = comm.T[np.asarray(owner)] * soft[counts] ** 2 * inverse
    priority[~used] = 0.0
    priority[np.arange(counts.shape[0]), np.asarray(owner)] = 0.0
    return priority


def paper_replicas(ids: np.ndarray, counts: np.ndarray, owner: np.ndarray,
                   priority: np.ndarray, fraction: float, basis: str
                   ) -> tuple[np.ndarray, ...]:
    """Each worker's replicas: its top ids by ``priority`` among those it uses, owner aside.

    Args:
        ids: Sorted window ids (G).
        counts: int ``[G, N]`` uses by each worker.
        owner: Owner of each id.
        priority: :func:`replica_priority`.
        fraction: Budget fraction.
        basis: A ``partitioner.ReplicaBasis``: ``"window"``, ``fraction`` of the window's ids
            on every worker; ``"touched"``, of the ids the worker's samples use.

    Returns:
        One sorted int64 array of ids per worker.
    """
    check_replica_basis(basis)
    out = []
    for worker in range(counts.shape[1]):
        rows = ids.size if basis == "window" else int(np.count_nonzero(counts[:, worker]))
        budget = int(min(fraction, 1.0) * rows)
        score = priority[:, worker]
        candidates = np.flatnonzero((score > 0) & (owner != worker))
        if budget <= 0 or candidates.size == 0:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        # Ties broken by id so the choice is deterministic.
        top = np.lexsort((ids[candidates], -score[candidates]))[:budget]
        out.append(np.sort(ids[candidates[top]]).astype(np.int64))
    return tuple(out)


class PaperPasses:
    """The state of a run of the algorithm and its two passes (see the module docstring).

    Attributes:
        worker: int64 worker of each sample.
        owner: int64 owner of each id (compact, 0..G-1).
        counts: int64 ``[G, N]`` uses of each id by each worker's samples (kept in step).
    """

    def __init__(self, indptr: np.ndarray, entry_id: np.ndarray, num_ids: int,
                 num_workers: int, batch_per_worker: float, settings: PaperSettings,
                 seed: int = 0, comm: np.ndarray | None = None) -> None:
        """Random start (samples and ids uniformly over the workers).

        Args:
            indptr: CSR row pointers of the samples.
            entry_id: Compact id (0..num_ids-1) of each entry.
            num_ids: G.
            num_workers: N.
            batch_per_worker: b, the per-worker batch of the soft count.
            settings: The algorithm's constants.
            seed: Seed of the random start.
            comm: ``[N, N]`` access costs (default 0 on the diagonal, 1 elsewhere).
        """
        n = num_workers
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.entry_id = entry_id
        self.settings = settings
        self.n, self.num_ids = n, num_ids
        self.num_samples = int(self.indptr.size - 1)
        self.comm = None if comm is None else np.asarray(comm, dtype=np.float64)
        if self.comm is not None and self.comm.shape != (n, n):
            raise ValueError("comm must be [num_workers, num_workers]")
        self.b = float(batch_per_worker)
        self.m = self.num_samples / n
        rng = np.random.default_rng(seed)
        self.worker = rng.integers(0, n, self.num_samples)
        self.owner = rng.integers(0, n, num_ids)
        self.counts = self._count()
        self.degree = self.counts.sum(axis=1)
        largest = int(self.degree.max()) + 1 if num_ids else 1
        self.soft = soft_table(largest, self.m, self.b)
        # Marginal soft count of one more use: soft(c + 1) - soft(c).
        self.gain = np.append(np.diff(self.soft), 0.0)
        self.alpha = settings.balance / max(self.m, 1e-12)
        self.beta = settings.balance / max(num_ids / n, 1e-12)
        self.load = np.bincount(self.worker, minlength=n)
        self.owned = np.bincount(self.owner, minlength=n)
        self.served = self._served()
        # Per id and worker, the marginal fetch of one more use (built per sample pass) and
        # the id pass's per-id terms (built per id pass).
        self._marginal: np.ndarray | None = None
        self._id_terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def place(self, worker: np.ndarray, owner: np.ndarray) -> None:
        """Start from this assignment instead of the random one (counts and loads follow)."""
        worker = np.asarray(worker, dtype=np.int64)
        owner = np.asarray(owner, dtype=np.int64)
        if worker.shape != (self.num_samples,) or owner.shape != (self.num_ids,):
            raise ValueError("one worker a sample and one owner an id")
        if min(worker.min(initial=0), owner.min(initial=0)) < 0 or \
                max(worker.max(initial=0), owner.max(initial=0)) >= self.n:
            raise ValueError("workers out of range")
        self.worker, self.owner = worker.copy(), owner.copy()
        self.counts = self._count()
        self.load = np.bincount(self.worker, minlength=self.n)
        self.owned = np.bincount(self.owner, minlength=self.n)
        self.served = self._served()
        self._marginal = self._id_terms = None

    def _count(self) -> np.ndarray:
        n = self.n
        flat = np.zeros(self.num_ids * n, dtype=np.int64)
        sizes = np.diff(self.indptr)
        step = 1 << 16  # samples a slice: the pair keys of all 13M entries at once are 100 MB
        for lo in range(0, self.num_samples, step):
            hi = min(lo + step, self.num_samples)
            rows = self.entry_id[self.indptr[lo]:self.indptr[hi]].astype(np.int64)
            rows *= n
            rows += np.repeat(self.worker[lo:hi], sizes[lo:hi])
            flat += np.bincount(rows, minlength=flat.size)
        # int32: the pass gathers a row of counts per entry, and half the bytes are faster.
        return flat.astype(np.int32).reshape(self.num_ids, n)

    def _reach(self, owner: np.ndarray) -> np.ndarray:
        """``comm[k, owner_j]`` of each id ``j`` and worker ``k``: ``[len(owner), N]``."""
        if self.comm is None:
            out = np.ones((owner.size, self.n))
            out[np.arange(owner.size), owner] = 0.0
            return out
        return self.comm.T[owner]

    def _remote(self) -> np.ndarray:
        """Per id and worker ``k``, the soft counts of the other workers summed: what ``k``
        would serve per window if it owned the id (the hot-spot load), ``[G, N]``."""
        soft = self.soft[self.counts]
        return soft.sum(axis=1, keepdims=True) - soft

    def _served(self) -> np.ndarray:
        """Remote fetches per step each worker answers (the hot-spot penalty's load)."""
        remote = self._remote()[np.arange(self.num_ids), self.owner]
        return np.bincount(self.owner, weights=remote, minlength=self.n) * (self.b / self.m)

    def objective(self) -> dict[str, float]:
        """The cost and the balance potentials the passes descend (see the module docstring)."""
        load, owned = self.load.astype(np.float64), self.owned.astype(np.float64)
        return {"cost": paper_cost(self.counts, self.owner, self.soft, self.comm),
                "sample_balance": self.alpha * float((load * (load - 1) / 2).sum()),
                "id_balance": self.beta * float((owned * (owned - 1) / 2).sum())}

    def sample_scores(self, lo: int, hi: int) -> np.ndarray:
        """The sample pass's score of samples ``lo..hi-1`` on each worker: float64 ``[S', N]``
        (higher is better), against the counts as they stand."""
        if self._marginal is None:
            self._marginal = self.gain[self.counts] * self._reach(self.owner)
        e0, e1 = int(self.indptr[lo]), int(self.indptr[hi])
        rows = self.entry_id[e0:e1]
        sizes = np.diff(self.indptr[lo:hi + 1])
        current = self.worker[lo:hi]
        fetch = np.zeros((hi - lo, self.n))
        if rows.size:
            # Sums over each sample's entries of its ids' marginal fetches on every worker;
            # empty samples (no entries) stay 0.
            full = sizes > 0
            # (np.take: a fancy-index gather of whole rows is several times slower.)
            fetch[full] = np.add.reduceat(np.take(self._marginal, rows, axis=0),
                                          (self.indptr[lo:hi] - e0)[full], axis=0)
            # Where the sample is, its own use is in the counts: its marginal there is
            # soft(c) - soft(c - 1), not soft(c + 1) - soft(c).
            entry_current = np.repeat(current, sizes)
            used = np.take(self.counts, self._pairs(rows, entry_current))
            fix = (self.gain[used - 1] - self.gain[used]) * \
                self._reach_of(rows, entry_current)
            fetch[np.arange(hi - lo), current] += np.bincount(
                np.repeat(np.arange(hi - lo), sizes), weights=fix, minlength=hi - lo)
        fetch += self.alpha * self.load
        fetch[np.arange(hi - lo), current] -= self.alpha  # the sample is not counted where it is
        return np.negative(fetch, out=fetch)

    def _pairs(self, rows: np.ndarray, workers: np.ndarray) -> np.ndarray:
        """Flat positions of (id, worker) pairs in a ``[G, N]`` array."""
        pairs = rows.astype(np.int64) * self.n
        pairs += workers
        return pairs

    def _reach_of(self, rows: np.ndarray, workers: np.ndarray) -> np.ndarray:
        """``comm[worker, owner]`` for pairs of ids and workers."""
        owner = self.owner[rows]
        if self.comm is None:
            return (owner != workers).astype(np.float64)
        return self.comm[workers, owner]

    def sample_pass(self) -> int:
        """One greedy pass over the samples, a chunk at a time. Returns the samples moved."""
        self._marginal = None  # owners changed since the last pass
        moved_total = 0
        step = self.settings.samples_a_chunk(self.m)
        for lo in range(0, self.num_samples, step):
            hi = min(lo + step, self.num_samples)
            target = np.argmax(self.sample_scores(lo, hi), axis=1)
            current = self.worker[lo:hi]
            moved = np.flatnonzero(target != current)
            if moved.size == 0:
                continue
            moved_total += moved.size
            self._move_samples(lo + moved, current[moved], target[moved])
        self._marginal = None
        return moved_total

    def _move_samples(self, samples: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        sizes = self.indptr[samples + 1] - self.indptr[samples]
        take = np.repeat(self.indptr[samples] - np.cumsum(sizes) + sizes, sizes) + \
            np.arange(int(sizes.sum()))
        rows = self.entry_id[take].astype(np.int64)
        counts = self.counts.reshape(-1)  # views: updated in place
        ones = np.ones(rows.size, dtype=counts.dtype)  # a scalar takes ufunc.at's slow path
        for sign, workers in ((-1, np.repeat(src, sizes)), (1, np.repeat(dst, sizes))):
            pairs = self._pairs(rows, workers)
            np.add.at(counts, pairs, sign * ones)
            if self._marginal is not None:
                # The marginals of the pairs whose counts changed (the rest stand).
                self._marginal.reshape(-1)[pairs] = self.gain[counts[pairs]] * \
                    self._reach_of(rows, workers)
        self.load += np.bincount(dst, minlength=self.n) - np.bincount(src, minlength=self.n)
        self.worker[samples] = dst

    def id_scores(self, lo: int, hi: int) -> np.ndarray:
        """The id pass's score of ids ``lo..hi-1`` on each worker: float64 ``[G', N]``."""
        if self._id_terms is None:
            self._id_terms = self._prepare_id_pass()
        reach_cost, _, hot = self._id_terms
        cost = hot[lo:hi, None] * self.served
        cost += reach_cost[lo:hi]
        cost += self.beta * self.owned
        cost[np.arange(hi - lo), self.owner[lo:hi]] -= self.beta  # itself not counted
        return np.negative(cost, out=cost)

    def _prepare_id_pass(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the id pass needs of each id (counts do not change during it): the cost of
        owning it on each worker, the fetches each worker would serve per step for it, and
        its hot-spot weight."""
        soft = self.soft[self.counts]
        remote = soft.sum(axis=1, keepdims=True) - soft
        # (j, k): sum over workers i of comm[i, k] * soft_i, the cost of owner k.
        reach_cost = remote if self.comm is None else soft @ self.comm
        hot = self.settings.hot_spot * self.soft[self.degree]
        return reach_cost, remote * (self.b / self.m), hot

    def id_pass(self) -> int:
        """One greedy pass over the ids, a chunk at a time. Returns the ids moved."""
        self._id_terms = self._prepare_id_pass()
        _, serve, _ = self._id_terms
        moved_total = 0
        step = self.settings.ids_a_chunk(self.m, self.b)
        for lo in range(0, self.num_ids, step):
            hi = min(lo + step, self.num_ids)
            target = np.argmax(self.id_scores(lo, hi), axis=1)
            current = self.owner[lo:hi]
            moved = np.flatnonzero(target != current)
            if moved.size == 0:
                continue
            moved_total += moved.size
            rows = lo + moved
            src, dst = current[moved], target[moved]
            self.served += np.bincount(dst, weights=serve[rows, dst], minlength=self.n)
            self.served -= np.bincount(src, weights=serve[rows, src], minlength=self.n)
            self.owned += np.bincount(dst, minlength=self.n) - np.bincount(src, minlength=self.n)
            self.owner[rows] = dst
        self._id_terms = None
        return moved_total

    def run(self) -> list[float]:
        """The rounds; returns the cost at the start and after each round."""
        costs = [self.objective()["cost"]]
        for _ in range(self.settings.rounds):
            self.sample_pass()
            # The hot-spot load follows the counts the sample pass changed.
            self.served = self._served()
            self.id_pass()
            costs.append(self.objective()["cost"])
        return costs


@dataclass(frozen=True, eq=False)
class PaperPartition:
    """What a run of the algorithm computed.

    Attributes:
        placement: Owners of the window's ids (entries equal to the default owner left out)
            and the replicas, the budget counted as the config asked.
        sample_worker: int64 worker of each window sample, the algorithm's own assignment
            (the bench re-routes; training on this one instead is issue 55's item 3).
        ids: Sorted window ids (G).
        owner: int64 owner of each of ``ids``.
        counts: int64 ``[G, N]`` uses of each id by each worker under ``sample_worker``.
        priority: ``[G, N]`` replica priority (:func:`replica_priority`).
        costs: The cost at the random start and after each round.
    """

    placement: Placement
    sample_worker: np.ndarray
    ids: np.ndarray
    owner: np.ndarray
    counts: np.ndarray
    priority: np.ndarray
    costs: tuple[float, ...] = field(default=())

    def with_replicas(self, fraction: float, basis: str) -> Placement:
        """The same owners with the replicas of another budget (no new partition)."""
        p = self.placement
        replicas = paper_replicas(self.ids, self.counts, self.owner, self.priority, fraction,
                                  basis)
        return Placement(p.version, p.num_workers, p.ids, p.owners, replicas)


def paper_partition(window: WindowGraph, config: PartitionConfig,
                    settings: PaperSettings | None = None, comm: np.ndarray | None = None,
                    version: int = 1) -> PaperPartition:
    """Partition ``window`` with HET-GMP's algorithm (see the module docstring).

    Args:
        window: The samples (CSR of ids). Every id is placed (the paper's ``min_count`` is 1).
        config: Workers, global batch (the soft count's ``b`` is its per-worker share),
            replica fraction and basis, and the seed of the random start; the rest of it is
            ours and unused.
        settings: The algorithm's constants (default: the paper's).
        comm: ``[N, N]`` access costs (default 0 on the diagonal, 1 elsewhere).
        version: Version of the placement.

    Raises:
        ValueError: A window with sample weights (the paper has none).
    """
    settings = settings or PaperSettings()
    if window.weights is not None:
        raise ValueError("HET-GMP's algorithm takes unweighted samples")
    n = config.num_workers
    ids, entry_id = dense_numbering(window.indices)
    passes = PaperPasses(window.indptr, entry_id, int(ids.size), n, config.batch_per_worker,
                         settings, seed=config.seed, comm=comm)
    costs = passes.run()
    del entry_id
    owner = passes.owner
    priority = replica_priority(passes.counts, owner, passes.degree, passes.soft, passes.comm)
    replicas = paper_replicas(ids, passes.counts, owner, priority, config.replica_fraction,
                              config.replica_basis)
    explicit = owner != default_owner(ids, n)
    placement = Placement(version, n, ids[explicit], owner[explicit].astype(np.int32), replicas)
    return PaperPartition(placement, passes.worker, ids, owner, passes.counts, priority,
                          tuple(costs))


class PaperPartitioner:
    """:func:`paper_partition` behind the ``Partitioner`` protocol, for the rolling bench.

    HET-GMP partitions once, from nothing: ``current`` only sets the version. The last run's
    :class:`PaperPartition` (its sample assignment, costs) is kept in ``last``.
    """

    def __init__(self, config: PartitionConfig, settings: PaperSettings | None = None) -> None:
        self.config = config
        self.settings = settings or PaperSettings()
        self.last: PaperPartition | None = None

    def partition(self, window: WindowGraph, current: Placement | None) -> Placement:
        """Partition ``window`` from a random start (see :func:`paper_partition`)."""
        version = 1 if current is None else current.version + 1
        if window.num_samples == 0:
            return (current or Placement.hash(self.config.num_workers)).with_version(version)
        self.last = paper_partition(window, self.config, self.settings, version=version)
        return self.last.placement
