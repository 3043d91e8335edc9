"""Values and interfaces of the partitioner: the window graph, the placement, the migration plan.

Everything here is a frozen dataclass over numpy arrays (made read-only on construction) or a
small protocol. The algorithms that produce these values live in the sibling modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from hetgmp.partitioner.hashing import default_owner
from hetgmp.partitioner.idindex import IdIndex
from hetgmp.runtime import fmix64

__all__ = [
    "MAX_WORKERS",
    "MigrationPlan",
    "PartitionConfig",
    "Partitioner",
    "Placement",
    "REPLICA_BASES",
    "ReplicaBasis",
    "WindowGraph",
    "check_replica_basis",
    "default_owner",
    "find_sorted",
]

_EMPTY_IDS = np.zeros(0, dtype=np.int64)
# What a replica budget fraction counts (PartitionConfig.replica_basis).
ReplicaBasis = Literal["touched", "window"]
REPLICA_BASES: tuple[ReplicaBasis, ...] = get_args(ReplicaBasis)

# Routing and the remote-row measure test "does worker w hold this id" as bit w of a uint64.
MAX_WORKERS = 64


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _as_id_set(values: np.ndarray, name: str) -> np.ndarray:
    ids = np.ascontiguousarray(values, dtype=np.int64).ravel()
    if ids.size > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        raise ValueError(f"{name} must be sorted and unique")
    return _frozen(ids)


def check_replica_basis(basis: str) -> None:
    """Refuse a replica budget basis other than :data:`REPLICA_BASES`."""
    if basis not in REPLICA_BASES:
        raise ValueError(f"replica_basis must be {' or '.join(map(repr, REPLICA_BASES))}, "
                         f"not {basis!r}")


def find_sorted(sorted_set: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Position of each of ``values`` in a sorted unique array, -1 where absent (binary search,
    any shape; numpy's search is fastest when ``values`` come sorted too)."""
    if sorted_set.size == 0:
        return np.full(np.shape(values), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_set, values), sorted_set.size - 1)
    return np.where(sorted_set[pos] == values, pos, -1)


def _isin_sorted(sorted_set: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Membership of ``values`` in a sorted unique array (binary search, any shape)."""
    return find_sorted(sorted_set, values) >= 0


@dataclass(frozen=True, eq=False)
class WindowGraph:
    """The access window as a bipartite graph in CSR form: sample -> the feature ids it contains.

    Attributes:
        indptr: int64 ``[n_samples + 1]``; sample ``i`` has ids ``indices[indptr[i]:indptr[i+1]]``.
        indices: int64 feature ids.
        weights: Optional float64 ``[n_samples]``, a weight per sample (e.g. ``decay ** age``, so
            recent samples count more). The decayed access count of an id is then the summed
            weight of the samples that contain it, so per-id counts need not travel separately.
            ``None`` means every sample weighs 1.
        start: Optional stream position of the first sample (records consumed before it).
            Consecutive windows of one stream then tell an incremental partitioner which samples
            are new since its last call, so it can reuse the work it did on the overlap.
    """

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray | None = None
    start: int | None = None

    def __post_init__(self) -> None:
        indptr = _frozen(np.ascontiguousarray(self.indptr, dtype=np.int64))
        indices = _frozen(np.ascontiguousarray(self.indices, dtype=np.int64))
        if indptr.ndim != 1 or indptr.size == 0 or indptr[0] != 0 or indptr[-1] != indices.size:
            raise ValueError("indptr must start at 0 and end at len(indices)")
        if indptr.size > 1 and bool(np.any(np.diff(indptr) < 0)):
            raise ValueError("indptr must be non-decreasing")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)
        if self.weights is not None:
            weights = _frozen(np.ascontiguousarray(self.weights, dtype=np.float64))
            if weights.shape != (indptr.size - 1,):
                raise ValueError("weights must have one entry per sample")
            if bool(np.any(weights < 0)):
                raise ValueError("weights must be non-negative")
            object.__setattr__(self, "weights", weights)
        if self.start is not None and self.start < 0:
            raise ValueError("start must be non-negative")

    @classmethod
    def from_dense(cls, ids: np.ndarray, weights: np.ndarray | None = None,
                   start: int | None = None) -> WindowGraph:
        """Build a window from a dense ``[n_samples, n_fields]`` id matrix (one id per field)."""
        dense = np.ascontiguousarray(ids, dtype=np.int64)
        if dense.ndim != 2:
            raise ValueError("ids must be two-dimensional")
        n, f = dense.shape
        return cls(np.arange(n + 1, dtype=np.int64) * f, dense.ravel(), weights, start)

    @property
    def num_samples(self) -> int:
        """Number of samples in the window."""
        return int(self.indptr.size - 1)

    def sample_of_entry(self) -> np.ndarray:
        """int64 array mapping each entry of ``indices`` to its sample."""
        return np.repeat(np.arange(self.num_samples, dtype=np.int64), np.diff(self.indptr))

    def sample_weights(self) -> np.ndarray:
        """Per-sample weights, ones when the window carries none."""
        if self.weights is None:
            return np.ones(self.num_samples, dtype=np.float64)
        return np.asarray(self.weights)

    def tail(self, count: int) -> WindowGraph:
        """The last ``count`` samples as a window of their own (weights kept)."""
        count = max(0, min(count, self.num_samples))
        start = self.num_samples - count
        base = self.indptr[start]
        weights = None if self.weights is None else self.weights[start:]
        position = None if self.start is None else self.start + start
        return WindowGraph(self.indptr[start:] - base, self.indices[base:], weights, position)


@dataclass(frozen=True, eq=False)
class Placement:
    """Who owns each embedding row and who holds replicas of it.

    Ids listed in ``ids`` have the owner in ``owners``; any other id (never seen by a partitioner)
    belongs to ``default_owner(id, num_workers)``, so new ids need no coordination. A worker
    never holds a replica of a row it owns.

    Attributes:
        version: Monotonic version of the placement.
        num_workers: Number of workers.
        ids: Sorted unique int64 ids placed explicitly.
        owners: int32 owner of each of ``ids``.
        replicas: One sorted unique int64 array per worker: the rows replicated there.
    """

    version: int
    num_workers: int
    ids: np.ndarray = field(default_factory=lambda: _EMPTY_IDS)
    owners: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    replicas: tuple[np.ndarray, ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.num_workers <= MAX_WORKERS:
            raise ValueError(f"num_workers must lie in 1..{MAX_WORKERS} (holder masks are "
                             f"64-bit), got {self.num_workers}")
        ids = _as_id_set(self.ids, "ids")
        owners = _frozen(np.ascontiguousarray(self.owners, dtype=np.int32).ravel())
        if owners.shape != ids.shape:
            raise ValueError("owners must have one entry per id")
        if owners.size and (int(owners.min()) < 0 or int(owners.max()) >= self.num_workers):
            raise ValueError("owners out of range")
        replicas = self.replicas or tuple(_EMPTY_IDS for _ in range(self.num_workers))
        if len(replicas) != self.num_workers:
            raise ValueError("replicas needs one id array per worker")
        frozen_replicas = tuple(_as_id_set(r, "replicas") for r in replicas)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "owners", owners)
        object.__setattr__(self, "replicas", frozen_replicas)
        for worker, rep in enumerate(frozen_replicas):
            if rep.size and bool(np.any(self.owner_of(rep) == worker)):
                raise ValueError(f"worker {worker} replicates rows it owns")

    def __getstate__(self) -> dict[str, object]:
        # The routing index is rebuilt where needed, not shipped: a placement handed to the
        # partitioner process or another rank travels as its arrays only.
        state = dict(self.__dict__)
        state.pop("_holder_table", None)
        return state

    @classmethod
    def hash(cls, num_workers: int, version: int = 0) -> Placement:
        """The hash placement (row-wise sharding as in TorchRec/HugeCTR): no explicit ids."""
        return cls(version=version, num_workers=num_workers)

    def owner_of(self, ids: np.ndarray) -> np.ndarray:
        """Owner of each id (vectorised; any shape): explicit owner, else the default owner."""
        query = np.asarray(ids, dtype=np.int64)
        result = default_owner(query, self.num_workers)
        pos = find_sorted(self.ids, query)
        hit = pos >= 0
        result[hit] = self.owners[pos[hit]]
        return result

    def is_replicated(self, worker: int, ids: np.ndarray) -> np.ndarray:
        """Whether ``worker`` holds a replica of each id (bool array, shape of ``ids``)."""
        return _isin_sorted(self.replicas[worker], np.asarray(ids, dtype=np.int64))

    def holds(self, worker: int, ids: np.ndarray) -> np.ndarray:
        """Whether ``worker`` owns or replicates each id (bool array, shape of ``ids``)."""
        query = np.asarray(ids, dtype=np.int64)
        return (self.owner_of(query) == worker) | self.is_replicated(worker, query)

    def rows_owned(self) -> np.ndarray:
        """Explicitly placed rows owned by each worker (int64 ``[num_workers]``)."""
        return np.bincount(self.owners, minlength=self.num_workers).astype(np.int64)

    def replica_counts(self) -> np.ndarray:
        """Replicas held by each worker (int64 ``[num_workers]``)."""
        return np.array([r.size for r in self.replicas], dtype=np.int64)

    @cached_property
    def _holder_table(self) -> IdIndex | None:
        """Hash index from every id placed or replicated to its holder mask (as int64)."""
        sizes = [r.size for r in self.replicas]
        if not self.ids.size and not sum(sizes):
            return None
        rep_ids = np.concatenate(self.replicas) if sum(sizes) else _EMPTY_IDS
        rep_worker = np.repeat(np.arange(self.num_workers, dtype=np.uint64), sizes)
        keys = np.union1d(self.ids, rep_ids)
        masks = np.left_shift(np.uint64(1), self.owner_of(keys).astype(np.uint64))
        np.bitwise_or.at(masks, np.searchsorted(keys, rep_ids),
                         np.left_shift(np.uint64(1), rep_worker))
        index = IdIndex(4 * keys.size)  # load <= 1/4: most probes end at the first bucket
        index.insert(keys, masks.view(np.int64))
        return index

    def inherit_holders(self, previous: Placement, changed: np.ndarray) -> None:
        """Take ``previous``'s routing index with the entries of ``changed`` recomputed, instead
        of building one: for the placements a migration steps through, which have the same ids
        and replica sets as the one before except at the chunk just moved.

        Rebuilding cost every migrating step 19 ms at 36k placed ids (the index of
        :meth:`holders`); the copy with the chunk's entries recomputed costs about 3.5 ms.
        Nothing happens when ``previous`` built no index (this one is built when first used).
        """
        table = previous.__dict__.get("_holder_table")
        if table is None:
            return
        keys = np.asarray(changed, dtype=np.int64)
        masks = np.left_shift(np.uint64(1), self.owner_of(keys).astype(np.uint64))
        for worker, rep in enumerate(self.replicas):
            if rep.size:
                masks[_isin_sorted(rep, keys)] |= np.uint64(1) << np.uint64(worker)
        index = table.copy()
        index.assign(keys, masks.view(np.int64))
        self.__dict__["_holder_table"] = index

    def holders(self, ids: np.ndarray) -> np.ndarray:
        """Which workers hold (own or replicate) each id, for per-step routing of whole batches.

        One hash probe per entry, whose one gather brings the id's mask: no sort of the batch
        (``owner_of``'s binary search wants its queries deduplicated to be cheap, and
        deduplicating costs more than the probe).

        Args:
            ids: int64 ids, any shape (flattened).

        Returns:
            uint64 mask of each id: bit ``w`` is set where worker ``w`` owns or replicates it.
        """
        flat = np.ascontiguousarray(ids, dtype=np.int64).ravel()
        hashed = fmix64(flat)
        index = self._holder_table
        if index is None:
            masks, found = np.zeros(flat.size, dtype=np.int64), np.zeros(flat.size, dtype=bool)
        else:
            masks, found = index.lookup(flat, hashed)
        masks = masks.view(np.uint64)
        unseen = np.flatnonzero(~found)
        if unseen.size:
            owner = default_owner(flat[unseen], self.num_workers, hashed[unseen])
            masks[unseen] = np.left_shift(np.uint64(1), owner.astype(np.uint64))
        return masks

    @staticmethod
    def held_by(worker: np.ndarray | int, masks: np.ndarray) -> np.ndarray:
        """Whether ``worker`` (one, or one per entry) is among the holders in ``masks``."""
        shift = np.asarray(worker).astype(np.uint64)
        return (masks >> shift) & np.uint64(1) == np.uint64(1)

    def with_version(self, version: int) -> Placement:
        """The same placement under another version number."""
        return Placement(version, self.num_workers, self.ids, self.owners, self.replicas)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placement):
            return NotImplemented
        return (
            self.version == other.version
            and self.num_workers == other.num_workers
            and np.array_equal(self.ids, other.ids)
            and np.array_equal(self.owners, other.owners)
            and all(np.array_equal(a, b) for a, b in zip(self.replicas, other.replicas))
        )

    __hash__ = None  # type: ignore[assignment]  # arrays inside: equal values, no stable hash


@dataclass(frozen=True, eq=False)
class MigrationPlan:
    """The difference between two placements, with what it costs to carry out.

    ``moved_ids`` are the rows whose effective owner changes (``src`` -> ``dst``); they are what
    the trainer transfers (row, optimizer state, version). ``assign_ids``/``assign_owners`` and
    ``release_ids`` describe the change of the explicit id table itself (an id may enter the table
    on the owner it already had by default, which moves nothing), so that ``apply`` rebuilds the
    new placement exactly.

    Attributes:
        from_version: Version of the old placement.
        to_version: Version of the new placement.
        num_workers: Number of workers (equal in both placements).
        row_bytes: Bytes per row used for the byte counts.
        moved_ids: Sorted int64 ids that change owner.
        src: int32 old owner of each moved id.
        dst: int32 new owner of each moved id.
        assign_ids: Sorted int64 ids whose explicit entry is added or changed.
        assign_owners: int32 new explicit owner of each of ``assign_ids``.
        release_ids: Sorted int64 ids dropped from the explicit table (back to the default).
        replica_adds: Per worker, sorted ids that become replicas there.
        replica_drops: Per worker, sorted ids that stop being replicas there.
    """

    from_version: int
    to_version: int
    num_workers: int
    row_bytes: int
    moved_ids: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    assign_ids: np.ndarray
    assign_owners: np.ndarray
    release_ids: np.ndarray
    replica_adds: tuple[np.ndarray, ...]
    replica_drops: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        for name in ("moved_ids", "assign_ids", "release_ids"):
            object.__setattr__(self, name, _as_id_set(getattr(self, name), name))
        for name in ("src", "dst", "assign_owners"):
            object.__setattr__(self, name, _frozen(np.ascontiguousarray(getattr(self, name),
                                                                        dtype=np.int32)))
        if not (self.src.shape == self.dst.shape == self.moved_ids.shape):
            raise ValueError("src and dst need one entry per moved id")
        if self.assign_owners.shape != self.assign_ids.shape:
            raise ValueError("assign_owners needs one entry per assigned id")
        for name in ("replica_adds", "replica_drops"):
            arrays = tuple(_as_id_set(a, name) for a in getattr(self, name))
            if len(arrays) != self.num_workers:
                raise ValueError(f"{name} needs one array per worker")
            object.__setattr__(self, name, arrays)

    @property
    def rows_moved(self) -> int:
        """Rows that change owner."""
        return int(self.moved_ids.size)

    @property
    def bytes_moved(self) -> int:
        """Bytes of the rows that change owner."""
        return self.rows_moved * self.row_bytes

    @property
    def replica_rows_added(self) -> int:
        """Replica copies to ship (summed over workers)."""
        return int(sum(a.size for a in self.replica_adds))

    @property
    def total_bytes(self) -> int:
        """Bytes of moved rows plus new replica copies."""
        return (self.rows_moved + self.replica_rows_added) * self.row_bytes

    def sends(self, worker: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``worker`` gives away: (ids, destination worker of each)."""
        mask = self.src == worker
        return self.moved_ids[mask], self.dst[mask]

    def receives(self, worker: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``worker`` takes over: (ids, source worker of each)."""
        mask = self.dst == worker
        return self.moved_ids[mask], self.src[mask]

    def apply(self, old: Placement) -> Placement:
        """The new placement: ``plan_diff(a, b).apply(a) == b``.

        Raises:
            ValueError: If ``old`` is not the placement the plan was computed from.
        """
        if old.version != self.from_version or old.num_workers != self.num_workers:
            raise ValueError("plan does not start from this placement")
        drop = _isin_sorted(self.release_ids, old.ids) | _isin_sorted(self.assign_ids, old.ids)
        ids = np.concatenate([old.ids[~drop], self.assign_ids])
        owners = np.concatenate([old.owners[~drop], self.assign_owners])
        order = np.argsort(ids, kind="stable")
        replicas = []
        for worker in range(self.num_workers):
            kept = old.replicas[worker]
            kept = kept[~_isin_sorted(self.replica_drops[worker], kept)]
            replicas.append(np.union1d(kept, self.replica_adds[worker]).astype(np.int64))
        return Placement(self.to_version, self.num_workers, ids[order], owners[order],
                         tuple(replicas))


@dataclass(frozen=True)
class PartitionConfig:
    """Settings shared by the partitioners (the incremental one reads the last four too).

    Attributes:
        num_workers: Number of workers.
        epsilon: Balance tolerance: samples per worker per step and rows owned per worker stay
            within ``(1 + epsilon)`` of the mean.
        global_batch: Samples per training step over all workers; sets the per-worker batch in
            the soft count of fetches (lookups are deduplicated within a batch).
        replica_fraction: Replica budget per worker, as a fraction of the rows counted by
            ``replica_basis``.
        replica_basis: ``"window"`` (the default): every worker may copy ``replica_fraction`` of
            all the distinct rows of the access window, as HET-GMP counts its 1% (of the
            embedding table: in ``hetgmp bench partition --offline`` the window is the whole
            table) and as a cache sized against the table would. ``"touched"``: a fraction of
            the rows the worker's own samples touch, a share q of the window's rows, so 1/q
            times fewer copies (q was 0.42 at 4 workers and 0.27 at 8 on 500k records).
        min_count: Ids used by fewer window samples are not placed (they keep their current or
            default owner): one sighting says nothing about where an id's future samples go.
        hub_per_step: Ids used by more than this many samples per step are hubs: in every batch of
            every worker that uses them, so the cut cannot save them; they stay out of the METIS
            graph and are replicated or given to their heaviest user afterwards.
        metis_edges: Most (sample, id) edges the full partition hands METIS (0: no cap). A
            larger window's graph is cut to a uniform sample of its samples and the rows the
            sample misses are placed by an alternating greedy pass over the whole window
            (``partitioner.greedy``): METIS's time grows with its edges and was 12 of the 16 s
            of a 500k x 26 window's partition; its memory too (about 110 bytes an edge, beside
            an input of 40). 1.1M rather than 1.25M: the same remote rows offline on 500k x 26
            within the seeds' spread (METIS seeds 0-3, 4 and 8 workers, both budgets: the mean
            0.4-1.2 points better at 1.1M, each seed's spread 2-5 points), 0.5 s less and a
            fresh process's peak 438-456 MB instead of 485-493.
        seed: Seed for METIS and every tie-break.
        rounds: Refinement rounds of the incremental partitioner.
        migration_cost: Fetches (in soft batches over the window) a move must save to be made;
            one row move costs about one fetch of the row and its optimizer state.
        max_move_fraction: Cap on the rows the incremental partitioner moves per call to improve
            the placement, as a fraction of the distinct ids in the samples it looks at; row
            balancing, a constraint, moves what it must on top.
        route_rounds: The routing the trainer trains with, a global batch at a time:
            ``partitioner.route`` (0) or ``route_batch`` with this many rounds. An incremental
            pass is kept only if, routed this way, the samples it looked at fetch no more rows
            under its placement than under the current one.
        compare_from: From this many workers up (0: never), the full partition also runs
            HET-GMP's own algorithm (``partitioner.hetgmp``: a random start, then alternating
            greedy passes over samples and ids on the soft counts) and keeps whichever of the
            two fetches fewer rows under ``route_rounds`` on the window (a spread of its
            batches). METIS with our edge weights leads at 4 and 8 workers on every shape
            measured, and falls behind on community shapes from 16: 500k x 26 segments, 1.95 /
            1.77 remote rows a sample at 16 workers (ours / HET-GMP's), 2.22 / 1.65 at 32; on
            user-item shapes ours stays ahead (100k, 32 workers: 64.3% / 57.1% fewer than
            hash), hence a comparison, not a switch. It costs the second partition's time
            (500k at 16 / 32 workers: 8.9 / 10.0 s beside METIS's 4.7 / 7.6 s).
    """

    num_workers: int
    epsilon: float = 0.05
    global_batch: int = 8192
    replica_fraction: float = 0.01
    replica_basis: ReplicaBasis = "window"
    min_count: int = 2
    hub_per_step: float = 20.0
    metis_edges: int = 1_100_000
    seed: int = 0
    rounds: int = 3
    migration_cost: float = 1.0
    max_move_fraction: float = 0.1
    route_rounds: int = 0
    compare_from: int = 16

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.global_batch < 1 or self.rounds < 0:
            raise ValueError("num_workers and global_batch must be positive, rounds >= 0")
        if self.route_rounds < 0 or self.compare_from < 0:
            raise ValueError("route_rounds and compare_from must be >= 0")
        if self.epsilon < 0 or not 0 <= self.replica_fraction <= 1:
            raise ValueError("epsilon must be >= 0 and replica_fraction in [0, 1]")
        check_replica_basis(self.replica_basis)
        if self.metis_edges < 0:
            raise ValueError("metis_edges must be >= 0 (0: no cap)")
        if self.min_count < 1 or self.max_move_fraction < 0 or self.migration_cost < 0:
            raise ValueError("min_count >= 1, max_move_fraction >= 0, migration_cost >= 0")

    @property
    def batch_per_worker(self) -> float:
        """Samples per worker per step."""
        return self.global_batch / self.num_workers


@dataclass(frozen=True)
class PassReport:
    """What one incremental pass looked at and how many rows each of its steps moved.

    The three improving steps share the budget (``max_move_fraction`` of ``ids``); row balance
    is a constraint and moves what it must on top, so ``moved`` can exceed the budget. A row
    moved by two steps counts in both.

    Attributes:
        new_samples: Window samples the pass looked at (the ones added since the last pass).
        ids: Distinct ids of those samples.
        budget: Rows the improving steps could move.
        regroup: Rows moved to regroup scattered communities.
        group_balance: Rows moved in whole groups off overloaded workers.
        refine: Rows moved by the greedy refinement rounds.
        row_balance: Rows moved to keep rows owned within ``(1 + epsilon)`` of the mean.
    """

    #: The steps of a pass, in order: the fields that count its row moves.
    STEPS: ClassVar[tuple[str, ...]] = ("regroup", "group_balance", "refine", "row_balance")

    new_samples: int
    ids: int
    budget: int
    regroup: int = 0
    group_balance: int = 0
    refine: int = 0
    row_balance: int = 0
    #: The pass's placement fetched more on the samples it looked at than the current one
    #: (by the soft count), so the current placement was kept and nothing moved.
    kept_current: bool = False

    def moves_by_step(self) -> dict[str, int]:
        """Rows moved by each step, keyed by :attr:`STEPS`."""
        return {step: getattr(self, step) for step in self.STEPS}

    @property
    def moved(self) -> int:
        """Rows moved by every step together."""
        return sum(self.moves_by_step().values())

    def describe(self) -> str:
        """One line for a log: the moves by step, against the budget."""
        if self.kept_current:
            return (f"pass over {self.new_samples} new samples kept the current placement "
                    f"(its own would fetch more)")
        return (f"{self.moved} row move(s) over {self.new_samples} new samples: regroup "
                f"{self.regroup}, group balance {self.group_balance}, refine {self.refine} "
                f"(budget {self.budget}), row balance {self.row_balance} (outside the budget)")


@runtime_checkable
class Partitioner(Protocol):
    """Computes a placement from the access window, optionally starting from the current one."""

    def partition(self, window: WindowGraph, current: Placement | None) -> Placement:
        """Return the next placement (version ``current.version + 1``, or 0 without one)."""
        ...
