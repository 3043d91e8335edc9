"""The records the partition benchmarks score: ids as a CSR of samples, and the same records
with their ids numbered densely (``hetgmp bench partition --numbering dense``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetgmp.partitioner import WindowGraph
from hetgmp.streaming.synthetic import SyntheticBlock, SyntheticStream

__all__ = ["dense_records"]


@dataclass(frozen=True)
class _Records:
    """Records' ids as a CSR (sample ``i`` reads ``values[indptr[i]:indptr[i + 1]]``): a
    record of lists reads many."""

    indptr: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, stream: SyntheticStream, block: SyntheticBlock) -> _Records:
        return cls(*stream.sample_csr(block))

    @classmethod
    def of_dense(cls, ids: np.ndarray) -> _Records:
        """One id a field: ``ids`` ``[n, F]``."""
        n, f = ids.shape
        return cls(np.arange(n + 1, dtype=np.int64) * f, ids.reshape(-1))

    def __len__(self) -> int:
        return int(self.indptr.size - 1)

    def __getitem__(self, rows: slice) -> _Records:
        lo, hi, _ = rows.indices(len(self))
        hi = max(hi, lo)
        first = self.indptr[lo]
        return _Records(self.indptr[lo:hi + 1] - first, self.values[first:self.indptr[hi]])

    @property
    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        return self.indptr, self.values

    def graph(self, start: int | None = None) -> WindowGraph:
        return WindowGraph(self.indptr, self.values, start=start)

    @property
    def ids_per_record(self) -> float:
        return self.values.size / max(len(self), 1)


def dense_records(stream: SyntheticStream, block: SyntheticBlock, seed: int
                  ) -> tuple[_Records, np.ndarray]:
    """The block's records with ids numbered densely and the records shuffled: ``(records,
    order)``, record ``i`` being the block's ``order[i]``.

    Each table's ids follow the previous table's, its values numbered by their rank in the
    field's global popularity (the generator scatters ranks over the vocabulary by ``rank *
    7919 + 13 mod V``; this undoes it), the empty value last; slots and bags as the decoder's
    hashed ids have them (:meth:`SyntheticStream.sparse`).
    """
    tables = stream.schema.tables
    owner = np.array([tables.index(t) for t in tables], np.int64)
    vocab = np.asarray(stream.vocab, np.int64)
    # A table's ids are its first field's values and the empty value.
    sizes = np.where(owner == np.arange(owner.size), vocab + 1, 0)
    offset = (np.cumsum(sizes) - sizes)[owner]
    slot_field = stream.slot_field
    v = vocab[owner[slot_field]]
    values = block.values.astype(np.int64)
    if stream.config.shape in ("segments", "multi_hot"):
        inverse = np.array([pow(7919, -1, int(x)) if x > 1 else 0 for x in v], np.int64)
        values = ((values - 13) % v) * inverse % v
    slot_ids = offset[slot_field] + np.where(block.missing[:, slot_field], v, values)
    hashed, lengths = stream.sparse(block)
    listed = stream.bags > 1
    if listed.any():
        empty = block.missing & listed
        flat = slot_ids[~empty[:, slot_field]]
    else:
        flat = slot_ids.reshape(-1)
    if flat.size != hashed.size:
        raise AssertionError("dense numbering lost the decoder's layout")
    indptr = np.zeros(len(block) + 1, np.int64)
    np.cumsum(lengths.sum(axis=1, dtype=np.int64), out=indptr[1:])
    order = np.random.default_rng(seed).permutation(len(block))
    counts = np.diff(indptr)[order]
    starts = indptr[:-1][order]
    out_ptr = np.zeros_like(indptr)
    np.cumsum(counts, out=out_ptr[1:])
    take = np.repeat(starts - out_ptr[:-1], counts) + np.arange(int(out_ptr[-1]))
    return _Records(out_ptr, flat[take]), order
