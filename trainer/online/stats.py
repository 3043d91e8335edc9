"""What the online loop saw, in bounded memory: steps, events, freshness.

A run may last for days, so nothing here grows with the records or the steps: the per-step
history keeps the most recent ``history`` steps, the event log the most recent ``events``
events, and freshness (a record's append to Kafka to the end of the step that applied its
gradient) is a histogram over log-spaced bins from 1 ms to 3 hours, 48 bins a decade, whose
percentiles are within 2.5% of the exact ones (the bin's geometric middle is reported).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FreshnessHistogram", "LoopStats", "StepRecord"]

_FRESH_LO, _FRESH_HI, _PER_DECADE = 1e-3, 1e4, 48


@dataclass
class StepRecord:
    """One step of one rank, for benchmarks and reports."""

    step: int
    records: int
    rows_not_held: int
    samples: int
    bytes_sent: int
    seconds: float
    migrating: bool
    version: int
    embedding_bytes: int = 0  # sent on the embedding path (routes, headers, rows, gradients)


class FreshnessHistogram:
    """Seconds from append to applied, counted in log-spaced bins (bounded memory)."""

    def __init__(self) -> None:
        decades = math.log10(_FRESH_HI / _FRESH_LO)
        self.edges = _FRESH_LO * 10 ** (np.arange(int(decades * _PER_DECADE) + 1) / _PER_DECADE)
        # Bin 0 holds what is below the first edge, the last bin what is past the last one.
        self.counts = np.zeros(self.edges.size + 1, np.int64)

    def add(self, seconds: np.ndarray) -> None:
        """Count each value."""
        if seconds.size:
            self.counts += np.bincount(np.searchsorted(self.edges, seconds, side="right"),
                                       minlength=self.counts.size)

    @property
    def count(self) -> int:
        """Values counted."""
        return int(self.counts.sum())

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (NaN without values)."""
        n = self.count
        if not n:
            return math.nan
        i = int(np.searchsorted(np.cumsum(self.counts), q / 100 * n, side="left"))
        i = min(max(i, 1), self.edges.size - 1)  # under- and overflow read as the end bins
        return float(math.sqrt(self.edges[i - 1] * self.edges[i]))


class LoopStats:
    """The loop's record of one rank's run.

    Args:
        history: Most recent steps kept.
        events: Most recent events kept.
        started_ms: Wall time the loop started (records appended before it are a backlog).
    """

    def __init__(self, history: int = 20_000, events: int = 10_000,
                 started_ms: float = 0.0) -> None:
        self.history: collections.deque[StepRecord] = collections.deque(maxlen=history)
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=events)
        self.freshness = FreshnessHistogram()
        # The part of freshness a batch costs: a record's wait for the newest record of its
        # step's batch (on this rank) to be appended, the batch filling up behind it.
        self.fill = FreshnessHistogram()
        self.backlog = 0
        self.placements = 0
        self.sample_imbalance = 1.0
        self.row_imbalance = 1.0
        self._started_ms = started_ms

    def event(self, name: str, **fields: Any) -> None:
        """Log one event (repartition, placement, migration, checkpoint, drift)."""
        self.events.append({"event": name, **fields})

    def freshness_of(self, stamps_ms: np.ndarray, now_ms: float) -> np.ndarray:
        """Count the freshness of records appended at ``stamps_ms`` (unknown: <= 0) whose
        gradients are applied now; returns the seconds of those appended after the loop began
        (the others waited for the job to start: a backlog, counted apart)."""
        stamps = stamps_ms[stamps_ms > 0]
        if not stamps.size:
            return np.zeros(0)
        fresh = np.maximum(now_ms - stamps, 0.0) / 1000.0
        live = stamps >= self._started_ms
        self.backlog += int(stamps.size - live.sum())
        self.freshness.add(fresh[live])
        self.fill.add((stamps.max() - stamps[live]) / 1000.0)
        return fresh[live]

    def report(self) -> dict[str, Any]:
        """Plain data (it travels back from spawned ranks)."""
        f = self.freshness
        return {
            "history": [dataclasses.astuple(h) for h in self.history],
            "history_fields": [fl.name for fl in dataclasses.fields(StepRecord)],
            "events": list(self.events),
            "placements": self.placements,
            "freshness_p50_s": f.percentile(50),
            "freshness_p99_s": f.percentile(99),
            "freshness_count": f.count,
            "freshness_backlog": self.backlog,
            "batch_fill_p50_s": self.fill.percentile(50),
            "batch_fill_p99_s": self.fill.percentile(99),
        }
