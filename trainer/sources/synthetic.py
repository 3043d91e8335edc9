"""A rank's share of the synthetic stream, from memory.

Records ``start .. start+records-1`` are materialised up front (so generation is not timed as
training). Global batch ``t`` is records ``start + t*B .. start + (t+1)*B - 1``; rank ``r`` of
``N`` takes the ``r``-th of ``N`` contiguous slices of it. The concatenation over ranks is the
global batch, in order, which is what single-process training is compared against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetgmp.streaming import ClickBatch, SyntheticConfig, SyntheticStream
from hetgmp.trainer.sources.base import Resume, Source

__all__ = ["SyntheticShard", "SyntheticSpec", "shard_bounds", "synthetic_batch"]

_GEN_CHUNK = 65_536


def synthetic_batch(stream: SyntheticStream, start: int, count: int) -> ClickBatch:
    """Records ``start .. start+count-1`` of the synthetic stream as the decoder would give them."""
    block = stream.take(start, count)
    dense = np.log1p(np.maximum(block.dense, 0).astype(np.float64)).astype(np.float32)
    values, lengths = stream.sparse(block)
    unknown = np.full(count, -1, np.int64)
    return ClickBatch(block.labels.astype(np.float32), dense, values, lengths,
                      unknown.astype(np.int32), unknown, unknown.copy())


def shard_bounds(batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``batch_size`` that rank ``rank`` takes."""
    return rank * batch_size // world, (rank + 1) * batch_size // world


@dataclass(frozen=True)
class SyntheticSpec:
    """An in-memory share of the synthetic stream."""

    config: SyntheticConfig = field(default_factory=SyntheticConfig)
    start: int = 0
    records: int = 100_000

    def __post_init__(self) -> None:
        if self.start < 0 or self.records < 0:
            raise ValueError(f"a synthetic range needs start >= 0 and records >= 0, got "
                             f"start {self.start}, records {self.records}")

    def remaining(self, resume: Resume | None, max_records: int = 0) -> SyntheticSpec:
        """The range a run still has to train: past the records a checkpoint holds, and within
        a record budget over the whole run (``max_records``, 0 = none)."""
        skip = resume.records if resume is not None else 0
        budget = self.records - skip
        if max_records:
            budget = min(budget, max_records - skip)
        return SyntheticSpec(self.config, self.start + skip, max(budget, 0))


class SyntheticShard(Source):
    """This rank's slices of the global batches over a range of the synthetic stream."""

    def __init__(self, spec: SyntheticSpec, global_batch: int, rank: int, world: int) -> None:
        self.spec = spec
        self.schema = spec.config.schema
        stream = SyntheticStream(spec.config)
        self._steps = -(-spec.records // global_batch)
        parts: list[ClickBatch] = []
        end = spec.start + spec.records
        for lo in range(spec.start, end, _GEN_CHUNK):
            chunk = synthetic_batch(stream, lo, min(_GEN_CHUNK, end - lo))
            pos = np.arange(lo, lo + len(chunk)) - spec.start
            step, offset = pos // global_batch, pos % global_batch
            size = np.minimum(global_batch, spec.records - step * global_batch)
            mine = (offset >= rank * size // world) & (offset < (rank + 1) * size // world)
            parts.append(chunk.take(np.flatnonzero(mine)))
        self._data = ClickBatch.concat(parts) if parts else ClickBatch.empty(self.schema)
        sizes = [min(global_batch, spec.records - t * global_batch) for t in range(self.steps)]
        local = [shard_bounds(s, rank, world) for s in sizes]
        self._bounds = np.cumsum([0] + [hi - lo for lo, hi in local])
        self._next = 0

    @property
    def steps(self) -> int:
        """Global batches in the range."""
        return self._steps

    @property
    def exhausted(self) -> bool:
        """Every batch has been handed out."""
        return self._next >= self.steps

    def upcoming_ids(self) -> np.ndarray:
        """The ids of this rank's share of the next global batch."""
        if self.exhausted:
            return np.zeros(0, np.int64)
        lo, hi = self._bounds[self._next], self._bounds[self._next + 1]
        return self._data.take(slice(int(lo), int(hi))).values

    def next_batch(self, cap: int | None = None) -> ClickBatch:
        """This rank's share of the next global batch (empty once exhausted; ``cap`` is
        ignored: the range is the budget, see :meth:`SyntheticSpec.remaining`)."""
        if self.exhausted:
            return ClickBatch.empty(self.schema)
        lo, hi = self._bounds[self._next], self._bounds[self._next + 1]
        self._next += 1
        return self._data.take(slice(int(lo), int(hi)))
