"""The contract every source of training records keeps, so that no caller asks which one it has.

A rank reads its share of each global batch from a :class:`Source`; ranks keep stepping together
(each step is a collective) until every rank's source has ended. The contract follows bytewax's
partition sources: :meth:`Source.next_batch` hands out what is there (possibly nothing),
:meth:`Source.snapshot` says where a run that stopped now would go on, and a resumed run is
opened at the :class:`Resume` point a checkpoint recorded.

Off by one, as bytewax documents for its snapshots: a snapshot holds the *next* offset to read
of every partition, counting only batches :meth:`Source.mark_trained` has confirmed. A batch
handed out but not yet trained when a checkpoint is taken is read again after a resume.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import numpy as np

from hetgmp.streaming import ClickBatch, Schema

__all__ = ["ResetOffsets", "Resume", "Source"]

# Where a resumed Kafka source starts: the checkpoint's offsets, or (after the broker lost its
# log, see streaming.LogLost) each partition's first or next record.
ResetOffsets = Literal["checkpoint", "earliest", "latest"]


@dataclass(frozen=True)
class Resume:
    """Where a resumed run's sources go on: what its checkpoint recorded.

    Attributes:
        records: Records trained before (over all ranks).
        offsets: Next offset to read, per partition (Kafka sources).
        topic_id: The topic's id when the checkpoint was taken (None: unknown).
    """

    records: int = 0
    offsets: Mapping[int, int] = field(default_factory=dict)
    topic_id: str | None = None


class Source(abc.ABC):
    """A rank's share of the training records.

    Attributes:
        schema: Field names of the records.
    """

    schema: Schema

    @abc.abstractmethod
    def next_batch(self, cap: int | None = None) -> ClickBatch:
        """This rank's next batch, possibly empty; at most ``cap`` records when given."""

    @property
    @abc.abstractmethod
    def exhausted(self) -> bool:
        """The source has ended: every record it will ever give has been handed out."""

    @property
    def topic(self) -> str | None:
        """The Kafka topic read (None for other sources)."""
        return None

    @property
    def topic_id(self) -> str | None:
        """The topic's id (changes when the topic is recreated; None when unknown)."""
        return None

    def upcoming_ids(self) -> np.ndarray:
        """Feature ids of the records this rank will most likely hand out next (about a
        batch), without waiting or taking them: a hint for reading their rows ahead (empty:
        none known)."""
        return np.zeros(0, np.int64)

    def mark_trained(self) -> None:
        """The oldest batch handed out (and not yet confirmed) has been trained."""
        return None  # a source without offsets has nothing to confirm

    def snapshot(self) -> dict[int, int]:
        """Next offset per partition of what has been trained (empty for other sources)."""
        return {}

    def prepare_commit(self) -> None:
        """Make sure what replaces rejected records (dead letters) is durable before a
        checkpoint covers their offsets."""
        return None  # nothing rejected, nothing to land

    def commit(self, offsets: Mapping[int, int]) -> bool:
        """Commit ``offsets`` (a durable checkpoint holds them); whether it landed."""
        return False

    def collectors(self, labels: Mapping[str, str]) -> list[Any]:
        """Prometheus collectors of the source's own figures (e.g. the consumer's), with
        ``labels`` on every series."""
        return []

    #: Passes over the log completed before the records handed out last (``--passes``): from
    #: 1 on, every record handed out was handed out in an earlier pass.
    passes_done: int = 0

    def caught_up(self) -> bool:
        """Whether every record the log held when last fetched has been handed out (nothing
        read ahead, nothing unread on the broker as far as this source knows). A live log with
        no new records is caught up; serving then reports the model as fresh, not as lagging
        by the age of the newest record."""
        return False

    def report(self) -> dict[str, int]:
        """The source's own counts for the run's summary (summed over ranks)."""
        return {}

    def close(self) -> None:
        """Release what the source holds."""
        return None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
