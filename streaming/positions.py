"""Where each partition of a consumer stands, and the checks that the log under it is still the
log it read.

A broker that loses its log (Tansu's in-memory storage after a restart, an unclean leader
election, a topic deleted and created again) does not always say so: a fetch past the end of the
new, shorter log returns nothing, and a new log that has grown past the old position hands out
its records as if they followed the old ones. :class:`LogGuard` tells both apart from a quiet
log, with two pieces of evidence kafka-python keeps:

* the topic id (KIP-516): a topic created again gets a new one;
* the high watermark of each fetch response: below a position this consumer already stands at,
  the records in between are gone.

The guard itself is pure (values in, :class:`LogLost` out); each client adapter
(:mod:`hetgmp.streaming.clients`) reads those values from its library.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

__all__ = ["ConsumerFailed", "LogGuard", "LogLost"]

log = logging.getLogger(__name__)

RESUME_HINT = (
    "No offset past what this consumer read has been committed. To go on, start again with "
    "--reset-offsets earliest (read the log the broker has now from its start), latest (skip to "
    "its end) or checkpoint (the offsets of the newest checkpoint)."
)


class ConsumerFailed(RuntimeError):
    """Reading cannot go on: retrying would not help, or records would be lost."""


class LogLost(ConsumerFailed):
    """The log this consumer was reading went backwards or was replaced.

    Attributes:
        topic: the topic read.
        partition: the partition whose log went backwards (None for a replaced topic).
        position: the offset this consumer stood at in that partition.
        highwater: the broker's high watermark for it, or None.
        old_topic_id: the topic id this consumer started with, or None.
        new_topic_id: the topic id the cluster reports now, or None.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int | None = None,
        position: int | None = None,
        highwater: int | None = None,
        old_topic_id: str | None = None,
        new_topic_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.position = position
        self.highwater = highwater
        self.old_topic_id = old_topic_id
        self.new_topic_id = new_topic_id


def topic_id_text(value: Any) -> str | None:
    """A topic id as text; None for a missing or all-zero id (the broker's "unknown")."""
    if value is None:
        return None
    if isinstance(value, uuid.UUID):
        return None if value.int == 0 else str(value)
    text = str(value)
    return None if not text or set(text) <= {"0", "-"} else text


@dataclass
class LogGuard:
    """Per partition, the offset the log is known to reach; raises when the broker's log falls
    short of it or the topic is replaced.

    Args:
        topic: the topic read.
        cluster: the bootstrap servers (for messages).
        topic_id: the topic id at start; None = adopt the first one seen.
    """

    topic: str
    cluster: str
    topic_id: str | None = None
    # Offsets the log has been seen to reach: the next offset after what was returned, a
    # position sought to, or the committed offset a partition started at.
    _floors: dict[int, int] = field(default_factory=dict)
    # The high watermark known when a partition was sought past it: it predates the seek, so it
    # is no evidence against the new position until a fetch there replaces it.
    _stale: dict[int, int] = field(default_factory=dict)

    @property
    def partitions(self) -> set[int]:
        """Partitions with a known position."""
        return set(self._floors)

    def expect(self, partition: int, offset: int, highwater: int | None) -> None:
        """``partition`` now reads from ``offset`` (a seek or a committed offset).

        Args:
            partition: the partition moved.
            offset: its new position.
            highwater: the high watermark known at that moment (None if none yet).
        """
        self._floors[partition] = offset
        if highwater is not None and highwater < offset:
            self._stale[partition] = highwater
        else:
            self._stale.pop(partition, None)

    def advance(self, partition: int, offset: int) -> None:
        """Records of ``partition`` up to ``offset`` (exclusive) were returned."""
        self._floors[partition] = offset
        # The fetch that returned them carried a high watermark at or past them.
        self._stale.pop(partition, None)

    def forget(self, partitions: Iterable[int]) -> None:
        """Stop watching ``partitions`` (revoked, or moved to a position not known yet)."""
        for p in partitions:
            self._floors.pop(p, None)
            self._stale.pop(p, None)

    def check(self, topic_id: str | None, highwaters: Mapping[int, int | None]) -> None:
        """Raise :class:`LogLost` if the topic was replaced or a log ends before its position.

        Args:
            topic_id: the topic id the cluster reports now (None = not known now).
            highwaters: the latest high watermark per partition (None = no fetch answered yet).

        Raises:
            LogLost: with what happened and how to go on.
        """
        if topic_id is not None:
            if self.topic_id is None:
                self.topic_id = topic_id
            elif topic_id != self.topic_id:
                raise LogLost(
                    f"topic {self.topic!r} on {self.cluster} was replaced: its topic id changed "
                    f"from {self.topic_id} to {topic_id} (deleted and created again, or a broker "
                    "restarted without its storage), so the log this consumer was reading is "
                    "gone; no record of the new log has been returned. " + RESUME_HINT,
                    topic=self.topic,
                    old_topic_id=self.topic_id,
                    new_topic_id=topic_id,
                )
        for p, floor in sorted(self._floors.items()):
            hw = highwaters.get(p)
            if hw is None:
                continue
            if p in self._stale:
                if hw == self._stale[p]:
                    continue
                del self._stale[p]
            if hw < floor:
                raise LogLost(
                    f"partition {p} of topic {self.topic!r} on {self.cluster} went backwards: the "
                    f"broker's log ends at offset {hw} (high watermark) but this consumer stands "
                    f"at offset {floor}; the records in between are gone (a broker restarted "
                    "without its storage, an unclean leader election, or the topic was created "
                    "again). " + RESUME_HINT,
                    topic=self.topic,
                    partition=p,
                    position=floor,
                    highwater=hw,
                    old_topic_id=self.topic_id,
                )


def out_of_range(topic: str, cluster: str, exc: Exception) -> LogLost:
    """:class:`LogLost` for kafka-python's OffsetOutOfRange / LogTruncation errors."""
    detail = exc.args[0] if exc.args else None
    where = ""
    partition = position = None
    if isinstance(detail, Mapping) and detail:
        tp, off = sorted(detail.items(), key=lambda kv: getattr(kv[0], "partition", 0))[0]
        partition = getattr(tp, "partition", None)
        position = getattr(off, "offset", off) if not isinstance(off, int) else off
        where = f"partition {partition} at offset {position}: "
    return LogLost(
        f"topic {topic!r} on {cluster}: {where}the position this consumer reads from is outside "
        f"the broker's log ({type(exc).__name__}: {exc}); the log was truncated or replaced and "
        "records may be missing. " + RESUME_HINT,
        topic=topic,
        partition=partition,
        position=position if isinstance(position, int) else None,
    )
