"""The control vector: what every rank decides together, once before every step.

Each rank fills a :class:`Proposal` with what it knows (a stop request, what rank 0's
partitioner and checkpoint clock say, what it read and trained in the previous step); one
all-reduce of one small int64 vector combines the proposals, and every rank decodes the same
:class:`Control`. So every decision (stop, repartition, switch placement, checkpoint) is taken by
every rank at the same step, without a message of its own.

Wire format, 18 int64 values whatever the ranks, the first 15 summed over ranks and the last 3
combined by their maximum::

    0 stop | 1 repartition | 2 ready | 3 checkpoint | 4 diverged | 5 publish   (flags)
    6 records | 7 rows not held | 8 samples trained         (the previous step, summed)
    9 embedding-path bytes | 10 the loop's window, placement and migration bytes (sent since
      the previous control round) | 11 rows the previous step's batches fetch under hash
                                                        (summed; --placement auto)
    12 ranks whose source was not caught up with its log after the previous step
    13 window words the ranks send to rank 0 now | 14 rows owned           (summed)
    15 most samples a rank trained in the previous step | 16 most rows a rank owns
    17 newest Kafka append time (ms) read in the previous step, -1 none     (maxima)

It held every rank's window words, samples, rows and append time until the scale benchmark
showed what that cost: ``4 * world`` values gathered by every rank made its bytes grow as the
square of the ranks (70 B a sample at 32 ranks, as much as the placement broadcast). The
imbalance and the newest time need a maximum, not every value; the window words only rank 0
needs, and :class:`~hetgmp.trainer.online.window.WindowFeed` sends them to it.

:func:`encode` and :func:`decode` are pure; :func:`agree` is the collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetgmp.trainer.dist import Comm

__all__ = ["Control", "Proposal", "agree", "combine", "decode", "encode", "width"]

_FLAGS = 6
_SUMS = 9
_MAXED = 3


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
            ahead, or unread on the broker): :meth:`hetgmp.trainer.sources.Source.caught_up`.
        window: int64 words of window samples it sends to rank 0 at the next exchange.
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
    window_words: int = 0
    newest_ms: int = -1
    sample_imbalance: float | None = None
    """Most samples a rank trained in the previous step over the mean rank's (None: none)."""
    row_imbalance: float | None = None
    """Most rows a rank owns over the mean rank's (None: no rows yet)."""


def _ratio(most: int, total: int, world: int) -> float | None:
    return most * world / total if total > 0 else None


def width() -> int:
    """Values in the control vector (the same for any number of ranks)."""
    return _FLAGS + _SUMS + _MAXED


def encode(p: Proposal) -> np.ndarray:
    """A rank's proposal as its share of the control vector."""
    return np.array([p.stop, p.repartition, p.ready, p.checkpoint, p.diverged, p.publish,
                     p.records, p.rows_not_held, p.samples, p.embedding_bytes, p.loop_bytes,
                     p.hash_rows, p.behind, p.window, p.rows_owned,
                     p.samples, p.rows_owned, p.newest_ms], np.int64)


def combine(shares: list[np.ndarray]) -> np.ndarray:
    """The control vector of every rank's share (what :func:`agree`'s all-reduce computes)."""
    stacked = np.stack(shares)
    return np.concatenate([stacked[:, :-_MAXED].sum(axis=0), stacked[:, -_MAXED:].max(axis=0)])


def decode(v: np.ndarray, world: int) -> Control:
    """The decisions a combined control vector holds, in a job of ``world`` ranks."""
    if v.shape != (width(),):
        raise ValueError(f"a control vector has {width()} values, not {v.shape}")
    return Control(stop=bool(v[0]), repartition=bool(v[1]), ready=bool(v[2]),
                   checkpoint=bool(v[3]), diverged=bool(v[4]), publish=bool(v[5]),
                   records=int(v[6]), rows_not_held=int(v[7]), samples=int(v[8]),
                   embedding_bytes=int(v[9]), loop_bytes=int(v[10]), hash_rows=int(v[11]),
                   behind=int(v[12]), window_words=int(v[13]),
                   sample_imbalance=_ratio(int(v[15]), int(v[8]), world),
                   row_imbalance=_ratio(int(v[16]), int(v[14]), world),
                   newest_ms=int(v[17]))


def agree(comm: Comm, proposal: Proposal) -> Control:
    """Combine every rank's proposal and decode it (collective: every rank calls it)."""
    v = comm.host_all_reduce_sum(encode(proposal), "control", max_last=_MAXED)  # host to host
    return decode(v, comm.world)
