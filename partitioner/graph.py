"""Window statistics shared by the partitioners: compact id numbering, access counts, soft cost.

Private to the package (not exported): the partitioners build on it, users see only placements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hetgmp.partitioner.routing import assign_with_capacity, capacity_of, sample_sizes
from hetgmp.partitioner.types import WindowGraph

__all__ = [
    "CompactWindow",
    "compact",
    "dense_numbering",
    "renumber",
    "pair_counts",
    "pair_key",
    "local_counts_compact",
    "per_worker_counts",
    "route_compact",
    "sample_scores",
    "soft_batches",
]


@dataclass(frozen=True, eq=False)
class CompactWindow:
    """A window with its ids renumbered 0..G-1.

    Attributes:
        ids: Sorted distinct int64 ids of the window (G).
        entry_id: Compact id of each CSR entry.
        entry_sample: Sample of each CSR entry.
        sample_weight: Weight of each sample.
        degree: Weighted number of samples using each id (its decayed access count).
        num_samples: Samples in the window.
        indptr: The window's CSR row pointers (sample ``i``'s entries are
            ``indptr[i]:indptr[i+1]`` of ``entry_id``).
    """

    ids: np.ndarray
    entry_id: np.ndarray
    entry_sample: np.ndarray
    sample_weight: np.ndarray
    degree: np.ndarray
    num_samples: int
    indptr: np.ndarray

    @property
    def num_ids(self) -> int:
        """Distinct ids in the window."""
        return int(self.ids.size)


def dense_numbering(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` by hashing instead of sorting every entry.

    Arrow's dictionary encoding numbers the distinct values in one hash pass; only the distinct
    values are then sorted and the codes renumbered to their rank. On the 13M entries of a
    500k x 26 window (276k distinct ids): 0.37 s against 3.1 s for ``np.unique``.
    """
    values = np.ascontiguousarray(values, dtype=np.int64)
    if values.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    encoded = pa.array(values).dictionary_encode()
    distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(distinct, kind="stable")
    rank = np.empty(order.size, dtype=np.int32 if order.size < 2**31 else np.int64)
    rank[order] = np.arange(order.size)
    numbered = rank[codes]
    del encoded, codes
    # Arrow's allocator keeps freed blocks for reuse; hand the hash table's back now.
    pa.default_memory_pool().release_unused()
    return distinct[order], numbered


def renumber(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The position of each of ``values`` in ``ids``, the sorted distinct values they come from.

    ``dense_numbering``'s numbering again, once the distinct values are known: one hash probe
    per value (Arrow's ``index_in``; 0.2 s for 13M entries against 276k ids), int32.
    """
    found = pc.index_in(pa.array(np.ascontiguousarray(values, dtype=np.int64)),
                        value_set=pa.array(ids))
    if found.null_count:
        raise ValueError("renumber: a value is not among the ids")
    numbered = found.to_numpy(zero_copy_only=False)
    del found
    pa.default_memory_pool().release_unused()
    return numbered


def pair_key(row: np.ndarray, width: int, column: np.ndarray) -> np.ndarray:
    """``row * width + column`` as int64 (entry arrays may be int32), for a ``bincount``."""
    key = np.multiply(row, width, dtype=np.int64)
    key += column
    return key


def compact(window: WindowGraph, ids: np.ndarray | None = None) -> CompactWindow:
    """Renumber the window's ids densely and count their (weighted) accesses.

    The entry arrays are int32 when the window's samples and ids fit (they are the bulk of a
    partition's memory: 13M entries for 500k x 26); keys built from them go through
    ``pair_key``. ``ids``, the window's sorted distinct ids when a caller already has them
    (an earlier ``compact`` of the same window), make the numbering a probe of them.
    """
    if ids is None:
        ids, entry_id = dense_numbering(window.indices)
    else:
        entry_id = renumber(window.indices, ids)
    small = max(window.num_samples, ids.size) < np.iinfo(np.int32).max
    index = np.int32 if small else np.int64
    entry_id = entry_id.astype(index, copy=False)
    entry_sample = np.repeat(np.arange(window.num_samples, dtype=index), np.diff(window.indptr))
    sample_weight = window.sample_weights()
    weights = None if window.weights is None else sample_weight[entry_sample]
    degree = np.bincount(entry_id, weights=weights, minlength=ids.size).astype(np.float64)
    del weights
    return CompactWindow(ids, entry_id, entry_sample, sample_weight, degree,
                         window.num_samples, window.indptr)


# Entries handled at a time by the counting loops below. Their temporaries (a gathered column,
# an int64 pair key, weights) are a few bytes per entry: counted over all 13M entries of a
# 500k x 26 window at once they took ~280 MB above the window; in slices of 4M, ~100 MB; in
# slices of 1M, a full partition's routing at 8 workers peaks at 461 MB in a fresh process
# where it reached 487-507 MB, at no cost in time that runs could tell apart.
_ENTRY_CHUNK = 1 << 20


def _entry_slices(cw: CompactWindow) -> list[slice]:
    size = int(cw.entry_id.size)
    return [slice(lo, min(lo + _ENTRY_CHUNK, size)) for lo in range(0, size, _ENTRY_CHUNK)]


def per_worker_counts(cw: CompactWindow, worker_of_sample: np.ndarray,
                      num_workers: int) -> np.ndarray:
    """Weighted accesses of each id from each worker: float64 ``[G, num_workers]``."""
    weight = cw.sample_weight
    weighted = not bool(np.all(weight == 1.0))
    size = cw.num_ids * num_workers
    flat = np.zeros(size, dtype=np.float64)
    for part in _entry_slices(cw):
        samples = cw.entry_sample[part]
        key = pair_key(cw.entry_id[part], num_workers, worker_of_sample[samples])
        flat += np.bincount(key, weights=weight[samples] if weighted else None, minlength=size)
    return flat.reshape(cw.num_ids, num_workers)


def pair_counts(cw: CompactWindow, row_of_sample: np.ndarray, column_of_id: np.ndarray,
                rows: int, columns: int) -> np.ndarray:
    """Entries counted by (their sample's row, their id's column), those with a row and a
    column ``>= 0``: int64 ``[rows, columns]``, in slices of entries (an int64 gather of every
    entry is 104 MB on a 500k x 26 window)."""
    flat = np.zeros(rows * columns, dtype=np.int64)
    for part in _entry_slices(cw):
        row = row_of_sample[cw.entry_sample[part]]
        column = column_of_id[cw.entry_id[part]]
        use = (row >= 0) & (column >= 0)
        flat += np.bincount(pair_key(row[use], columns, column[use]), minlength=flat.size)
    return flat.reshape(rows, columns)


def sample_scores(cw: CompactWindow, column_of_id: np.ndarray, width: int,
                  weight_of_id: np.ndarray | None = None) -> np.ndarray:
    """Per sample, the entries (or their ``weight_of_id``) in each column: ``[S, width]``.

    ``column_of_id`` gives each compact id its column (e.g. its owner). int64 counts without
    weights, float64 with. The entries are in sample order, so each slice of them fills a
    contiguous block of samples.
    """
    dtype = np.int64 if weight_of_id is None else np.float64
    out = np.zeros(cw.num_samples * width, dtype=dtype)
    for part in _entry_slices(cw):
        samples, rows = cw.entry_sample[part], cw.entry_id[part]
        if samples.size == 0:
            continue
        first = int(samples[0])
        key = pair_key(samples - first, width, column_of_id[rows])
        block = np.bincount(key, weights=None if weight_of_id is None else weight_of_id[rows],
                            minlength=(int(samples[-1]) - first + 1) * width)
        out[first * width:first * width + block.size] += block.astype(dtype, copy=False)
    return out.reshape(cw.num_samples, width)


def soft_batches(count: np.ndarray, samples_on_worker: float, batch_per_worker: float) -> np.ndarray:
    """Expected number of a worker's batches that contain an id it accesses ``count`` times.

    HET-GMP's soft count: with M samples on the worker and b per batch, an id used by c of them
    is in ``(M/b) * (1 - (1 - c/M) ** b)`` of its M/b batches. Lookups are deduplicated within a
    batch, so this, not c, is the number of fetches a remote id costs.
    """
    m = max(float(samples_on_worker), 1.0)
    b = max(float(batch_per_worker), 1.0)
    frac = np.clip(np.asarray(count, dtype=np.float64) / m, 0.0, 1.0)
    return (m / b) * -np.expm1(b * np.log1p(-np.minimum(frac, 1.0 - 1e-12)))


def local_counts_compact(cw: CompactWindow, owner: np.ndarray, replica: np.ndarray | None,
                         num_workers: int) -> np.ndarray:
    """Per window sample and worker, how many of its ids the worker holds: int64 ``[S, N]``.

    Works on compact ids (a gather per entry instead of a binary search), which is what makes a
    routing pass over a 5M-entry window cost tens of milliseconds.

    Args:
        cw: The compacted window.
        owner: Owner of each compact id.
        replica: Optional bool ``[G, N]``: which workers hold a replica of each compact id.
        num_workers: Number of workers.
    """
    n = num_workers
    scores = sample_scores(cw, owner, n)
    if replica is not None:
        copied = np.any(replica, axis=1)
        for part in _entry_slices(cw):
            rows = cw.entry_id[part]
            hit = copied[rows]
            samples = cw.entry_sample[part][hit]
            held = replica[rows[hit]]
            for worker in range(n):
                scores[:, worker] += np.bincount(samples[held[:, worker]],
                                                 minlength=cw.num_samples)
    return scores


def route_compact(cw: CompactWindow, owner: np.ndarray, replica: np.ndarray | None,
                  num_workers: int, epsilon: float) -> np.ndarray:
    """Route every window sample as ``routing.route`` would, with capacity over the window."""
    scores = local_counts_compact(cw, owner, replica, num_workers)
    sizes = sample_sizes(cw.indptr)
    return assign_with_capacity(scores, capacity_of(sizes, cw.num_samples, num_workers, epsilon),
                                sizes)
