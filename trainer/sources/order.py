"""A rank's partitions interleaved in event-time order.

A rank reads several partitions; a fetch returns them in whatever order the client library
chose (often all of one partition, then another), which mixes the timeline: a model would train
on a whole quarter of a log before the rest of its first hour. :class:`EventTimeBuffer` holds the
records read and hands them out in the order of their key ``(append time, offset, partition)``,
as Kafka Streams picks the partition with the smallest head timestamp and Flink aligns
watermarks.

A record may go out only when no partition can still send an older one. A partition can while it
is *waiting*: not caught up with its log (it has records on the broker not yet read) and
not silent for long. Its next record's key is above the newest one read from it (append times
never go back within a partition: each partition's times are taken as their running maximum),
so every buffered record with a key up to that one is safe; ``max_skew_ms`` lets records that
much younger go too, which bounds how far one partition runs ahead of another in exchange for
fewer waits. A partition caught up with its log cannot send anything older than the present.

The key is a total order that every rank computes alike: with the project's producer (messages
written round robin over the partitions, in time order), it is exactly the order in which the
messages were appended, and ranks that each take their share of a global batch in this order
together take the same records as one rank reading every partition. That holds across produce
calls too (a file's first 80% and then its last 20%): each call goes on with the round robin
where the topic ends and stamps its messages after the topic's newest one
(:mod:`hetgmp.streaming.append_order`); a call that started at partition 0 again put messages of one
millisecond out of order.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import numpy as np

from hetgmp.streaming import ClickBatch, Schema

__all__ = ["EventTimeBuffer"]

log = logging.getLogger(__name__)


class EventTimeBuffer:
    """Records read from a rank's partitions, handed out in event-time order (or as fetched).

    Args:
        schema: the records' fields (for the empty batch).
        ordered: ``False`` keeps the order they were fetched in.
        max_skew_ms: how much younger than a waiting partition's newest record a record may be
            and still go out (0: strict order).
    """

    def __init__(self, schema: Schema, ordered: bool = True, max_skew_ms: int = 0) -> None:
        if max_skew_ms < 0:
            raise ValueError(f"max_skew_ms must be >= 0, got {max_skew_ms}")
        self.ordered = ordered
        self.max_skew_ms = max_skew_ms
        self.data = ClickBatch.empty(schema)
        self._times = np.zeros(0, np.int64)  # each record's key time (running max per partition)
        self._newest: dict[int, tuple[int, int]] = {}  # partition -> (time, offset) newest read

    def __len__(self) -> int:
        return len(self.data)

    def add(self, batch: ClickBatch) -> None:
        """Records just read (each partition's in offset order)."""
        if not len(batch):
            return
        times = batch.timestamps_ms.astype(np.int64, copy=True)
        parts = batch.partitions
        for p in np.unique(parts).tolist():
            sel = np.flatnonzero(parts == p)
            before = self._newest.get(p, (np.iinfo(np.int64).min, -1))[0]
            times[sel] = np.maximum.accumulate(np.maximum(times[sel], before))
            self._newest[p] = (int(times[sel[-1]]), int(batch.offsets[sel[-1]]))
        if self.ordered:
            order = np.lexsort((parts, batch.offsets, times))  # stable: a message stays whole
            batch, times = batch.take(order), times[order]
        if not len(self.data):
            self.data, self._times = batch, times
            return
        data = ClickBatch.concat([self.data, batch])
        joined = np.concatenate([self._times, times])
        n = len(self.data)
        if self.ordered and _before((joined[n], data.offsets[n], data.partitions[n]),
                                    (joined[n - 1], data.offsets[n - 1], data.partitions[n - 1])):
            # Older than something buffered (another partition's records came late): merge.
            order = np.lexsort((data.partitions, data.offsets, joined))
            data, joined = data.take(order), joined[order]
        self.data, self._times = data, joined

    def releasable(self, waiting: Collection[int]) -> int:
        """How many of the first records may go out while ``waiting`` partitions (not caught
        up, not silent) may still send more: all of them when none waits, or when unordered."""
        n = len(self.data)
        if not self.ordered or not n or not waiting:
            return n
        t, o, p = self._times, self.data.offsets, self.data.partitions
        ok = np.ones(n, bool)
        for q in waiting:
            newest = self._newest.get(q)
            if newest is None:
                return 0  # nothing read from it yet: its first record may be the oldest
            tq, oq = newest
            if self.max_skew_ms:
                ok &= t <= tq + self.max_skew_ms
            else:  # at most the key of its newest record read
                ok &= (t < tq) | ((t == tq) & ((o < oq) | ((o == oq) & (p <= q))))
        return n if ok.all() else int(np.argmin(ok))

    def ahead(self, waiting: Collection[int]) -> set[int]:
        """The partitions read past the oldest of the ``waiting`` ones (``max_skew_ms``
        allowed): what they send next cannot go out before that one sends, so fetching more of
        them only grows the buffer. Every partition read when a waiting one has sent nothing."""
        if not self.ordered or not waiting:
            return set()
        newest = [self._newest.get(q) for q in waiting]
        if any(n is None for n in newest):
            return set(self._newest)
        frontier = min(n[0] for n in newest if n is not None) + self.max_skew_ms
        return {p for p, (t, _) in self._newest.items() if t > frontier}

    def take(self, n: int) -> ClickBatch:
        """The first ``n`` records, removed from the buffer."""
        out = self.data.take(slice(0, n))
        self.data, self._times = self.data.take(slice(n, None)), self._times[n:]
        return out

    def clear(self) -> None:
        """Drop everything buffered (the newest keys read stay)."""
        self.data, self._times = self.data.take(slice(0, 0)), self._times[:0]


def _before(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """Key ``a`` sorts before key ``b``."""
    return (int(a[0]), int(a[1]), int(a[2])) < (int(b[0]), int(b[1]), int(b[2]))
