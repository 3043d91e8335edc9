"""The demo's live view: the job's figures over the last few seconds, redrawn in place on a
terminal (a line every few seconds otherwise)."""

from __future__ import annotations

import math
from typing import Any

from hetgmp.trainer.app.report import rates
from hetgmp.trainer.app.scrape import Snapshot, Timeline, window_quantile

__all__ = ["LiveView", "rate", "recent"]


def recent(tl: Timeline, span: float = 5.0) -> tuple[Snapshot, Snapshot]:
    """The first snapshot of the last ``span`` seconds, and the last one."""
    last = tl.snaps[-1]
    return next((s for s in tl.snaps if s.t >= last.t - span), tl.snaps[0]), last


def rate(tl: Timeline, attr: str, span: float = 5.0) -> float:
    """Per second over the last ``span`` seconds, of a counter of the snapshots (0 with too
    little history)."""
    _, values = rates([s.t for s in tl.snaps], [getattr(s, attr) for s in tl.snaps], span)
    return float(values[-1]) if values.size else 0.0


class LiveView:
    """Draws the view of a :class:`Timeline`.

    Args:
        out: Where to write (a terminal, or a log).
        tty: Redraw in place (else one line a call).
        duration_s: The demo's length.
        backend: How the ranks train (e.g. ``2 rank(s), CPU/gloo``).
        staleness: The bound ``s``.
        urls: The ranks' metrics endpoints.
    """

    def __init__(self, out: Any, tty: bool, duration_s: float, backend: str, staleness: int,
                 urls: list[str]) -> None:
        self.out, self.tty, self.duration_s = out, tty, duration_s
        self.backend, self.staleness, self.urls = backend, staleness, urls
        self._drawn = False

    def lines(self, tl: Timeline) -> list[str]:
        """The view's lines for the newest snapshot."""
        first, s = recent(tl)
        trained = s.trained - first.trained
        rrps = (s.not_held - first.not_held) / trained if trained > 0 else math.nan
        loss = (s.loss_sum - first.loss_sum) / trained if trained > 0 else math.nan
        produced = tl.produced[-1][1] if tl.produced else 0
        stale50 = window_quantile(s.staleness, first.staleness, 0.5)
        stale99 = window_quantile(s.staleness, first.staleness, 0.99)
        fresh99 = window_quantile(s.freshness, first.freshness, 0.99)
        ckpt = f"{s.checkpoint_age:.0f} s ago" if s.checkpoint_age == s.checkpoint_age \
            else "none yet"
        migrating = "  (migrating now)" if s.migrating_steps > first.migrating_steps else ""
        return [
            f"hetgmp demo  {s.t:6.1f}s / {self.duration_s:.0f}s   {self.backend}   placement "
            f"v{s.version:.0f}   repartitions {s.repartitions:.0f}",
            f"  stream     produced {produced:>10,}   consumed {s.consumed:>10,.0f}   trained "
            f"{s.trained:>10,.0f}   {rate(tl, 'trained'):>7,.0f} samples/s",
            f"  placement  remote rows/sample {rrps:5.2f}   rows migrated {s.migrated:>9,.0f}   "
            f"steps trained during migrations {s.migrating_steps:.0f}{migrating}",
            f"  replicas   staleness p50 {stale50:.0f}  p99 {stale99:.0f} (bound "
            f"{self.staleness})   refreshes {rate(tl, 'refreshes'):,.0f}/s   pushes "
            f"{rate(tl, 'pushes'):,.0f}/s",
            f"  model      loss {loss:.4f}   rolling AUC {_aucs(s)}   freshness p99 <= "
            f"{fresh99:.2g} s   checkpoint {ckpt}",
            self._serving(tl, first, s),
            f"  metrics    {'  '.join(self.urls)}",
        ]

    def _serving(self, tl: Timeline, first: Snapshot, s: Snapshot) -> str:
        if not s.serve_latency and s.serve_lag != s.serve_lag:
            return "  serving    hetgmp serve starts once the first checkpoint is written"
        def ms(q: float) -> str:
            x = window_quantile(s.serve_latency, first.serve_latency, q) * 1000
            return f"{x:.0f} ms" if x == x else "–"

        lag = f"{s.serve_lag:.1f} s" if s.serve_lag == s.serve_lag else "–"
        return (f"  serving    model lag {lag}   latency p50 <= {ms(0.5)}  p99 <= {ms(0.99)}   "
                f"{rate(tl, 'serve_scored'):>7,.0f} records/s scored")

    def draw(self, tl: Timeline, final: bool = False) -> None:
        """Draw (or redraw) the view."""
        lines = self.lines(tl)
        if self.tty:
            prefix = f"\x1b[{len(lines)}F" if self._drawn else ""
            self.out.write(prefix + "\n".join(line + "\x1b[K" for line in lines) + "\n")
            self._drawn = not final
        else:
            self.out.write(" | ".join(line.strip() for line in lines[:-1]) + "\n")
        self.out.flush()


def _aucs(s: Snapshot) -> str:
    """The rolling AUC: each task's with several labels."""
    if not s.task_auc:
        return f"{s.auc:.4f}"
    return "  ".join(f"{task} {auc:.4f}" for task, auc in s.task_auc.items())
