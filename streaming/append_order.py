"""The order a producer appends in, kept across produce calls.

The trainer hands a rank's records out by the key ``(append time, offset, partition)``
(:mod:`hetgmp.trainer.sources.order`). Messages written round robin over ``P`` partitions, with
times that never go back, are in that key's order exactly when message ``i`` of the topic sits
at offset ``i // P`` of partition ``i % P``: messages appended in one millisecond are then
ordered by offset, then partition, as they were sent. A produce call that started its round
robin at partition 0 on a topic that already held messages broke this: after a call of 79
messages on 4 partitions (partitions 0-2 at offset 20, partition 3 at 19) the next call's
fourth message, at offset 19 of partition 3, sorted before its first, at offset 20 of partition
0, whenever both fell in one millisecond (records 81,024 on of a held-out replay came out of
the file's order).

A producer therefore starts from where the topic ends (:func:`topic_ends`) and
:class:`AppendOrder` picks each message's partition and time:

* the partition: the one whose next offset is lowest (the lowest partition on a tie), so every
  message's ``(offset, partition)`` is above every earlier one's: on a topic written this way
  it is the round robin going on where the last call stopped, and on one that is not (another
  producer's messages) the order still holds;
* the time: the clock's, but never below the last one given, and above the newest the topic
  held before this call, so that no message of this call ties with one of an earlier call (two
  calls' ties would be ordered by offset alone) and a clock stepped back keeps the order.

The end of each partition is read, not asked: the embedded broker answers a list-offsets request
("latest") with the base offset of its last batch + 1, not the end of the log (the high
watermark), which is what a fetch response carries. So the probe fetches from "latest" and,
where that did not reach the last message, from one before the high watermark, and reads the
last message's append time on the way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Literal, Mapping

from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming.kafka import ConnectStopped, KafkaSettings

__all__ = ["AppendOrder", "PartitionEnd", "topic_ends"]

log = logging.getLogger(__name__)

# How long one poll of the probe waits, and how many it makes at most.
_POLL_S = 0.1
_POLLS = 300


@dataclass(frozen=True)
class PartitionEnd:
    """Where a partition's log ends.

    Attributes:
        next_offset: the offset its next message will get (the high watermark).
        newest_ms: the append time of its last message (None: the partition is empty).
    """

    next_offset: int
    newest_ms: int | None = None


class AppendOrder:
    """Each message's partition and time, so that the topic's order is the order of sending.

    Args:
        ends: where each partition of the topic ends now (every partition, empty ones at 0).
    """

    def __init__(self, ends: Mapping[int, PartitionEnd]) -> None:
        if not ends:
            raise ValueError("a topic has at least one partition")
        self._next = {p: e.next_offset for p, e in ends.items()}
        self.continued = sum(self._next.values())  # messages the topic held before
        stamps = [e.newest_ms for e in ends.values() if e.newest_ms is not None]
        # Strictly after the newest message already there: no tie with an earlier call.
        self._floor = max(stamps) + 1 if stamps else None

    def partition(self) -> int:
        """The partition of the next message (the lowest next offset, then the lowest id)."""
        p = min(self._next, key=lambda q: (self._next[q], q))
        self._next[p] += 1
        return p

    def stamp(self, now_ms: int) -> int:
        """The time of the next message: ``now_ms``, but never below an earlier one's."""
        t = now_ms if self._floor is None else max(now_ms, self._floor)
        self._floor = t
        return t


def topic_ends(kafka: KafkaSettings, topic: str, partitions: int,
               client: Literal["auto", "kafka-python", "confluent"], *,
               clock: Clock | None = None,
               stop: Callable[[], bool] | None = None) -> dict[int, PartitionEnd] | None:
    """Where each of ``topic``'s ``partitions`` ends, read from the broker (see the module).

    Args:
        kafka: how to reach the cluster.
        topic: an existing topic.
        partitions: its partition count.
        client: the client library (``auto``, ``kafka-python`` or ``confluent``).
        clock: time source for the connection's backoff.
        stop: ends the wait for a broker (:class:`~hetgmp.streaming.kafka.ConnectStopped`).

    Returns:
        The end of every partition, or None when some partition's end could not be read
        within ``_POLLS`` polls (said in the log).
    """
    from hetgmp.streaming.clients import connect_consumer
    from hetgmp.streaming.consumer import ConsumerConfig

    settings = ConsumerConfig(topic=topic, group_id="", client=client, fetch_wait_ms=10)
    consumer = connect_consumer(client, kafka, topic, None, settings, clock or SystemClock(),
                                stop=stop)
    parts = list(range(partitions))
    highs: dict[int, int] = {}
    last: dict[int, tuple[int, int]] = {}  # partition -> (offset, time) of the newest read
    sought: set[int] = set()
    try:
        consumer.assign(parts)
        consumer.seek_to(parts, "latest")
        for _ in range(_POLLS):
            if stop is not None and stop():
                raise ConnectStopped(f"stopped while reading where topic {topic!r} ends")
            got = consumer.poll(_POLL_S, 100_000)
            for p, o, t in zip(got.partitions.tolist(), got.offsets.tolist(),
                               got.timestamps_ms.tolist()):
                if o >= last.get(p, (-1, 0))[0]:
                    last[p] = (o, t)
            highs.update({p: h for p, h in consumer.observe(parts)[1].items() if h is not None})
            missing = [p for p in parts
                       if p not in highs or (highs[p] > 0 and last.get(p, (-1, 0))[0] < highs[p] - 1)]
            if not missing:
                return {p: PartitionEnd(highs[p], last[p][1] if highs[p] > 0 else None)
                        for p in parts}
            for p in missing:  # "latest" was past its last message (or before it on Tansu)
                if p in highs and p not in sought:
                    consumer.seek(p, highs[p] - 1)
                    sought.add(p)
    finally:
        consumer.close()
    log.warning("could not read where the partitions of %s end (%d polls); this produce call "
                "starts at partition 0 and its records may sort among the last call's",
                topic, _POLLS)
    return None
