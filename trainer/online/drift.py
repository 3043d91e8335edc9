"""Drift detection: repartition early when remote rows per sample rise above their level after
the last placement.

After a placement is in force (no migration, no partition under way), the mean of the first
``baseline_steps`` steps' remote rows per sample is the baseline; from then on an EWMA of the
measure is compared against ``baseline * (1 + threshold)``. Pure: the online loop feeds it one
value a step and asks.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DriftDetector"]

# Steps after a migration whose remote rows per sample set the drift baseline.
BASELINE_STEPS = 8
# Weight of the newest step in the running level compared against the baseline.
EWMA = 0.25


class DriftDetector:
    """Tracks remote rows per sample against the level a placement started at.

    Args:
        threshold: Relative rise that counts as drift (0: never).
    """

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.level: float | None = None
        self.baseline: float | None = None
        self._acc: list[float] = []

    def observe(self, value: float, settled: bool) -> None:
        """Count one step's remote rows per sample; ``settled``: a placement computed from the
        stream is in force, with no migration and no partition under way."""
        self.level = value if self.level is None else (1 - EWMA) * self.level + EWMA * value
        if self.baseline is None and settled:
            self._acc.append(value)
            if len(self._acc) >= BASELINE_STEPS:
                self.baseline = float(np.mean(self._acc))
                self.level = self.baseline

    def reset(self) -> None:
        """A new placement is on its way: its baseline is measured afresh."""
        self.baseline, self._acc = None, []

    def drifted(self) -> bool:
        """The level rose ``threshold`` above the baseline."""
        if not self.threshold or self.baseline is None or self.level is None:
            return False
        return self.level > self.baseline * (1 + self.threshold)

    @property
    def rise(self) -> float:
        """How far the level stands above the baseline, as a fraction (0 without one)."""
        if self.baseline is None or self.level is None:
            return 0.0
        return self.level / max(self.baseline, 1e-9) - 1
