"""Observers: what tests, benchmarks and probes see of a run, from outside it.

A run calls its observers at fixed points, on every rank: once it starts, after every trained
step, after every migration chunk, once a checkpoint's rows are written (before its manifest),
and at its end, where each returns plain data that travels back with the rank's result
(:attr:`hetgmp.trainer.run.job.RankResult.observed`). Production code never asks what they are: a crash
test's fault is an observer that kills its rank at a chosen point, the chaos benchmark's ledger
one that appends each step's records to a file, an exactness test's model one that returns the
rank's rows at the end (:mod:`hetgmp.trainer.testing` holds them).

A job names its observers as factories (:attr:`hetgmp.trainer.run.job.Job.observers`): each rank builds its
own (a spawned rank unpickles the factory; ranks that are threads share nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetgmp.streaming import ClickBatch
    from hetgmp.trainer.dist import Comm, StepCounters
    from hetgmp.trainer.step import Trainer

__all__ = ["Observer", "ObserverFactory", "Observers", "RunView"]


@dataclass
class RunView:
    """What an observer may look at: the rank, its collectives and its trainer.

    Attributes:
        rank: This rank.
        world: Ranks in the job.
        comm: The job's collectives (an observer that uses one must be on every rank, called at
            the same point: every observer is).
        trainer: The rank's trainer (rows, placement, replicas, exchange).
    """

    rank: int
    world: int
    comm: Comm
    trainer: Trainer


class Observer:
    """Sees a run at fixed points; each method does nothing unless overridden."""

    def on_start(self, run: RunView) -> None:
        """The run is about to take its first step (the trainer is built and restored)."""

    def on_step(self, batch: ClickBatch, counters: StepCounters) -> None:
        """A step trained ``batch`` (the records this rank read for it; routing may have
        trained them elsewhere) with these counters."""

    def on_migration_chunk(self, chunks: int, finished: bool) -> None:
        """This rank moved the ``chunks``-th chunk of the migration in progress (collective
        point: every rank is here); ``finished``: it was the last."""

    def on_checkpoint_rows(self, count: int) -> None:
        """The ``count``-th checkpoint of this run has this rank's rows on disk, and its
        manifest is not written yet."""

    def on_end(self, run: RunView) -> dict[str, Any]:
        """The run is over (scored, totals gathered): what this observer reports, plain data
        (collective point)."""
        return {}


ObserverFactory = Callable[[int], Observer]


class Observers(Observer):
    """Several observers, called in order; their reports merged (later keys win)."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.observers = list(observers)

    @classmethod
    def build(cls, factories: Sequence[ObserverFactory], rank: int) -> Observers:
        """This rank's observers from a job's factories."""
        return cls([make(rank) for make in factories])

    def on_start(self, run: RunView) -> None:
        for o in self.observers:
            o.on_start(run)

    def on_step(self, batch: ClickBatch, counters: StepCounters) -> None:
        for o in self.observers:
            o.on_step(batch, counters)

    def on_migration_chunk(self, chunks: int, finished: bool) -> None:
        for o in self.observers:
            o.on_migration_chunk(chunks, finished)

    def on_checkpoint_rows(self, count: int) -> None:
        for o in self.observers:
            o.on_checkpoint_rows(count)

    def on_end(self, run: RunView) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for o in self.observers:
            out.update(o.on_end(run))
        return out
