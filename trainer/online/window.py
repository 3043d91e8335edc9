"""The window feed: every sample trained reaches rank 0's partitioner once, a little every step.

Rank 0 keeps the ids of the samples it read and of those other ranks routed to it; every other
rank sends rank 0 the ids of the samples it read and did not route to rank 0 (rank 0 holds those
already), or a ``sample`` fraction of them. Sending every step's share in the next step's
window all-to-all, rather than gathering the window when a partition is due, keeps every step
as long as the others. Rank 0 holds at most a window's worth for the partitioner.

A step's share travels compact (:func:`pack`): its distinct ids once, then each sample's ids as
16-bit (32-bit past 65,536 distinct) positions among them, instead of 8 bytes an id. A batch
repeats ids (hot rows, small vocabularies), so this sends 30-60% fewer bytes than the ids.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from hetgmp.streaming import ClickBatch
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.step import as_words, compact_ids, expand_ids, from_words

__all__ = ["WindowFeed", "pack", "unpack"]

Csr = tuple[np.ndarray, np.ndarray]
"""Samples as ``(indptr, ids)``: sample ``b`` read ``ids[indptr[b]:indptr[b + 1]]``."""


def pack(samples: Csr, fields: int) -> np.ndarray:
    """Samples as one int64 message: ``n``, ``fields`` when every sample has that many ids
    (else -1), each sample's id count (uint32, only with -1), then the ids compact (the
    distinct ones and 16-bit positions among them: :func:`hetgmp.trainer.step.compact_ids`). An
    empty batch is an empty message."""
    indptr, ids = samples
    n = indptr.size - 1
    if n == 0:
        return np.zeros(0, np.int64)
    sizes = np.diff(indptr)
    uniform = ids.size == n * fields and bool((sizes == fields).all())
    parts = [np.array([n, fields if uniform else -1], np.int64)]
    if not uniform:
        parts.append(as_words(sizes.astype(np.uint32)))
    parts.append(compact_ids(ids))
    return np.concatenate(parts)


def unpack(message: np.ndarray, fields: int) -> Csr:
    """The samples a :func:`pack` message holds."""
    if message.size == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    n, width = int(message[0]), int(message[1])
    indptr = np.zeros(n + 1, np.int64)
    at = 2
    if width >= 0:
        indptr[1:] = np.arange(1, n + 1, dtype=np.int64) * width
    else:
        sizes, at = from_words(message, at, np.uint32, n)
        np.cumsum(sizes, out=indptr[1:])
    return indptr, expand_ids(message, at, int(indptr[-1]))[0]


def _edges(samples: Csr) -> int:
    return int(samples[1].size)


class WindowFeed:
    """This rank's part of the window feed.

    Args:
        comm: Collectives of the job.
        fields: Sparse fields per sample.
        window: Rank 0 keeps at most ``window * fields`` ids of samples waiting for the
            partitioner (``window`` one-value samples; fewer when they carry lists).
        sample: Fraction of the samples sent (1: all).
        seed: Seed of the sampling.
        expand: What the window keeps of a batch sampled (the trainer's ``blocks``: a column
            of ids a block of each row, for tables of several widths); None: the batch.
    """

    def __init__(self, comm: Comm, fields: int, window: int, sample: float = 1.0,
                 seed: int = 0, expand: Callable[[ClickBatch], ClickBatch] | None = None) -> None:
        self.comm, self.fields, self.window, self.sample = comm, fields, window, sample
        self._expand = expand
        self._out = np.zeros(0, np.int64)  # the next message to rank 0 (:func:`pack`)
        self._parts: list[Csr] = []
        self._rng = np.random.default_rng(seed + 7919 * comm.rank)

    @property
    def outgoing(self) -> int:
        """int64 words this rank sends rank 0 at the next exchange."""
        return int(self._out.shape[0])

    @property
    def held(self) -> int:
        """Samples rank 0 holds for the next partition (about a window plus one step's)."""
        return sum(p[0].size - 1 for p in self._parts)

    def offer(self, batch: ClickBatch, routed_in: ClickBatch, dest: np.ndarray | None) -> None:
        """A step was trained: ``batch`` the samples this rank read, ``routed_in`` those other
        ranks routed here, ``dest`` the rank each sample read here went to (None: unrouted)."""
        self._out = self._out[:0]
        if self.comm.rank == 0:
            mine = [self._sampled(batch), self._sampled(routed_in)]
            self._parts += [m for m in mine if m[0].size > 1]
            # Trimmed here too: when no other rank sends samples (one without partitions), no
            # window exchange runs to trim them.
            self._trim()
        elif len(batch):
            kept = batch.take(dest != 0) if dest is not None else batch
            self._out = pack(self._sampled(kept), self.fields)

    def exchange(self) -> None:
        """Send what :meth:`offer` kept to rank 0 (collective: every rank calls it when the
        control vector's ``window_words``, the words all ranks send, is not 0).

        Each rank first tells rank 0 how many words it sends (one int64 each: rank 0 alone
        needs the counts, which the control vector no longer carries for every rank)."""
        world = self.comm.world
        to_zero = np.zeros(world, np.int64)
        to_zero[0] = 1
        counts = np.full(world, int(self.comm.rank == 0), np.int64)
        window_words = self.comm.host_all_to_all(
            np.array([self._out.shape[0]], np.int64), to_zero, counts, "window")
        send = np.zeros(world, np.int64)
        send[0] = self._out.shape[0]
        recv = window_words if self.comm.rank == 0 else np.zeros(world, np.int64)
        out = torch.from_numpy(np.ascontiguousarray(self._out)).to(self.comm.device)
        got = self.comm.all_to_all(out, send, recv, "window")
        self._out = self._out[:0]
        if self.comm.rank == 0 and got.numel():
            words = got.cpu().numpy()
            ends = np.cumsum(window_words)
            for start, end in zip(ends - window_words, ends):
                if end > start:
                    self._parts.append(unpack(words[start:end], self.fields))
        self._trim()

    def clear(self) -> None:
        """Drop what waits to be sent and what rank 0 holds (the feed stops)."""
        self._out = self._out[:0]
        self._parts = []

    def take(self) -> list[Csr]:
        """Rank 0: the samples gathered since the last call, oldest first."""
        parts, self._parts = self._parts, []
        return parts

    def _sampled(self, batch: ClickBatch) -> Csr:
        if self.sample < 1.0 and len(batch):
            batch = batch.take(self._rng.random(len(batch)) < self.sample)
        if self._expand is not None:
            batch = self._expand(batch)
        return batch.indptr, batch.values

    def _trim(self) -> None:
        held = sum(_edges(p) for p in self._parts)
        room = self.window * self.fields
        while self._parts and held - _edges(self._parts[0]) >= room:
            held -= _edges(self._parts.pop(0))
