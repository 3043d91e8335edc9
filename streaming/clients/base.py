"""What this project needs from a Kafka client library, in one small interface: a consumer
(:class:`ConsumerClient`), a producer of one topic (:class:`RecordSender`) and a dead-letter
producer (:class:`DeadLetterSender`).

:class:`~hetgmp.streaming.consumer.ClickConsumer` keeps the policy (starting positions, the log guard,
dead letters, commits after checkpoints, retries); a client adapter only moves bytes and maps its
library's errors onto the few outcomes that policy tells apart:

* :class:`TransientError`: the poll failed in a way the library recovers from (a broker
  restarting, a leader moving): counted, logged and retried;
* :class:`~hetgmp.streaming.positions.ConsumerFailed`: retrying cannot help (credentials, ACLs);
* :class:`~hetgmp.streaming.positions.LogLost`: the position is outside the broker's log;
* :class:`NoPosition`: partitions without a starting position (the group's committed offsets
  could not be looked up during a rebalance);
* :class:`CommitRebalancing` / :class:`CommitMoved`: a commit met a rebalance in progress, or
  the partitions now belong to another member.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence

import numpy as np

__all__ = [
    "CommitError",
    "CommitMoved",
    "CommitRebalancing",
    "ConsumerClient",
    "DeadLetterSender",
    "Fetched",
    "Headers",
    "RecordSender",
    "SendFailed",
    "NoPosition",
    "Rebalance",
    "TransientError",
]


class TransientError(Exception):
    """A poll failed; the client recovers on a later poll."""


class NoPosition(Exception):
    """Partitions have no position to fetch from.

    Attributes:
        partitions: those partitions.
    """

    def __init__(self, partitions: set[int]) -> None:
        super().__init__(f"partitions {sorted(partitions)} have no position")
        self.partitions = partitions


class CommitError(Exception):
    """A commit did not land (the broker refused it or did not answer)."""


class CommitRebalancing(CommitError):
    """The group is rebalancing: poll (to let the rejoin finish) and commit again."""


class CommitMoved(CommitError):
    """The partitions were given to another member before the commit landed."""


Headers = list[tuple[str, bytes]]


@dataclass
class Fetched:
    """Messages of a poll, in the order the client returned them (offset order per partition).

    ``headers`` holds each message's headers where the consumer was made to read them
    (``headers=True``), else None: the click stream's consumer reads a million messages a
    second and none of it wants them."""

    values: list[bytes | None]
    partitions: np.ndarray  # int64 [N]
    offsets: np.ndarray  # int64 [N]
    timestamps_ms: np.ndarray  # int64 [N]
    headers: list[Headers] | None = None

    @classmethod
    def empty(cls) -> Fetched:
        z = np.zeros(0, np.int64)
        return cls([], z, z, z)

    @classmethod
    def of(cls, values: list[bytes | None], partitions: Sequence[int], offsets: Sequence[int],
           timestamps_ms: Sequence[int], headers: list[Headers] | None = None) -> Fetched:
        n = len(values)
        return cls(values, np.fromiter(partitions, np.int64, n), np.fromiter(offsets, np.int64, n),
                   np.fromiter(timestamps_ms, np.int64, n), headers)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, rows: slice) -> Fetched:
        return Fetched(self.values[rows], self.partitions[rows], self.offsets[rows],
                       self.timestamps_ms[rows],
                       None if self.headers is None else self.headers[rows])

    def split(self, n: int) -> tuple[Fetched, Fetched]:
        """The first ``n`` messages and the rest."""
        return self[:n], self[n:]

    def without(self, partitions: Iterable[int]) -> Fetched:
        """These messages less those of ``partitions``."""
        drop = np.isin(self.partitions, np.fromiter(partitions, np.int64))
        if not drop.any():
            return self
        keep = np.flatnonzero(~drop)
        return Fetched([self.values[i] for i in keep], self.partitions[keep], self.offsets[keep],
                       self.timestamps_ms[keep],
                       None if self.headers is None else [self.headers[i] for i in keep])

    def __add__(self, other: Fetched) -> Fetched:
        if not len(other):
            return self
        if not len(self):
            return other
        headers = (None if self.headers is None or other.headers is None
                   else self.headers + other.headers)
        return Fetched(self.values + other.values,
                       np.concatenate([self.partitions, other.partitions]),
                       np.concatenate([self.offsets, other.offsets]),
                       np.concatenate([self.timestamps_ms, other.timestamps_ms]), headers)


class Rebalance(Protocol):
    """What the consumer does when the group moves partitions (called inside :meth:`poll`)."""

    def revoked(self, partitions: set[int]) -> None: ...

    def assigned(self, partitions: set[int], committed: Mapping[int, int] | None) -> None:
        """``committed``: the group's offsets of those that have one; None if the lookup failed
        (the client then finds them itself, or raises :class:`NoPosition`)."""


class ConsumerClient(abc.ABC):
    """One topic's consumer on one client library. Positions set by :meth:`seek` and
    :meth:`seek_to` apply to the next fetch; nothing is committed unless :meth:`commit` is
    called."""

    name: str

    @abc.abstractmethod
    def assign(self, partitions: Sequence[int]) -> None:
        """Read exactly these partitions, without group rebalancing."""

    @abc.abstractmethod
    def subscribe(self, listener: Rebalance) -> None:
        """Join the group; ``listener`` hears of every assignment and revocation."""

    @abc.abstractmethod
    def assignment(self) -> set[int]:
        """Partitions this consumer reads now."""

    @abc.abstractmethod
    def committed(self, partitions: Sequence[int]) -> dict[int, int]:
        """The group's committed offsets of those partitions that have one."""

    @abc.abstractmethod
    def seek(self, partition: int, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` next."""

    @abc.abstractmethod
    def seek_to(self, partitions: Sequence[int], where: Literal["earliest", "latest"]) -> None:
        """Fetch ``partitions`` from the start or the end of the broker's log next."""

    @abc.abstractmethod
    def poll(self, timeout_s: float, max_messages: int) -> Fetched:
        """Messages available within ``timeout_s`` (at most ``max_messages``)."""

    #: Whether :meth:`hold` works. kafka-python 3.0 against the embedded broker serves one
    #: partition at a time and, once paused and resumed, a partition went unfetched for
    #: seconds or for good (seen here): it does not hold.
    can_hold: bool = False

    def hold(self, partitions: set[int]) -> None:
        """Fetch nothing more of exactly these partitions until they are left out of a later
        call (Kafka's pause and resume; positions stay where they are, and what the library
        had fetched of them ahead is fetched again after). Only where :attr:`can_hold`."""
        raise NotImplementedError(f"{self.name} does not hold partitions")

    @abc.abstractmethod
    def observe(self, partitions: Iterable[int]) -> tuple[str | None, dict[int, int | None]]:
        """The topic id (UUID text, None if unknown) and the high watermark of each of
        ``partitions`` still assigned, from what the client already knows: nothing is sent."""

    @abc.abstractmethod
    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        """The first offset the broker holds of each of ``partitions``, asked now. (Not the
        latest: the embedded broker answers that with the last batch's base offset; the high
        watermark of a fetch, :meth:`observe`, is the one to trust.)"""

    @abc.abstractmethod
    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit synchronously. Raises :class:`CommitRebalancing`, :class:`CommitMoved`, or
        :class:`CommitError` for any other failure."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the group (without committing) and close."""


class DeadLetterSender(abc.ABC):
    """A producer of dead letters whose every send is checked at :meth:`flush`."""

    @abc.abstractmethod
    def send(self, topic: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        """Queue one dead letter."""

    @abc.abstractmethod
    def flush(self, timeout_s: float) -> tuple[int, int, str | None]:
        """Wait for the letters sent since the last flush: ``(sent, failed, first error)``
        (one not acknowledged within ``timeout_s`` counts as failed)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the producer."""


class SendFailed(Exception):
    """The client refused a send outright (its buffer full past its wait, no metadata)."""


class RecordSender(abc.ABC):
    """A producer of one topic's messages; every message's outcome reaches ``on_result``.

    ``on_result(tag, error, offset)`` is called once per message, with the ``tag`` it was sent
    with; ``error`` is None and ``offset`` the message's offset when the broker acknowledged it,
    else ``offset`` is -1 (possibly on the client's I/O thread)."""

    @abc.abstractmethod
    def partitions(self) -> int:
        """Partitions of the topic."""

    @abc.abstractmethod
    def send(self, value: bytes, partition: int, timestamp_ms: int | None, tag: Any, *,
             key: bytes | None = None, headers: Headers | None = None) -> None:
        """Queue one message (``timestamp_ms`` None: now). Raises :class:`SendFailed`."""

    @abc.abstractmethod
    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued message has its result; whether all had one within
        ``timeout_s``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush every queued message (their results arrive first), then close."""
