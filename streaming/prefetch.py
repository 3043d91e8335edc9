"""Fetch and decode on a thread of their own, so that consumption overlaps training.

:class:`Prefetcher` runs a started :class:`~hetgmp.streaming.consumer.ClickConsumer` on one thread: it
polls, decodes (both client libraries and numpy release the GIL in their hot loops) and queues
the decoded batches, while the caller trains on the batches before them. The queue is bounded
in records: the thread stops polling once ``max_records`` are waiting, so memory stays bounded
when the trainer is slower than the stream or stops for a while (a checkpoint, a migration),
and what stays unread stays on the broker.

Every call into the consumer goes through the thread that polls it (kafka-python's clients are
not thread-safe): :meth:`Prefetcher.call` queues a function that runs between two polls and
waits for its result. Offsets are those of what was *handed out*: each queued batch carries the
consumer's snapshot after it, and :meth:`Prefetcher.snapshot` is the one of the last batch
returned, so a commit or a checkpoint never covers a batch still waiting in the queue.

An error of the consumer (a lost log, a failed start of a partition) reaches the caller in
order: the batches fetched before it are handed out first, then :meth:`next_batch` raises it.
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

from hetgmp.streaming.consumer import ClickConsumer
from hetgmp.streaming.types import ClickBatch

__all__ = ["Prefetcher"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Prefetcher:
    """A :class:`ClickConsumer` read ahead on a thread, up to ``max_records`` decoded records."""

    def __init__(self, consumer: ClickConsumer, max_records: int, fetch_messages: int = 1024,
                 poll_s: float = 0.2) -> None:
        """Wrap a started consumer (nothing is read until :meth:`start`).

        Args:
            consumer: a started consumer, positioned where reading begins.
            max_records: the thread stops polling once this many records wait in the queue
                (it holds at most this plus one poll's records).
            fetch_messages: messages a poll takes at most.
            poll_s: how long a poll waits for messages.
        """
        if max_records < 1 or fetch_messages < 1 or not poll_s > 0:
            raise ValueError(f"a prefetcher needs max_records and fetch_messages >= 1 and a "
                             f"positive poll time, got {max_records}, {fetch_messages}, {poll_s}")
        self.consumer = consumer
        self.max_records = max_records
        self.fetch_messages = fetch_messages
        self.poll_s = poll_s
        # (batch, the consumer's snapshot and high watermarks right after the poll)
        self._queue: collections.deque[tuple[ClickBatch, dict[int, int], dict[int, int]]] = \
            collections.deque()
        self._queued = 0
        self._queued_bytes = 0
        self._calls: collections.deque[tuple[Callable[[ClickConsumer], object], Future[object]]] = \
            collections.deque()
        self._error: BaseException | None = None
        self._snapshot = consumer.snapshot()
        self._highwaters: dict[int, int] = {}
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_records = 0  # the most records the queue held at once
        self.peak_bytes = 0
        self._hold: set[int] | None = None  # partitions to hold, not yet applied

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Prefetcher:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hetgmp-fetch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (after its current poll) and drop what it had queued; the consumer
        stays open (its owner stops it)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._drop_queue()
            while self._calls:
                self._calls.popleft()[1].set_exception(RuntimeError("prefetcher stopped"))

    # -- the caller's side ---------------------------------------------------------------------

    @property
    def queued_records(self) -> int:
        """Decoded records waiting to be handed out."""
        return self._queued

    @property
    def queued_bytes(self) -> int:
        """Bytes of the decoded records waiting (their arrays)."""
        return self._queued_bytes

    def next_batch(self, max_records: int, timeout: float) -> ClickBatch:
        """The oldest queued batches, ``max_records`` records or a little more (whole polls), or
        what arrives within ``timeout`` seconds; empty if nothing did.

        Raises:
            The consumer's error, once every batch fetched before it has been handed out.
        """
        with self._lock:
            if not self._queue and self._error is None:
                self._lock.wait_for(lambda: self._queue or self._error is not None
                                    or self._stop.is_set(), timeout)
            taken: list[ClickBatch] = []
            n = 0
            while self._queue and n < max_records:
                batch, snap, highs = self._queue.popleft()
                self._queued -= len(batch)
                self._queued_bytes -= batch.nbytes
                self._snapshot, self._highwaters = snap, highs
                if len(batch):
                    taken.append(batch)
                    n += len(batch)
            if taken:
                self._lock.notify_all()  # room in the queue again
            elif self._error is not None:
                raise self._error
        if not taken:
            return ClickBatch.empty(self.consumer.schema)
        return taken[0] if len(taken) == 1 else ClickBatch.concat(taken)

    def snapshot(self) -> dict[int, int]:
        """Next offset per partition of what :meth:`next_batch` has handed out."""
        with self._lock:
            return dict(self._snapshot)

    def highwaters(self) -> dict[int, int]:
        """The partitions' high watermarks when the last batch handed out was fetched: with
        :meth:`snapshot`, whether a partition had been read to the end of its log then."""
        with self._lock:
            return dict(self._highwaters)

    def seek(self, offsets: dict[int, int]) -> None:
        """Continue the partitions from ``offsets``; what was read ahead of them is dropped
        (done on the thread, so that no poll from before the seek is queued after it)."""

        def seek(consumer: ClickConsumer) -> None:
            consumer.seek(offsets)
            with self._lock:
                self._drop_queue()
                self._snapshot, self._highwaters = consumer.snapshot(), {}
                self._lock.notify_all()

        self.call(seek)

    def hold(self, partitions: set[int]) -> None:
        """Fetch nothing more of these partitions (:meth:`ClickConsumer.hold`) from the thread's
        next poll on; returns at once."""
        with self._lock:
            polling = self._thread is not None and self._error is None
            if polling:
                self._hold = set(partitions)
                self._lock.notify_all()
        if not polling:
            self.consumer.hold(set(partitions))

    def call(self, fn: Callable[[ClickConsumer], T], timeout: float | None = None) -> T:
        """Run ``fn(consumer)`` on the consumer's thread between two polls; its result.

        Before :meth:`start`, after :meth:`stop` or once the thread has failed, it runs here at
        once.
        """
        future: Future[object] = Future()
        with self._lock:
            polling = self._thread is not None and self._error is None
            if polling:
                self._calls.append((fn, future))  # type: ignore[arg-type]
                self._lock.notify_all()
        if not polling:  # nobody else touches the consumer
            return fn(self.consumer)
        return future.result(timeout)  # type: ignore[return-value]

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        last_highs: dict[int, int] = {}
        try:
            while not self._stop.is_set():
                self._serve_calls()
                with self._lock:
                    hold, self._hold = self._hold, None
                if hold is not None:
                    self.consumer.hold(hold)
                with self._lock:
                    if self._queued >= self.max_records:
                        # Full: wait for the caller to take some (or to call, or to stop).
                        self._lock.wait_for(lambda: self._queued < self.max_records
                                            or self._calls or self._hold is not None
                                            or self._stop.is_set(), 1.0)
                        continue
                before = self.consumer.snapshot()
                batch = self.consumer.next_batch(self._messages_wanted(), self.poll_s)
                after, highs = self.consumer.snapshot(), self.consumer.highwaters()
                # Rejected-only messages move offsets too; a new high watermark says what
                # the log holds (an empty partition is seen caught up only so).
                if len(batch) or after != before or highs != last_highs:
                    self._put(batch, after, highs)
                    last_highs = highs
        except BaseException as exc:  # handed to the caller, in order
            log.debug("fetch thread stopped: %r", exc)
            with self._lock:
                self._error = exc
                self._lock.notify_all()
            self._fail_calls(exc)

    def _messages_wanted(self) -> int:
        """Messages for the room left in the queue, at the records a message has held so far
        (an Arrow message holds a thousand: a full poll of them would overshoot the bound)."""
        st = self.consumer.stats
        if not st.messages:
            return 1  # how many records a message holds is not known yet
        per_message = st.records / st.messages
        room = self.max_records - self._queued
        return max(1, min(self.fetch_messages, int(room / max(per_message, 1.0))))

    def _put(self, batch: ClickBatch, snapshot: dict[int, int], highs: dict[int, int]) -> None:
        with self._lock:
            self._queue.append((batch, snapshot, highs))
            self._queued += len(batch)
            self._queued_bytes += batch.nbytes
            self.peak_records = max(self.peak_records, self._queued)
            self.peak_bytes = max(self.peak_bytes, self._queued_bytes)
            self._lock.notify_all()

    def _drop_queue(self) -> None:
        """Forget every queued batch (the lock held)."""
        self._queue.clear()
        self._queued = self._queued_bytes = 0

    def _serve_calls(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    return
                fn, future = self._calls.popleft()
            try:
                future.set_result(fn(self.consumer))
            except BaseException as exc:
                future.set_exception(exc)

    def _fail_calls(self, exc: BaseException) -> None:
        with self._lock:
            calls, self._calls = list(self._calls), collections.deque()
        for _, future in calls:
            future.set_exception(exc)

