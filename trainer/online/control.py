"""The control vector: what every rank decides together, once before every step.

Each rank fills a :class:`Proposal` with what it knows (a stop request, what rank 0's
partitioner and checkpoint clock say, what it read and trained in the previous step); one
all-reduce of one small int64 vector sums the proposals, and every rank decodes the same
:class:`Control`. So every decision (stop, repartition, switch placement, checkpoint) is taken by
every rank at the same step, without a message of its own.

Wire format, ``13 + 4 * world`` int64 values summed over ranks::

    0 stop | 1 repartition | 2 ready | 3 checkpoint | 4 diverged | 5 publish   (flags)
    6 records | 7 rows not held | 8 samples trained         (the previous step, summed)
    9 embedding-path bytes | 10 the loop's window, placement and migration bytes (sent since
      the previous control round) | 11 rows the previous step's batches fetch under hash
                                                        (summed; --placement auto)
    12 ranks whose source was not caught up with its log after the previous step
    13 + r            window words rank r sends to rank 0 now (its packed samples)
    13 + world + r    samples rank r trained in the previous step
    13 + 2 world + r  rows rank r owns
    13 + 3 world + r  newest Kafka append time (ms) rank r read in the previous step, -1 none

:func:`encode` and :func:`decode` are pure; :func:`agree` is the collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainer.dist import Comm

__all__ = ["Control", "Proposal", "agree", "decode", "encode", "width"]

_FLAGS = 6
_SUMS = 7
_PER_RANK = 4


@dataclass(frozen=True)
class Proposal:
    """One rank's share of the control vector.

    Attributes:
        stop: This rank was asked to stop.
        repartition: Rank 0: a new placement is due.
        ready: Rank 0: the partitioner has a placement and no migration is in progress.
        checkpoint: Rank 0: a checkpoint is due.
        publish: Rank 0: a publish of the model's changes is due.
        diverged: This rank's loss of the previous step was not finite (NaN or infinite).
        records: Records this rank read in the previous step.
        rows_not_held: Rows it neither owned nor held fresh in the previous step.
        samples: Samples it trained in the previous step.
        embedding_bytes: Bytes it sent on the embedding path since the previous control round.
        loop_bytes: Bytes it sent meanwhile for the loop's window, placements and migrations
            (with the embedding path's, what a placement changes).
        hash_rows: Rows its batch of the previous step fetches under the hash placement (those
            it uses and does not own by hash), for ``--placement auto``.
        behind: Its source had records it had not handed out after the previous step (read
            ahead, or unread on the broker): :meth:`trainer.sources.Source.caught_up`.
        window: int64 words of window samples it sends to rank 0 now.
        rows_owned: Rows it owns.
        newest_ms: Newest Kafka append time among the records it read in the previous step
            (-1: none, or no time known).
    """

    stop: bool = False
    repartition: bool = False
    ready: bool = False
    checkpoint: bool = False
    diverged: bool = False
    publish: bool = False
    records: int = 0
    rows_not_held: int = 0
    samples: int = 0
    embedding_bytes: int = 0
    loop_bytes: int = 0
    hash_rows: int = 0
    behind: bool = False
    window: int = 0
    rows_owned: int = 0
    newest_ms: int = -1


@dataclass
class Control:
    """What every rank decided together before a step (the same on every rank)."""

    stop: bool = False
    repartition: bool = False
    ready: bool = False
    checkpoint: bool = False
    diverged: bool = False
    publish: bool = False
    records: int = 0
    rows_not_held: int = 0
    samples: int = 0
    embedding_bytes: int = 0
    loop_bytes: int = 0
    hash_rows: int = 0
    behind: int = 0
    window_words: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    trained: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rows_owned: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    newest_ms: int = -1


    @property
    def sample_imbalance(self) -> float | None:
        """Max / mean over ranks of the samples trained in the previous step (None: none)."""
        return _ratio(self.trained)

    @property
    def row_imbalance(self) -> float | None:
        """Max / mean over ranks of the rows owned (None: no rows yet)."""
        return _ratio(self.rows_owned)


def _ratio(values: np.ndarray) -> float | None:
    return float(values.max() / values.mean()) if values.size and values.sum() else None


def width(world: int) -> int:
    """Values in the control vector of a job of ``world`` ranks."""
    return _FLAGS + _SUMS + _PER_RANK * world


def encode(p: Proposal, rank: int, world: int) -> np.ndarray:
    """Rank ``rank``'s proposal as its addend of the control vector."""
    v = np.zeros(width(world), np.int64)
    v[:_FLAGS] = [p.stop, p.repartition, p.ready, p.checkpoint, p.diverged, p.publish]
    v[_FLAGS:_FLAGS + _SUMS] = [p.records, p.rows_not_held, p.samples, p.embedding_bytes,
                                p.loop_bytes, p.hash_rows, p.behind]
    base = _FLAGS + _SUMS
    v[base + rank] = p.window
    v[base + world + rank] = p.samples
    v[base + 2 * world + rank] = p.rows_owned
    v[base + 3 * world + rank] = p.newest_ms
    return v


def decode(v: np.ndarray, world: int) -> Control:
    """The decisions a summed control vector holds."""
    if v.shape != (width(world),):
        raise ValueError(f"a control vector of {world} ranks has {width(world)} values, "
                         f"not {v.shape}")
    base = _FLAGS + _SUMS
    return Control(stop=bool(v[0]), repartition=bool(v[1]), ready=bool(v[2]),
                   checkpoint=bool(v[3]), diverged=bool(v[4]), publish=bool(v[5]),
                   records=int(v[6]), rows_not_held=int(v[7]), samples=int(v[8]),
                   embedding_bytes=int(v[9]), loop_bytes=int(v[10]), hash_rows=int(v[11]),
                   behind=int(v[12]),
                   window_words=v[base:base + world].copy(),
                   trained=v[base + world:base + 2 * world].copy(),
                   rows_owned=v[base + 2 * world:base + 3 * world].copy(),
                   newest_ms=int(v[base + 3 * world:].max()))


def agree(comm: Comm, proposal: Proposal) -> Control:
    """Sum every rank's proposal and decode it (collective: every rank calls it)."""
    v = encode(proposal, comm.rank, comm.world)
    return decode(comm.host_all_reduce_sum(v, "control"), comm.world)  # host to host
