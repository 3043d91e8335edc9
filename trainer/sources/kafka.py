"""A rank's partitions of a Kafka topic, read by :class:`hetgmp.streaming.ClickConsumer`.

Rank ``r`` of ``N`` reads the partitions ``p`` with ``p % N == r`` by manual assignment: a rank's
partitions do not move, so its committed offsets match its checkpoints. It hands out up to
``global_batch / N`` records a step.

Offsets are tracked at two levels. ``positions``: the next offset per partition of the messages
whose records have all been handed out (or were all rejected and dead-lettered). ``trained``:
the same, counting only batches the trainer has confirmed (:meth:`KafkaShard.mark_trained`):
what a checkpoint taken now holds. Batches read ahead (the warm-up placement's) do not count
until they are trained.

With ``prefetch_records`` > 0 (the default) the consumer polls and decodes on a thread of its
own (:class:`hetgmp.streaming.prefetch.Prefetcher`), up to that many records ahead of the trainer;
``positions`` still counts only what was handed out, and every call into the consumer (commit,
dead-letter flush) runs on that thread between two polls.

Records go out in event-time order across the rank's partitions (``order="event-time"``, see
:mod:`hetgmp.trainer.sources.order`): a partition that is behind its log holds back records younger
than the newest one read from it (by ``max_skew_s`` at most), until it catches up, sends, or
stays silent for ``_SILENT_S``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, TypeVar

import numpy as np

from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming import (
    ClickBatch,
    ClickConsumer,
    CommitError,
    ConsumerConfig,
    KafkaSettings,
    LogLost,
    Prefetcher,
    topic_partitions,
)
from hetgmp.trainer.sources.base import ResetOffsets, Resume, Source
from hetgmp.trainer.sources.order import EventTimeBuffer
from hetgmp.trainer.sources.synthetic import shard_bounds

__all__ = ["KafkaShard", "KafkaSpec", "message_cut"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# A partition behind its log that sends nothing for this long stops holding the others back
# (a log truncated under the consumer, a partition whose fetches stall).
_SILENT_S = 2.0
# Records a rank may hold back for event-time order at least (about 20 MB of Criteo records).
_ORDER_BUFFER = 65536
# Held-back records past which the partitions read ahead of the oldest waiting one stop being
# fetched (Kafka's pause, as Kafka Streams pauses a partition whose buffer is full), at least.
_HOLD_AT = 8192


@dataclass(frozen=True)
class KafkaSpec:
    """This rank's share of a Kafka topic."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    records: int = 0
    idle_s: float = 10.0
    poll_s: float = 0.2
    reset_offsets: ResetOffsets = "checkpoint"
    prefetch_records: int = 65536
    order: Literal["event-time", "fetched"] = "event-time"
    max_skew_s: float = 0.0
    fill_wait_s: float = 1.0
    passes: int = 1

    def __post_init__(self) -> None:
        if self.records < 0 or not (self.idle_s > 0 and self.poll_s > 0):
            raise ValueError(f"a Kafka source needs records >= 0 (0: until idle) and positive "
                             f"idle and poll times, got records {self.records}, idle "
                             f"{self.idle_s} s, poll {self.poll_s} s")
        if self.prefetch_records < 0:
            raise ValueError(f"prefetch_records must be >= 0 (0: poll on the training thread), "
                             f"got {self.prefetch_records}")
        if self.order not in ("event-time", "fetched") or not self.max_skew_s >= 0 \
                or not self.fill_wait_s >= 0 or self.passes < 1:
            raise ValueError(f"order must be 'event-time' or 'fetched', max_skew_s and "
                             f"fill_wait_s >= 0 and passes >= 1, got {self.order!r}, "
                             f"{self.max_skew_s}, {self.fill_wait_s} and {self.passes}")
        if self.reset_offsets not in ("checkpoint", "earliest", "latest"):
            raise ValueError(f"reset_offsets must be checkpoint, earliest or latest, not "
                             f"{self.reset_offsets!r}")


class KafkaShard(Source):
    """This rank's partitions of a topic, ``local_batch`` records per step at most."""

    def __init__(self, spec: KafkaSpec, global_batch: int, rank: int, world: int,
                 resume: Resume | None = None, clock: Clock | None = None,
                 stop: Callable[[], bool] | None = None) -> None:
        """Open this rank's share (``stop``: the job's stop flag, which ends a wait for an
        unreachable broker with :class:`~hetgmp.streaming.ConnectStopped`)."""
        self.spec = spec
        self._clock = clock or SystemClock()
        lo, hi = shard_bounds(global_batch, rank, world)
        self.local_batch = max(1, hi - lo)
        c = spec.consumer
        partitions = topic_partitions(spec.kafka, c.topic, c.topic_wait_s, self._clock,
                                      c.connect_timeout_s, stop)
        mine = [p for p in sorted(partitions) if p % world == rank]
        if not mine:
            log.warning("rank %d: no partition of %s (%d partitions, %d ranks)",
                        rank, spec.consumer.topic, len(partitions), world)
        self.partitions = mine
        # A per-rank budget: ranks read disjoint partitions, so shares add up to the total.
        lo, hi = shard_bounds(spec.records, rank, world) if spec.records else (0, 0)
        self._budget = hi - lo if spec.records else None
        self.consumer = ClickConsumer(spec.kafka, spec.consumer, partitions=mine, clock=clock,
                                      stop=stop)
        self.schema = self.consumer.schema
        self._buffer = self._new_buffer()
        # Past _hold_at records held back for order, the partitions ahead stop being fetched,
        # so the one behind comes in; what was fetched of them before still arrives (the
        # prefetch queue and a poll). Past _order_limit they go out anyway, out of order:
        # memory stays bounded, and the summary and hetgmp_source_order_overflows say so.
        self._hold_at = max(2 * self.local_batch, _HOLD_AT)
        self._order_limit = max(4 * self.local_batch, _ORDER_BUFFER) + self._hold_at \
            + 2 * spec.prefetch_records
        self._held: set[int] = set()
        self.order_overflows = 0
        self.order_holds = 0
        self.order_peak = 0
        self._read = 0
        self._last_data = self._clock.monotonic()
        self._heard = {p: self._last_data for p in mine}  # when each partition last sent
        self._ended = not mine
        # --passes: the range the first pass read (first offset, end) is read again.
        self.passes_done = 0
        self._range_start: dict[int, int] = {}
        self._range_end: dict[int, int] | None = None
        self._pass_over = False  # the current pass has read its range; its tail goes out
        self.positions: dict[int, int] = {}
        self.trained: dict[int, int] = {}
        self._handed: collections.deque[dict[int, int]] = collections.deque()
        self._prefetch: Prefetcher | None = None
        if mine:
            self.consumer.start()
            try:
                if resume is not None:
                    self._resume(resume)
            except BaseException:
                self.consumer.stop()  # the constructor never returns: nobody else would
                raise
            if spec.prefetch_records:
                self._prefetch = Prefetcher(self.consumer, spec.prefetch_records,
                                            max(self.local_batch // 8, 64), spec.poll_s).start()

    # -- the Source contract ----------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """The record budget is spent or the partitions stayed idle for ``idle_s``."""
        return self._ended and len(self._buffer) == 0

    @property
    def topic(self) -> str:
        """The topic read."""
        return self.spec.consumer.topic

    @property
    def topic_id(self) -> str | None:
        """The topic's id when this rank started reading it (a checkpoint records it)."""
        return self.consumer.topic_id

    def snapshot(self) -> dict[int, int]:
        """Next offset per partition of what has been trained."""
        return dict(self.trained)

    def mark_trained(self) -> None:
        """The oldest batch handed out (non-empty) has been trained."""
        if self._handed:
            self.trained = self._handed.popleft()

    def prepare_commit(self) -> None:
        """Make sure every dead letter so far is on the broker (before a checkpoint covers
        the records they replace)."""
        self._on_consumer(lambda c: c.flush_dead_letters())

    def commit(self, offsets: Mapping[int, int]) -> bool:
        """Commit the next offsets of what was trained (after a durable checkpoint).

        A failed commit is logged, not raised: the checkpoint is durable and holds the offsets,
        and a resume seeks to them whatever the group's committed offsets say.
        """
        mine = {p: o for p, o in offsets.items() if p in self.partitions}
        if not self.spec.consumer.group_id or not mine:
            return False  # no consumer group (or nothing of ours): nothing to commit to
        try:
            return self._on_consumer(lambda c: c.commit(mine))
        except CommitError as exc:
            log.warning("commit of offsets %s failed (%s: %s); the checkpoint holds them",
                        mine, type(exc).__name__, exc)
            return False

    def collectors(self, labels: Mapping[str, str]) -> list[Any]:
        """The consumer's metrics (records, decode errors by reason, dead letters, offsets)
        and the event-time order's."""
        from hetgmp.streaming import ConsumerCollector

        # Lag counts from what this rank trained, not from what it has read ahead.
        return [ConsumerCollector(self.consumer, dict(labels), positions=self.snapshot),
                _OrderCollector(self, dict(labels))]

    def caught_up(self) -> bool:
        """Nothing buffered and every partition read to its high watermark."""
        return not len(self._buffer) and not self._behind()

    def report(self) -> dict[str, int]:
        """How the event-time order went: records handed out of order because the buffer
        overflowed (times it did), times partitions read ahead were held, the most records
        buffered; and what the consumer read: records decoded, messages, rejects by reason
        (``rejected.REASON``), dead letters, list values truncated by field
        (``truncated.FIELD``)."""
        st = self.consumer.stats
        return {"order_overflows": self.order_overflows, "order_holds": self.order_holds,
                "order_buffer_peak": self.order_peak, "records_read": st.records,
                "messages_read": st.messages, "dead_lettered": st.dead_lettered,
                **{f"rejected.{why}": n for why, n in st.rejected.items()},
                **{f"truncated.{name}": n for name, n in st.truncated.items()}}

    def upcoming_ids(self) -> np.ndarray:
        """The ids of the first ``local_batch`` records buffered (fetched in the background,
        not yet handed out)."""
        data = self._buffer.data
        return data.take(slice(0, min(self.local_batch, len(data)))).values

    def next_batch(self, cap: int | None = None) -> ClickBatch:
        """Up to ``local_batch`` records, and at most ``cap`` (waits at most ``poll_s`` for more)."""
        want = self.local_batch if cap is None else min(self.local_batch, cap)
        if self._budget is not None:
            if self._read >= self._budget:
                self._spent()
                return ClickBatch.empty(self.schema)
            want = min(want, self._budget - self._read)
        if self._pass_over and not len(self._buffer):
            self._next_pass()
        self._fill(want)
        ready = self._releasable()
        if not ready or want <= 0:
            return ClickBatch.empty(self.schema)
        n = message_cut(self._buffer.data, min(want, ready), exact=cap is not None)
        out = self._buffer.take(n)
        rest = self._buffer.data
        self._read += len(out)
        self._advance(out, rest)
        if len(out):
            self._handed.append(dict(self.positions))
        if self._budget is not None and self._read >= self._budget:
            self._spent()
        return out

    def close(self) -> None:
        """Stop the consumer (offsets are committed by whoever checkpoints, not here)."""
        try:
            if self._prefetch is not None:
                self._prefetch.stop()
        finally:
            self.consumer.stop()

    # -- internals ---------------------------------------------------------------------------

    def _resume(self, resume: Resume) -> None:
        """Continue this rank's partitions where a checkpoint says (``--reset-offsets``).

        ``checkpoint``: each partition from the checkpoint's offset; one the checkpoint has no
        offset for (nothing of it was trained) starts where a fresh run would (the group's
        committed offset, else ``--consumer-auto-offset-reset``); refused when the topic is not
        the one the checkpoint read (a broker that lost its log creates it anew).
        ``earliest`` / ``latest``: every partition from the first record, or the next one, of
        the log as it is now (the model and the record count still come from the checkpoint).
        """
        reset, mine = self.spec.reset_offsets, self.partitions
        if reset != "checkpoint":
            self.consumer.seek_to(mine, reset)
            log.warning("--reset-offsets %s: partitions %s start at the %s of the log, not at "
                        "the checkpoint's offsets", reset, mine,
                        "first record" if reset == "earliest" else "end")
            return
        now = self.consumer.topic_id
        if resume.topic_id and now and resume.topic_id != now:
            raise LogLost(
                f"topic {self.topic!r} is not the one the checkpoint read: its id was "
                f"{resume.topic_id}, it is {now} now (created again, e.g. by a broker that lost "
                f"its log), so the checkpoint's offsets name other records. Resume with "
                f"--reset-offsets earliest (the topic as it is now, from its start) or latest "
                f"(only what comes next)",
                topic=self.topic, old_topic_id=resume.topic_id, new_topic_id=now)
        offsets = {p: o for p, o in resume.offsets.items() if p in mine}
        if offsets:
            self.consumer.seek(offsets)
            self.positions.update(offsets)
            self.trained.update(offsets)
            log.info("partitions %s continue from offsets %s", sorted(offsets), offsets)

    def _on_consumer(self, fn: Callable[[ClickConsumer], T]) -> T:
        """``fn(consumer)`` on the thread that polls it."""
        return self._prefetch.call(fn) if self._prefetch is not None else fn(self.consumer)

    def _read_positions(self) -> dict[int, int]:
        """Next offset per partition of what the consumer has handed to this shard."""
        return self._prefetch.snapshot() if self._prefetch is not None else self.consumer.snapshot()

    def _read_highwaters(self) -> dict[int, int]:
        """High watermarks of the partitions as the fetch of what was handed out saw them."""
        return (self._prefetch.highwaters() if self._prefetch is not None
                else self.consumer.highwaters())

    def _new_buffer(self) -> EventTimeBuffer:
        return EventTimeBuffer(self.schema, self.spec.order == "event-time",
                               int(round(self.spec.max_skew_s * 1000)))

    def _fill(self, want: int) -> None:
        """Poll until ``want`` records may go out, or for at most ``fill_wait_s`` while the
        broker holds enough unread records to make them: a replayed log then gives whole
        batches, so that a step's share of a rank does not depend on how fetches were timed
        (one rank and N ranks train the same batches). A rank near the end of its log goes on
        at once with what it has: a live stream trains on what is there (waiting for a whole
        batch there would only add to every record's freshness)."""
        deadline = self._clock.monotonic() + self.spec.fill_wait_s
        while not self._ended and not self._pass_over and self._releasable() < want:
            self._poll(want)
            if self._releasable() >= want or self._clock.monotonic() >= deadline \
                    or len(self._buffer) + self._unread() < want:
                return

    def _unread(self) -> float:
        """Records the broker holds past what was read (of this pass's range), estimated from
        the records a message has held so far."""
        pos = self._read_positions()
        highs = self._read_highwaters() if self._range_end is None else dict(self._range_end)
        st = self.consumer.stats
        now = self._clock.monotonic()
        if any(p not in highs and now - self._heard[p] <= _SILENT_S for p in self.partitions):
            return float("inf")  # not fetched yet: the log may hold anything
        if not st.messages:
            return 0.0  # nothing at all within the silent time: an empty log
        messages = sum(max(h - pos.get(p, h), 0) for p, h in highs.items()
                       if p in self._heard)
        return messages * st.records / st.messages

    def _releasable(self) -> int:
        """Records that may go out now: in event-time order, those no partition behind its log
        could still precede; all of them once the source has ended, or past the order limit."""
        self.order_peak = max(self.order_peak, len(self._buffer))
        if self._ended or self._pass_over:
            self._hold(set())
            return len(self._buffer)
        waiting = self._waiting()
        ready = self._buffer.releasable(waiting)
        held_back = len(self._buffer) - ready
        if held_back >= self._hold_at:
            self._hold(self._buffer.ahead(waiting))
        elif held_back < self._hold_at // 2:
            self._hold(set())
        else:  # in between, a held partition no longer ahead of the oldest waiting one goes on
            # (else the one waited on ending could leave only held partitions to wait for)
            self._hold(self._held & self._buffer.ahead(waiting))
        if ready < len(self._buffer) and len(self._buffer) >= self._order_limit:
            if not self.order_overflows:
                log.warning("partitions %s: %d records held back for event-time order waiting "
                            "on %s although %s are no longer fetched; handing them out as they "
                            "are (records may be out of order from now on by up to what one "
                            "partition is ahead; counted in hetgmp_source_order_overflows)",
                            self.partitions, len(self._buffer), sorted(waiting),
                            sorted(self._held))
            self.order_overflows += 1
            return len(self._buffer)
        return ready

    def _hold(self, partitions: set[int]) -> None:
        """Fetch nothing more of ``partitions`` (and again of those left out), where the
        client can (librdkafka); with kafka-python the order limit is the only bound."""
        if partitions == self._held or not self.consumer.can_hold:
            return
        if partitions - self._held:
            self.order_holds += 1
        now = self._clock.monotonic()
        for p in self._held - partitions:  # silent from now on only if it sends nothing
            self._heard[p] = now
        self._held = set(partitions)
        if self._prefetch is not None:
            self._prefetch.hold(self._held)
        else:
            self.consumer.hold(self._held)

    def _behind(self) -> set[int]:
        """Partitions not read to the end of their log (as the last fetch knew it), or not
        known to be."""
        pos, highs = self._read_positions(), self._read_highwaters()
        out = set()
        for p in self.partitions:
            high, at = highs.get(p), pos.get(p)
            if self._range_end is not None:  # a later pass: its range's end is the end
                high = self._range_end.get(p, self._range_start.get(p, 0))
            if not (high is not None and (at >= high if at is not None else high == 0)):
                out.add(p)
        return out

    def _waiting(self) -> set[int]:
        """Partitions behind their log that sent something lately: they may still send a
        record older than those buffered."""
        now = self._clock.monotonic()
        # A held partition is silent because this shard stopped fetching it, not because its
        # producer paused: it stays waited on (it is ahead, so it holds nothing back).
        return {p for p in self._behind()
                if p in self._held or now - self._heard[p] <= _SILENT_S}

    def _poll(self, want: int) -> None:
        room = max(want - len(self._buffer), min(want, 4096), 1)
        if self._prefetch is not None:
            got = self._prefetch.next_batch(room, timeout=self.spec.poll_s)
        else:
            got = self.consumer.next_batch(max_records=max(room // 8, 64),
                                           timeout=self.spec.poll_s)
        now = self._clock.monotonic()
        if len(got) and self._range_end is not None:  # a later pass reads its range only
            end = np.array([self._range_end.get(int(p), 0) for p in got.partitions], np.int64)
            got = got.take(np.flatnonzero(got.offsets < end))
        if len(got):
            for p in np.unique(got.partitions).tolist():
                self._heard[int(p)] = now
                if self._range_end is None:
                    self._range_start.setdefault(int(p), int(got.offsets[got.partitions == p][0]))
            self._buffer.add(got)
            self._last_data = now
        elif self._range_end is not None and not self._behind():
            self._end_pass()
        elif now - self._last_data > self.spec.idle_s:
            log.info("partitions %s idle for %.0fs: %s", self.partitions, self.spec.idle_s,
                     "source ended" if self.spec.passes == 1 else "first pass over")
            self._end_pass()
        self._pass_rejected()

    def _end_pass(self) -> None:
        """The pass has read its range: the source ends, or (``--passes``) the buffered tail
        goes out and the next pass starts over."""
        if self.passes_done + 1 >= self.spec.passes or not self._range_start:
            self._ended = True
            return
        if self._range_end is None:
            pos = self._read_positions()
            self._range_end = {p: pos.get(p, o) for p, o in self._range_start.items()}
        self._pass_over = True

    def _next_pass(self) -> None:
        """Read the first pass's range again, in the same order (checkpoints are refused with
        passes: their offsets could not say which pass they are in)."""
        start = dict(self._range_start)
        self.passes_done += 1
        log.info("partitions %s: pass %d of %d from offsets %s", self.partitions,
                 self.passes_done + 1, self.spec.passes, start)
        if self._prefetch is not None:
            self._prefetch.seek(start)
        else:
            self.consumer.seek(start)
        self._buffer = self._new_buffer()  # its newest keys read start over too
        self.positions.update(start)
        self._pass_over = False
        self._last_data = now = self._clock.monotonic()
        self._heard = {p: now for p in self.partitions}

    def _pass_rejected(self) -> None:
        """Move past messages whose records were all rejected (dead-lettered): they leave no
        record to hand out, and a partition's last message rejected whole would otherwise
        never be committed past (every resume would dead-letter it again)."""
        buffered = set(np.unique(self._buffer.data.partitions).tolist())
        moved = False
        for p, o in self._read_positions().items():
            if p not in buffered and o > self.positions.get(p, -1):
                self.positions[p] = o
                moved = True
        if not moved:
            return
        if self._handed:  # they come after the last batch handed out: done once it is trained
            self._handed[-1].update({p: o for p, o in self.positions.items()
                                     if p not in buffered})
        else:
            self.trained.update({p: o for p, o in self.positions.items() if p not in buffered})

    def _spent(self) -> None:
        """The record budget is used up: the source ends, and records polled past it are let go
        (no position covers them, so a resumed run reads them)."""
        self._ended = True
        self._buffer.clear()

    def _advance(self, out: ClickBatch, rest: ClickBatch) -> None:
        """Move :attr:`positions` past the messages handed out whole."""
        if not len(out):
            return
        parts, offs = out.partitions, out.offsets
        for p in np.unique(parts).tolist():
            o = int(offs[parts == p].max())  # a partition's records go out in offset order
            # A message whose remaining records are still buffered is not done yet.
            split = bool(np.any((rest.partitions == p) & (rest.offsets == o))) if len(rest) else False
            nxt = o if split else o + 1
            if nxt > self.positions.get(p, -1):
                self.positions[p] = nxt


def message_cut(data: ClickBatch, want: int, exact: bool) -> int:
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


class _OrderCollector:
    """The event-time order's figures, read when scraped."""

    def __init__(self, shard: KafkaShard, labels: dict[str, str]) -> None:
        self.shard, self.labels = shard, labels

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names = sorted(self.labels)
        values = [self.labels[k] for k in names]
        for metric in (
                CounterMetricFamily("hetgmp_source_order_overflows", "Times the event-time "
                                    "buffer was full and its records went out as fetched "
                                    "(out of order)", labels=names),
                CounterMetricFamily("hetgmp_source_order_holds", "Times partitions read ahead "
                                    "of the oldest waiting one stopped being fetched",
                                    labels=names),
                GaugeMetricFamily("hetgmp_source_order_buffered", "Records held back for "
                                  "event-time order now", labels=names)):
            value = {"hetgmp_source_order_overflows": self.shard.order_overflows,
                     "hetgmp_source_order_holds": self.shard.order_holds,
                     "hetgmp_source_order_buffered": len(self.shard._buffer)}[metric.name]
            metric.add_metric(values, value)
            yield metric
