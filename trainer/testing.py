"""Test doubles of the trainer's contracts, public so that tests and benchmarks share them.

:class:`StreamSource` is an endless click stream that looks like Kafka's to the trainer (offsets
per partition, append times) without a broker: for long runs that check what grows and what
does not.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from streaming import ClickBatch, SyntheticConfig, SyntheticStream
from streaming.runtime import Clock, SystemClock
from trainer.sources import Source, synthetic_batch

__all__ = ["StreamSource"]


class StreamSource(Source):
    """``steps`` batches of ``batch`` records of the synthetic stream, each stamped with the
    clock's time as its append time, in ``partitions`` partitions with increasing offsets.

    Args:
        config: The synthetic stream (a large vocabulary keeps new ids coming).
        batch: Records per batch.
        steps: Batches before the source ends.
        partitions: Partitions the records are spread over, round robin.
        clock: Where append times come from.
    """

    def __init__(self, config: SyntheticConfig, batch: int, steps: int, partitions: int = 4,
                 clock: Clock | None = None) -> None:
        self.schema = config.schema
        self._stream = SyntheticStream(config)
        self._batch, self._steps, self._parts = batch, steps, partitions
        self._clock = clock or SystemClock()
        self._next = 0
        self._handed: list[dict[int, int]] = []
        self._trained: dict[int, int] = {}

    @property
    def exhausted(self) -> bool:
        return self._next >= self._steps

    @property
    def topic(self) -> str:
        return "stream"

    def next_batch(self, cap: int | None = None) -> ClickBatch:
        if self.exhausted:
            return ClickBatch.empty(self.schema)
        start = self._next * self._batch
        b = synthetic_batch(self._stream, start, self._batch)
        index = np.arange(start, start + self._batch)
        partitions = (index % self._parts).astype(np.int32)
        offsets = index // self._parts
        stamps = np.full(self._batch, int(self._clock.time() * 1000), np.int64)
        self._next += 1
        self._handed.append({p: int(offsets[partitions == p].max()) + 1
                             for p in range(self._parts) if (partitions == p).any()})
        return ClickBatch(b.labels, b.dense, b.ids, partitions, offsets, stamps)

    def mark_trained(self) -> None:
        if self._handed:
            self._trained.update(self._handed.pop(0))

    def snapshot(self) -> dict[int, int]:
        return dict(self._trained)

    def commit(self, offsets: Mapping[int, int]) -> bool:
        return True
