"""``--route-rounds -1`` (the default): batch-aware routing where it pays, measured on the job.

Batch-aware routing (:func:`hetgmp.partitioner.route_batch`) gathers the samples of a rank's batch
where their rows are fetched anyway. It saved 15-20 points of remote rows on a real user-item
log and under 1% on the synthetic streams at 2 ranks, for 4-6 ms a step of host time either
way: whether it pays is a property of the stream and of the cost of a row on the wire, so the
rank measures both on its own batches instead of guessing.

* **Saving.** On a measured step the rank routes its batch both ways (``route``, then the
  rounds of moves on top, which is what ``route_batch`` does anyway) and counts the rows each
  answer has all ranks fetch for this batch (:func:`hetgmp.partitioner.refine_counted` counts both on
  the way). The difference is the rows batch-aware routing saves, the rounds' time its cost.
* **Price of a row.** The step's row phases (read and write: the requests, the rows and their
  gradients, and the local reads and writes beside them) over the rows the rank did not hold
  (fetches and refreshes), summed over every step the rank trained. It charges the local work
  to the rows that travel, so it errs towards routing batch-aware.
* ``probe``: ``probe_steps`` steps routed batch-aware, every one measured. Batch-aware routing
  is kept (``on``) when the rows saved a step times the price exceed the rounds' time a step;
  otherwise routing goes back to ``route`` (``off``).
* ``on``: every step is measured (the rounds count their rows on the way: it costs nothing);
  the decision is taken again every ``probe_steps * check_every`` steps.
* ``off``: nothing is measured; after a rest that doubles with each decision against (64 steps,
  then 128, up to 1,024) a new probe starts (``retried``).

Decisions are a rank's own: each rank routes only its own batch, so ranks need not agree (a
rank whose batches gain nothing stops paying for the rounds while others keep them).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hetgmp.partitioner import Placement, Samples, refine_counted, route

__all__ = ["AUTO_ROUNDS", "ROUTE_AUTO", "RouteChoice"]

log = logging.getLogger(__name__)

#: ``--route-rounds`` value that lets the rank choose (see the module docstring).
ROUTE_AUTO = -1
#: Rounds batch-aware routing runs with when the choice turns it on.
AUTO_ROUNDS = 3
_REST_FIRST, _REST_MAX = 64, 1024
_KEEP_DECISIONS = 32


@dataclass
class _Measure:
    """Measured steps since the last decision."""

    steps: int = 0
    rows_saved: int = 0
    rows_plain: int = 0
    seconds: float = 0.0

    def add(self, saved: int, plain: int, seconds: float) -> None:
        self.steps += 1
        self.rows_saved += saved
        self.rows_plain += plain
        self.seconds += seconds


class RouteChoice:
    """How one rank routes its batch: ``route`` or ``route_batch``, fixed or measured.

    Args:
        rounds: ``--route-rounds``: 0 (``route`` only), N > 0 (always N rounds) or
            :data:`ROUTE_AUTO`.
        rank: This rank (decisions are logged at INFO on rank 0, DEBUG elsewhere).
        clock: Monotonic seconds (tests pass a fake one).
        probe_steps: Measured steps a decision is taken on (8: the rows a step saves vary
            little from step to step, and each probe step pays for the rounds).
        check_every: While on, the decision is taken again every ``probe_steps`` times this
            many steps.
    """

    def __init__(self, rounds: int, rank: int = 0, clock: Callable[[], float] | None = None,
                 probe_steps: int = 8, check_every: int = 16) -> None:
        if rounds < ROUTE_AUTO:
            raise ValueError(f"route rounds {rounds}: must be >= 0, or {ROUTE_AUTO} for auto")
        if probe_steps < 1 or check_every < 1:
            raise ValueError("probe_steps and check_every must be positive")
        self.auto = rounds == ROUTE_AUTO
        self._fixed = 0 if self.auto else rounds
        self.rank = rank
        self._clock = clock or time.monotonic
        self.probe_steps, self.check_every = probe_steps, check_every
        self.state = "probe" if self.auto else ("on" if rounds else "off")
        self._measure = _Measure()
        self._steps_in_state = 0
        self._rest = _REST_FIRST
        self._row_seconds = 0.0
        self._rows_fetched = 0
        #: The last decisions taken, oldest first (for the run report), and how many in all.
        self.decisions: deque[dict[str, object]] = deque(maxlen=_KEEP_DECISIONS)
        self.decisions_total = 0
        self.last: dict[str, object] | None = None

    @property
    def rounds(self) -> int:
        """Rounds of moves this step's batch gets (0: ``route`` alone)."""
        if not self.auto:
            return self._fixed
        return AUTO_ROUNDS if self.state in ("probe", "on") else 0

    @property
    def measuring(self) -> bool:
        """Whether this step's rounds count toward a decision (auto, probing or on)."""
        return self.auto and self.state in ("probe", "on")

    @property
    def price(self) -> float | None:
        """Seconds of the row phases per row not held, as measured (None: no row fetched yet)."""
        return self._row_seconds / self._rows_fetched if self._rows_fetched else None

    def destinations(self, samples: Samples, placement: Placement, epsilon: float
                     ) -> np.ndarray:
        """Where each sample of the rank's batch goes this step (and the measure, if due)."""
        plain = route(samples, placement, epsilon)
        rounds = self.rounds
        if not rounds:
            return plain
        began = self._clock()
        dest, before, after = refine_counted(samples, placement, plain, epsilon, rounds)
        seconds = self._clock() - began
        if self.measuring:
            self._measure.add(before - after, before, seconds)
        return dest

    def on_step(self, row_seconds: float, rows_not_held: int, routed: bool) -> None:
        """Count one trained step: its row phases' seconds and the rows it did not hold (the
        price), and, when ``routed`` (samples went through :meth:`destinations`), advance the
        choice."""
        self._row_seconds += max(row_seconds, 0.0)
        self._rows_fetched += max(int(rows_not_held), 0)
        if not self.auto or not routed:
            return
        self._steps_in_state += 1
        if self.state == "off":
            if self._steps_in_state >= self._rest:
                self._enter("probe")
            return
        due = self.probe_steps * (1 if self.state == "probe" else self.check_every)
        if self._measure.steps >= due:
            self._decide()

    def gauges(self) -> dict[str, float]:
        """``rounds`` in force, and the last decision's saving and cost in seconds a step."""
        out: dict[str, float] = {"rounds": float(self.rounds)}
        if self.last is not None:
            for key in ("seconds_saved_per_step", "seconds_cost_per_step"):
                value = self.last.get(key)
                if isinstance(value, float):
                    out[key] = value
        return out

    def report(self) -> dict[str, object]:
        """For the run report: the mode, what is in force and every decision."""
        return {"mode": "auto" if self.auto else "fixed", "state": self.state,
                "rounds": self.rounds, "decisions_total": self.decisions_total,
                "decisions": list(self.decisions)}

    def _decide(self) -> None:
        m = self._measure
        price = self.price or 0.0
        saved = m.rows_saved / m.steps
        share = m.rows_saved / m.rows_plain if m.rows_plain else 0.0
        saved_s, cost_s = saved * price, m.seconds / m.steps
        pays = saved_s > cost_s
        if pays:
            self._rest = _REST_FIRST
        elif self.last is not None and self.last["decision"] == "off":  # against again
            self._rest = min(2 * self._rest, _REST_MAX)
        what = "on" if pays else "off"
        self._enter(what, {"rows_saved_per_step": round(saved, 2),
                           "rows_saved_share": round(share, 4), "seconds_per_row": price,
                           "seconds_saved_per_step": saved_s, "seconds_cost_per_step": cost_s})
        log.log(self._level, "batch-aware routing %s: it saves %.1f rows a step (%.1f%%), "
                "%.2f ms at %.1f us a row, for %.2f ms of routing a step%s", what, saved,
                100 * share, 1e3 * saved_s, 1e6 * price, 1e3 * cost_s,
                "" if pays else f"; measured again in {self._rest} steps")

    @property
    def _level(self) -> int:
        return logging.INFO if self.rank == 0 else logging.DEBUG

    def _enter(self, state: str, entry: dict[str, object] | None = None) -> None:
        """Take a decision (``entry``: what it weighed) or, without one, start a new probe."""
        self.state, self._steps_in_state, self._measure = state, 0, _Measure()
        self.decisions_total += 1
        if entry is None:
            self.decisions.append({"decision": "retried"})
            log.log(self._level, "batch-aware routing: measuring again after %d steps off",
                    self._rest)
            return
        entry = {"decision": state, **entry}
        if state == "off":
            entry["rest_steps"] = self._rest
        self.decisions.append(entry)
        self.last = entry
