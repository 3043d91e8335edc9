"""Test doubles and observers of the trainer, public so that tests and benchmarks share them.
No production module imports this one (``tests/test_layout.py`` checks).

:class:`StreamSource` is an endless click stream that looks like Kafka's to the trainer (offsets
per partition, append times) without a broker: for long runs that check what grows and what
does not. The observers (:mod:`hetgmp.trainer.online.observe`) see a run from outside:

* :class:`ReturnState`, :class:`RecordSteps`, :class:`RecordOffsets`: the rank's model, every
  step's counters, the ``(partition, offset)`` of every record trained, in ``observed``;
* :class:`AuditRun`: the replica read and owner update logs (the staleness bound recounted from
  them), and after every migration chunk a check that each row lives on exactly the rank the
  placement names (invariant 1);
* :class:`Ledgered`: each rank's own record of what it trained (:class:`Ledger`), which the chaos
  benchmark reads back to prove that no record was skipped across crashes;
* :class:`Fault` and :class:`FaultFile`: a rank that SIGKILLs itself at a chosen point, or at
  the next point a driver arms while the job runs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming import ClickBatch, SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist import StepCounters
from hetgmp.trainer.online import Observer, RunView
from hetgmp.trainer.sources import Source, synthetic_batch

__all__ = ["AuditRun", "Fault", "FaultFile", "Ledger", "Ledgered", "Paced", "RecordOffsets",
           "RecordSteps", "ReturnState", "StreamSource", "read_ledger"]

log = logging.getLogger(__name__)


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
        return ClickBatch.of_ids(b.labels, b.dense, b.ids, partitions, offsets, stamps)

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


FaultPoint = Literal["migration", "checkpoint", "spill"]


class _Sleeper(Observer):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step(self, batch: ClickBatch, counters: StepCounters) -> None:
        time.sleep(self.seconds)


@dataclass(frozen=True)
class Paced:
    """Every rank rests ``seconds`` after each step: records arriving at a bounded rate, as a
    live stream's do (an observer factory). A test of work that must keep pace with training,
    the partitioner's, then holds on a machine other processes load: training on records
    already in the topic outran a partitioner starved of CPU."""

    seconds: float

    def __call__(self, rank: int) -> Observer:
        return _Sleeper(self.seconds)


class _Killer(Observer):
    """SIGKILLs its rank at the first migration chunk (not a migration's last) or checkpoint
    for which ``due(at, count)`` says so."""

    def __init__(self, rank: int, due: Callable[[FaultPoint, int], bool]) -> None:
        self.rank, self.due = rank, due

    def on_migration_chunk(self, chunks: int, finished: bool) -> None:
        if not finished and self.due("migration", chunks):
            self._kill(f"in the middle of a migration (after chunk {chunks})")

    def on_checkpoint_rows(self, count: int) -> None:
        if self.due("checkpoint", count):
            self._kill(f"while writing checkpoint {count}")

    def _kill(self, what: str) -> None:
        log.warning("fault injection: rank %d kills itself %s", self.rank, what)
        os.kill(os.getpid(), signal.SIGKILL)


class _SpillKiller(_Killer):
    """SIGKILLs its rank half way through the ``count``-th write of rows to its disk tier
    (half the rows written), by wrapping ``DiskTier.put`` in the rank's process."""

    def __init__(self, rank: int, count: int) -> None:
        super().__init__(rank, lambda at, c: False)
        from hetgmp.trainer.embedding import DiskTier

        original: Any = DiskTier.put
        calls, killer = [0], self

        def put(tier: Any, ids: np.ndarray, *rows: Any) -> None:
            calls[0] += 1
            if calls[0] < count:
                return original(tier, ids, *rows)
            half = len(ids) // 2
            original(tier, ids[:half], *(r if r is None else r[:half] for r in rows))
            killer._kill(f"in the middle of spill {count} ({half} of {len(ids)} rows written)")

        setattr(DiskTier, "put", put)  # noqa: B010 (the rank's own process only)


@dataclass(frozen=True)
class Fault:
    """A rank that SIGKILLs itself at a chosen point (tests of crash recovery, the chaos bench):
    an observer factory (``Job(observers=(Fault(1, "checkpoint", 3),))``).

    Attributes:
        rank: The rank that dies.
        at: ``migration``: after moving ``count`` chunks of a migration (not its last);
            ``checkpoint``: in the ``count``-th checkpoint of the run, once its rows are
            written and before the manifest; ``spill``: half way through the ``count``-th
            write of rows to the rank's disk tier (ranks that are processes only).
        count: See ``at``.
    """

    rank: int
    at: FaultPoint = "migration"
    count: int = 1

    def __post_init__(self) -> None:
        if self.at not in ("migration", "checkpoint", "spill") or self.count < 1 \
                or self.rank < 0:
            raise ValueError(f"a fault needs at in (migration, checkpoint, spill), count >= 1 "
                             f"and a rank >= 0, got {self}")

    def __call__(self, rank: int) -> Observer:
        if self.at == "spill":
            return _SpillKiller(rank, self.count) if rank == self.rank else Observer()
        return _Killer(rank, lambda at, count: (rank, at, count) == (self.rank, self.at,
                                                                     self.count))


@dataclass(frozen=True)
class FaultFile:
    """A fault a driver arms while the job runs: a JSON file ``{"rank": r, "at": "migration" |
    "checkpoint"}``. The rank it names kills itself at the next such point. Whoever fires it
    removes the file first, so it fires once. An observer factory, as :class:`Fault`.

    Attributes:
        path: The file.
    """

    path: str

    def arm(self, rank: int, at: str) -> None:
        """Arm the fault (the driver's side): written whole, then renamed into place."""
        if at not in ("migration", "checkpoint"):
            raise ValueError(f"a fault is armed for a migration or a checkpoint, not {at!r}")
        path = Path(self.path)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": rank, "at": at}))
        os.replace(tmp, path)

    def due(self, rank: int, at: str) -> bool:
        """Whether ``rank`` dies now (the file names it and this point, and it claimed it)."""
        path = Path(self.path)
        try:
            armed = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        if (armed.get("rank"), armed.get("at")) != (rank, at):
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False  # another process fired it first
        return True

    def __call__(self, rank: int) -> Observer:
        return _Killer(rank, lambda at, _count: self.due(rank, at))


@dataclass(frozen=True)
class Ledgered:
    """Each rank appends what it trained to a :class:`Ledger` in ``directory`` (an observer
    factory)."""

    directory: str

    def __call__(self, rank: int) -> Observer:
        return _LedgerObserver(self.directory, rank)


class _LedgerObserver(Observer):
    def __init__(self, directory: str, rank: int) -> None:
        self.ledger = Ledger(directory, rank)

    def on_step(self, batch: ClickBatch, counters: StepCounters) -> None:
        self.ledger.add(batch)

    def on_end(self, run: RunView) -> dict[str, Any]:
        self.ledger.close()
        return {}


class ReturnState(Observer):
    """``observed["state"]``: the rank's model at the end (dense parameters, owned rows)."""

    def __init__(self, rank: int = 0) -> None:
        pass

    def on_end(self, run: RunView) -> dict[str, Any]:
        return {"state": run.trainer.state()}


class StoreTiers(Observer):
    """``observed["store"]``: the rank's store counts at the end (``EmbeddingStore.counts``:
    rows in each tier, created, evicted, spilled, restored)."""

    def __init__(self, rank: int = 0) -> None:
        pass

    def on_end(self, run: RunView) -> dict[str, Any]:
        return {"store": run.trainer.store.counts()}


class RecordSteps(Observer):
    """``observed["step_counters"]``: every step's counters."""

    def __init__(self, rank: int = 0) -> None:
        self.steps: list[StepCounters] = []

    def on_step(self, batch: ClickBatch, counters: StepCounters) -> None:
        self.steps.append(counters)

    def on_end(self, run: RunView) -> dict[str, Any]:
        return {"step_counters": self.steps}


class RecordOffsets(Observer):
    """``observed["trained_offsets"]``: int64 ``[n, 2]`` ``(partition, offset)`` of every
    record this rank read and had trained."""

    def __init__(self, rank: int = 0) -> None:
        self.parts: list[np.ndarray] = []

    def on_step(self, batch: ClickBatch, counters: StepCounters) -> None:
        if len(batch):
            self.parts.append(np.stack([batch.partitions.astype(np.int64), batch.offsets], 1))

    def on_end(self, run: RunView) -> dict[str, Any]:
        return {"trained_offsets": np.concatenate(self.parts) if self.parts
                else np.zeros((0, 2), np.int64)}


class AuditRun(Observer):
    """The replica read and owner update logs (``observed["audit"]``, the row exchange's
    :class:`~hetgmp.trainer.embedding.types.Audit`), and after the start of every migration and every
    chunk a check that each row lives on exactly the rank the placement in force names
    (invariant 1; ``observed["owner_checks"]`` counts them). Collective: on every rank."""

    def __init__(self, rank: int = 0) -> None:
        self.checks = 0
        self.run: RunView | None = None

    def on_start(self, run: RunView) -> None:
        self.run = run
        run.trainer.exchange.start_audit()

    def on_migration_chunk(self, chunks: int, finished: bool) -> None:
        assert self.run is not None
        tr = self.run.trainer
        held = self.run.comm.all_gather_object(tr.store.ids())
        every = np.concatenate(held)
        if np.unique(every).size != every.size:
            raise RuntimeError("invariant 1 broken: a row is held by two ranks")
        for rank, ids in enumerate(held):
            wrong = tr.placement.owner_of(ids) != rank
            if wrong.any():
                raise RuntimeError(f"invariant 1 broken: rank {rank} holds {int(wrong.sum())} "
                                   "rows another rank owns")
        self.checks += 1

    def on_end(self, run: RunView) -> dict[str, Any]:
        return {"audit": run.trainer.exchange.audit, "owner_checks": self.checks}
