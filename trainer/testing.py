"""Test doubles and probes of the trainer, public so that tests and benchmarks share them.

:class:`StreamSource` is an endless click stream that looks like Kafka's to the trainer (offsets
per partition, append times) without a broker: for long runs that check what grows and what
does not. :class:`Ledger` is each rank's own record of what it trained (``Hooks.ledger``), which
the chaos benchmark reads back to prove that no record was skipped across crashes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from streaming import ClickBatch, SyntheticConfig, SyntheticStream
from streaming.runtime import Clock, SystemClock
from trainer.sources import Source, synthetic_batch

__all__ = ["FaultFile", "Ledger", "StreamSource", "read_ledger"]


class StreamSource(Source):
    """``steps`` batches of ``batch`` records of the synthetic stream, each stamped with the
    clock's time as its append time, in ``partitions`` partitions with increasing offsets.

    Args:
        config: The synthetic stream (a large vocabulary keeps new ids coming).
        batch: Records per batch.
        steps: Batches before the source ends.
        partitions: Partitions the records are spread over, round robin.
        clock: Where append times come from.
    """

    def __init__(self, config: SyntheticConfig, batch: int, steps: int, partitions: int = 4,
                 clock: Clock | None = None) -> None:
        self.schema = config.schema
        self._stream = SyntheticStream(config)
        self._batch, self._steps, self._parts = batch, steps, partitions
        self._clock = clock or SystemClock()
        self._next = 0
        self._handed: list[dict[int, int]] = []
        self._trained: dict[int, int] = {}

    @property
    def exhausted(self) -> bool:
        return self._next >= self._steps

    @property
    def topic(self) -> str:
        return "stream"

    def next_batch(self, cap: int | None = None) -> ClickBatch:
        if self.exhausted:
            return ClickBatch.empty(self.schema)
        start = self._next * self._batch
        b = synthetic_batch(self._stream, start, self._batch)
        index = np.arange(start, start + self._batch)
        partitions = (index % self._parts).astype(np.int32)
        offsets = index // self._parts
        stamps = np.full(self._batch, int(self._clock.time() * 1000), np.int64)
        self._next += 1
        self._handed.append({p: int(offsets[partitions == p].max()) + 1
                             for p in range(self._parts) if (partitions == p).any()})
        return ClickBatch(b.labels, b.dense, b.ids, partitions, offsets, stamps)

    def mark_trained(self) -> None:
        if self._handed:
            self._trained.update(self._handed.pop(0))

    def snapshot(self) -> dict[int, int]:
        return dict(self._trained)

    def commit(self, offsets: Mapping[int, int]) -> bool:
        return True


class Ledger:
    """One rank's append-only record of every record it read and had trained, step by step
    (routing may train a record on another rank: the rank that read it records it).

    Each step appends int64 rows ``(unix ms, partition, offset, records)``: the records of the
    step from each (partition, message offset). The file is opened with ``O_APPEND`` and written
    with one ``write`` a step, so what a SIGKILL leaves is every step whose write returned: a
    step the rank trained and then died before writing is not in it, and is trained again after
    the resume (its effect was in no checkpoint either).

    Args:
        directory: Where this run's ledgers go (one file per rank, ``rank-R-pid-P.i64``; a
            driver gives each run a directory of its own).
        rank: This rank.
    """

    WIDTH = 4

    def __init__(self, directory: str | os.PathLike[str], rank: int) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"rank-{rank:03d}-pid-{os.getpid()}.i64"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def add(self, batch: ClickBatch) -> None:
        """One trained step's records."""
        if not len(batch):
            return
        keys = np.stack([batch.partitions.astype(np.int64), batch.offsets], axis=1)
        uniq, counts = np.unique(keys, axis=0, return_counts=True)
        rows = np.empty((uniq.shape[0], self.WIDTH), np.int64)
        rows[:, 0] = int(time.time() * 1000)
        rows[:, 1:3] = uniq
        rows[:, 3] = counts
        os.write(self._fd, rows.tobytes())

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_ledger(path: str | os.PathLike[str]) -> np.ndarray:
    """int64 ``[n, 4]`` rows of a ledger file (a torn last row, if any, left out)."""
    data = np.fromfile(path, dtype=np.int64)
    return data[: data.size // Ledger.WIDTH * Ledger.WIDTH].reshape(-1, Ledger.WIDTH)


class FaultFile:
    """A fault a driver arms while the job runs: a JSON file ``{"rank": r, "at": "migration" |
    "checkpoint"}``. The rank it names kills itself at the next such point (the ``count`` a
    :class:`~trainer.types.Fault` has is not used: the next point is the one). Whoever fires
    it removes the file first, so it fires once.

    Args:
        path: The file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def arm(self, rank: int, at: str) -> None:
        """Arm the fault (the driver's side): written whole, then renamed into place."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": rank, "at": at}))
        os.replace(tmp, self.path)

    def due(self, rank: int, at: str, count: int) -> bool:
        """Whether ``rank`` dies now (the file names it and this point, and it claimed it)."""
        try:
            armed = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return False
        if (armed.get("rank"), armed.get("at")) != (rank, at):
            return False
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False  # another process fired it first
        return True
