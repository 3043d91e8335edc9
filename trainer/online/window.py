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

import numpy as np
import torch

from trainer.dist import Comm

__all__ = ["WindowFeed", "pack", "unpack"]


def pack(ids: np.ndarray) -> np.ndarray:
    """Samples' ids ``[n, fields]`` as one int64 message: ``n``, the number ``u`` of distinct
    ids, the ``u`` ids, then the ``n * fields`` positions (uint16, or uint32 past 65,536 ids)
    packed into int64 words. An empty batch is an empty message."""
    n = ids.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    distinct, inverse = np.unique(ids, return_inverse=True)
    positions = inverse.astype(_position_type(distinct.size)).ravel()
    raw = positions.tobytes()
    raw += b"\0" * (-len(raw) % 8)
    return np.concatenate([np.array([n, distinct.size], np.int64), distinct,
                           np.frombuffer(raw, np.int64)])


def unpack(message: np.ndarray, fields: int) -> np.ndarray:
    """The ids ``[n, fields]`` a :func:`pack` message holds."""
    if message.size == 0:
        return np.zeros((0, fields), np.int64)
    n, u = int(message[0]), int(message[1])
    distinct = message[2:2 + u]
    positions = np.ascontiguousarray(message[2 + u:]).view(_position_type(u))[:n * fields]
    return distinct[positions].reshape(n, fields)


def _position_type(distinct: int) -> type[np.unsignedinteger]:
    return np.uint16 if distinct <= 1 << 16 else np.uint32


class WindowFeed:
    """This rank's part of the window feed.

    Args:
        comm: Collectives of the job.
        fields: Ids per sample.
        window: Most samples rank 0 keeps waiting for the partitioner.
        sample: Fraction of the samples sent (1: all).
        seed: Seed of the sampling.
    """

    def __init__(self, comm: Comm, fields: int, window: int, sample: float = 1.0,
                 seed: int = 0) -> None:
        self.comm, self.fields, self.window, self.sample = comm, fields, window, sample
        self._out = np.zeros(0, np.int64)  # the next message to rank 0 (:func:`pack`)
        self._parts: list[np.ndarray] = []
        self._rng = np.random.default_rng(seed + 7919 * comm.rank)

    @property
    def outgoing(self) -> int:
        """int64 words this rank sends rank 0 at the next exchange."""
        return int(self._out.shape[0])

    @property
    def held(self) -> int:
        """Samples rank 0 holds for the next partition (less than ``window`` plus one step's)."""
        return sum(p.shape[0] for p in self._parts)

    def offer(self, ids: np.ndarray, routed_in: np.ndarray, dest: np.ndarray | None) -> None:
        """A step was trained: ``ids`` of the samples this rank read, ``routed_in`` those other
        ranks routed here, ``dest`` the rank each sample read here went to (None: unrouted)."""
        self._out = self._out[:0]
        if self.comm.rank == 0:
            mine = [self._sampled(ids), self._sampled(routed_in)]
            self._parts += [m for m in mine if m.shape[0]]
            # Trimmed here too: when no other rank sends samples (one without partitions), no
            # window exchange runs to trim them.
            self._trim()
        elif ids.shape[0]:
            keep = dest != 0 if dest is not None else slice(None)
            self._out = pack(self._sampled(ids[keep]))

    def exchange(self, window_words: np.ndarray) -> None:
        """Send what :meth:`offer` kept to rank 0 (collective: every rank calls it when the
        control vector's ``window_words``, the words each rank sends, are not all zero)."""
        send = np.zeros(self.comm.world, np.int64)
        send[0] = self._out.shape[0]
        recv = window_words if self.comm.rank == 0 else np.zeros(self.comm.world, np.int64)
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

    def take(self) -> list[np.ndarray]:
        """Rank 0: the samples gathered since the last call, oldest first."""
        parts, self._parts = self._parts, []
        return parts

    def _sampled(self, ids: np.ndarray) -> np.ndarray:
        if self.sample >= 1.0 or ids.shape[0] == 0:
            return ids
        return ids[self._rng.random(ids.shape[0]) < self.sample]

    def _trim(self) -> None:
        held = self.held
        while self._parts and held - self._parts[0].shape[0] >= self.window:
            held -= self._parts.pop(0).shape[0]
