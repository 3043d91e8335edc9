"""Where a rank's samples come from: its share of each global batch, from memory or from Kafka.

Both sources follow one contract: :meth:`next` returns the rank's next batch (possibly empty)
and ``exhausted`` tells whether the source has ended. Ranks keep stepping together (each step
is a collective) until every rank's source has ended.

* :class:`SyntheticShard`: records ``start .. start+records-1`` of the synthetic stream,
  materialised up front (so generation is not timed as training). Global batch ``t`` is records
  ``start + t*B .. start + (t+1)*B - 1``; rank ``r`` of ``N`` takes the ``r``-th of ``N``
  contiguous slices of it. The concatenation over ranks is the global batch, in order, which
  is what single-process training is compared against.
* :class:`KafkaShard`: the :class:`~streaming.consumer.ClickConsumer` on this rank's share of
  the topic's partitions (``p % N == r``, manual assignment: a rank's partitions do not move,
  so its committed offsets match its checkpoints); up to ``B / N`` records per step.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

import numpy as np

from streaming.consumer import ClickConsumer, ConsumerConfig
from streaming.kafka import KafkaSettings, connect_with_retry
from streaming.runtime import Clock, SystemClock
from streaming.synthetic import SyntheticConfig, SyntheticStream
from streaming.types import ClickBatch

__all__ = [
    "KafkaShard",
    "KafkaSpec",
    "SyntheticShard",
    "SyntheticSpec",
    "Source",
    "open_source",
    "shard_bounds",
    "synthetic_batch",
]

log = logging.getLogger(__name__)

_GEN_CHUNK = 65_536


def synthetic_batch(stream: SyntheticStream, start: int, count: int) -> ClickBatch:
    """Records ``start .. start+count-1`` of the synthetic stream as the decoder would give them."""
    block = stream.take(start, count)
    ids = stream.feature_ids(start, count)
    dense = np.log1p(np.maximum(block.dense, 0).astype(np.float64)).astype(np.float32)
    none = np.full(count, -1, np.int64)
    return ClickBatch(block.labels.astype(np.float32), dense, ids, none.astype(np.int32), none,
                      none)


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


@dataclass(frozen=True)
class KafkaSpec:
    """This rank's share of a Kafka topic."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    records: int = 0
    idle_s: float = 10.0
    poll_s: float = 0.2

    def __post_init__(self) -> None:
        if self.records < 0 or not (self.idle_s > 0 and self.poll_s > 0):
            raise ValueError(f"a Kafka source needs records >= 0 (0: until idle) and positive "
                             f"idle and poll times, got records {self.records}, idle "
                             f"{self.idle_s} s, poll {self.poll_s} s")


class SyntheticShard:
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

    def next(self, cap: int | None = None) -> ClickBatch:
        """This rank's share of the next global batch (empty once exhausted; ``cap`` is
        ignored: the range is the budget)."""
        if self.exhausted:
            return ClickBatch.empty(self.schema)
        lo, hi = self._bounds[self._next], self._bounds[self._next + 1]
        self._next += 1
        return self._data.take(slice(int(lo), int(hi)))

    def close(self) -> None:
        """Nothing to release."""


class KafkaShard:
    """This rank's partitions of a topic, ``local_batch`` records per step at most."""

    def __init__(self, spec: KafkaSpec, global_batch: int, rank: int, world: int,
                 clock: Clock | None = None) -> None:
        self.spec = spec
        self._clock = clock or SystemClock()
        self.local_batch = max(1, shard_bounds(global_batch, rank, world)[1]
                               - shard_bounds(global_batch, rank, world)[0])
        partitions = _partitions_of(spec.kafka, spec.consumer, self._clock)
        mine = [p for p in sorted(partitions) if p % world == rank]
        if not mine:
            log.warning("rank %d: no partition of %s (%d partitions, %d ranks)",
                        rank, spec.consumer.topic, len(partitions), world)
        self.partitions = mine
        # A per-rank budget: ranks read disjoint partitions, so shares add up to the total.
        lo, hi = shard_bounds(spec.records, rank, world) if spec.records else (0, 0)
        self._budget = hi - lo if spec.records else None
        self.consumer = ClickConsumer(spec.kafka, spec.consumer, partitions=mine, clock=clock)
        self.schema = self.consumer.schema
        self._buffer: list[ClickBatch] = []
        self._buffered = 0
        self._read = 0
        self._last_data = self._clock.monotonic()
        self._ended = not mine
        # Next offset per partition of the messages whose records have all been handed out,
        # and a snapshot of it after each batch handed out, taken off in order as the batches
        # are trained: ``trained`` is what a checkpoint taken now holds (batches read ahead,
        # e.g. for the warm-up placement, do not count until they are trained).
        self.positions: dict[int, int] = {}
        self.trained: dict[int, int] = {}
        self._handed: collections.deque[dict[int, int]] = collections.deque()
        if mine:
            self.consumer.start()

    @property
    def exhausted(self) -> bool:
        """The record budget is spent or the partitions stayed idle for ``idle_s``."""
        return self._ended and self._buffered == 0

    def seek(self, offsets: dict[int, int]) -> None:
        """Continue this rank's partitions from ``offsets`` (a checkpoint's); others as they are."""
        mine = {p: o for p, o in offsets.items() if p in self.partitions}
        if mine:
            self.consumer.seek(mine)
            self.positions.update(mine)
            self.trained.update(mine)
            log.info("partitions %s continue from offsets %s", sorted(mine), mine)

    def mark_trained(self) -> None:
        """The oldest batch handed out (non-empty) has been trained."""
        if self._handed:
            self.trained = self._handed.popleft()

    def flush_dead_letters(self) -> None:
        """Make sure every dead letter so far is on the broker (before a checkpoint covers
        the records they replace)."""
        self.consumer.flush_dead_letters()

    def commit(self, offsets: dict[int, int]) -> bool:
        """Commit the next offsets of what was trained (after a durable checkpoint).

        A failed commit is logged, not raised: the checkpoint is durable and holds the offsets,
        and a resume seeks to them whatever the group's committed offsets say.
        """
        if not self.spec.consumer.group_id:
            return False  # no consumer group: nothing to commit to
        from kafka.errors import KafkaError

        try:
            return self.consumer.commit(offsets)
        except KafkaError as exc:
            log.warning("commit of offsets %s failed (%s: %s); the checkpoint holds them",
                        offsets, type(exc).__name__, exc)
            return False

    def next(self, cap: int | None = None) -> ClickBatch:
        """Up to ``local_batch`` records, and at most ``cap`` (waits at most ``poll_s`` for more)."""
        want = self.local_batch if cap is None else min(self.local_batch, cap)
        if self._budget is not None:
            if self._read >= self._budget:
                self._spent()
                return ClickBatch.empty(self.schema)
            want = min(want, self._budget - self._read)
        if not self._ended and self._buffered < want:
            got = self.consumer.next_batch(max_records=max(want // 8, 64), timeout=self.spec.poll_s)
            now = self._clock.monotonic()
            if len(got):
                self._buffer.append(got)
                self._buffered += len(got)
                self._last_data = now
            elif now - self._last_data > self.spec.idle_s:
                log.info("partitions %s idle for %.0fs: source ended", self.partitions,
                         self.spec.idle_s)
                self._ended = True
        if not self._buffered or want <= 0:
            return ClickBatch.empty(self.schema)
        data = ClickBatch.concat(self._buffer)
        n = _message_cut(data, want, exact=cap is not None)
        out, rest = data.take(slice(0, n)), data.take(slice(n, None))
        self._buffer = [rest] if len(rest) else []
        self._buffered = len(rest)
        self._read += len(out)
        self._advance(out, rest)
        if len(out):
            self._handed.append(dict(self.positions))
        if self._budget is not None and self._read >= self._budget:
            self._spent()
        return out

    def _spent(self) -> None:
        """The record budget is used up: the source ends, and records polled past it are let go
        (no position covers them, so a resumed run reads them)."""
        self._ended = True
        self._buffer, self._buffered = [], 0

    def _advance(self, out: ClickBatch, rest: ClickBatch) -> None:
        """Move :attr:`positions` past the messages handed out whole."""
        if not len(out):
            return
        parts, offs = out.partitions.astype(np.int64), out.offsets
        last = np.flatnonzero(np.diff(parts, append=-1) != 0)  # last record of each run
        for i in last:
            p, o = int(parts[i]), int(offs[i])
            # A message whose remaining records are still buffered is not done yet.
            split = bool(np.any((rest.partitions == p) & (rest.offsets == o))) if len(rest) else False
            nxt = o if split else o + 1
            if nxt > self.positions.get(p, -1):
                self.positions[p] = nxt

    def close(self) -> None:
        """Stop the consumer (offsets are committed by whoever checkpoints, not here)."""
        self.consumer.stop()


Source = SyntheticShard | KafkaShard


def _message_cut(data: ClickBatch, want: int, exact: bool) -> int:
    """Records to hand out: ``want``, moved back to a message boundary.

    A message packs several records; a checkpoint can only say "every message before offset
    o", so a batch ends where a message ends. If the first message alone is longer than
    ``want``, it goes whole (a batch a few records over size), unless ``exact`` (a record
    budget): then the message is split and resuming replays its first part.
    """
    n = min(want, len(data))
    if n == len(data) or n == 0:
        return n
    p, o = data.partitions, data.offsets
    if p[n] != p[n - 1] or o[n] != o[n - 1]:
        return n
    same = (p == p[n]) & (o == o[n])
    first = int(np.argmax(same))  # records of one message are contiguous
    if first > 0:
        return first
    if exact:
        return n
    return first + int(np.argmin(same[first:])) if not same[first:].all() else len(data)


def open_source(spec: SyntheticSpec | KafkaSpec, global_batch: int, rank: int,
                world: int) -> Source:
    """The source a spec describes, for one rank."""
    if isinstance(spec, SyntheticSpec):
        return SyntheticShard(spec, global_batch, rank, world)
    return KafkaShard(spec, global_batch, rank, world)


def _partitions_of(kafka: KafkaSettings, config: ConsumerConfig, clock: Clock) -> set[int]:
    from kafka import KafkaConsumer

    topic = config.topic
    client = connect_with_retry(lambda: KafkaConsumer(**kafka.client_kwargs()), "metadata",
                                kafka, config.connect_timeout_s, clock)
    try:
        deadline = clock.monotonic() + config.connect_timeout_s
        while True:
            parts = client.partitions_for_topic(topic)
            if parts:
                return set(parts)
            if clock.monotonic() > deadline:
                raise RuntimeError(f"topic {topic!r} not found on {kafka.bootstrap_servers}")
            clock.sleep(1.0)
    finally:
        client.close()
