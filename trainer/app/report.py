"""A self-contained HTML report: charts drawn by matplotlib, a summary table with units.

matplotlib renders each chart to a PNG embedded in the page, so the report is one file that any
browser shows the same way, with no script to run; the ``data-plot`` attribute of each figure
gives its plot area in the image's pixels, which is how the browser test finds where each chart
must show data. Rates come from cumulative counters over a trailing window (:func:`rates`), so
a scrape that saw no new step is not a gap; what has no value is left out, never drawn as 0.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from hetgmp.trainer.app.jsonout import strict_json

__all__ = ["Chart", "Series", "rates", "ratios", "render", "write_report"]

_WIDTH_IN, _HEIGHT_IN, _DPI = 9.0, 3.2, 100
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


@dataclass
class Series:
    """One line (or set of bars) of a chart."""

    name: str
    x: Sequence[float] | np.ndarray
    y: Sequence[float] | np.ndarray
    bars: bool = False


@dataclass
class Chart:
    """A chart: series, axis labels with units, and vertical marks (e.g. new placements)."""

    title: str
    x_label: str
    y_label: str
    series: list[Series]
    marks: list[float] = field(default_factory=list)
    mark_label: str = ""


def _trailing(t: np.ndarray, window_s: float) -> np.ndarray:
    """For each sample, the index of the first sample at most ``window_s`` before it."""
    return np.searchsorted(t, t - window_s, side="left")


def rates(t: Sequence[float], counter: Sequence[float], window_s: float = 5.0
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per-second rate of a cumulative counter over a trailing window, at each sample (the
    first ``window_s`` seconds, with too little history, are left out)."""
    tt, c = np.asarray(t, np.float64), np.asarray(counter, np.float64)
    if tt.size < 2:
        return tt[:0], tt[:0]
    lo = _trailing(tt, window_s)
    dt = tt - tt[lo]
    keep = dt >= 0.5 * window_s
    return tt[keep], (c[keep] - c[lo][keep]) / dt[keep]


def ratios(t: Sequence[float], num: Sequence[float], den: Sequence[float],
           window_s: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """Ratio of what two cumulative counters gained over a trailing window (where the second
    gained anything)."""
    tt = np.asarray(t, np.float64)
    n, d = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if tt.size < 2:
        return tt[:0], tt[:0]
    lo = _trailing(tt, window_s)
    gained = d - d[lo]
    keep = (gained > 0) & (tt - tt[lo] >= 0.5 * window_s)
    return tt[keep], (n[keep] - n[lo][keep]) / gained[keep]


def render(chart: Chart) -> tuple[bytes, tuple[int, int, int, int]]:
    """The chart as PNG bytes, and its plot area ``(left, top, right, bottom)`` in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(_WIDTH_IN, _HEIGHT_IN), dpi=_DPI)
    try:
        drawn = False
        for i, s in enumerate(chart.series):
            x, y = np.asarray(s.x, np.float64), np.asarray(s.y, np.float64)
            ok = np.isfinite(x) & np.isfinite(y)
            if not ok.any():
                continue
            drawn = True
            color = _COLORS[i % len(_COLORS)]
            if s.bars:
                width = max(np.ptp(x[ok]) / max(ok.sum(), 1) * 0.6, 1e-9) if ok.sum() > 1 else 1
                ax.bar(x[ok], y[ok], width=width, color=color, label=s.name)
            else:
                ax.plot(x[ok], y[ok], color=color, linewidth=1.8, label=s.name,
                        marker="o" if ok.sum() < 3 else None)
        for j, m in enumerate(chart.marks):
            ax.axvline(m, color="#999999", linestyle=":", linewidth=1,
                       label=chart.mark_label if j == 0 and chart.mark_label else None)
        if not drawn:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center",
                    color="#888888")
        ax.set_title(chart.title, fontsize=11, loc="left")
        ax.set_xlabel(chart.x_label)
        ax.set_ylabel(chart.y_label)
        ax.grid(False)
        if drawn:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
        fig.tight_layout()
        fig.canvas.draw()
        box = ax.get_window_extent()
        height = fig.get_figheight() * _DPI
        area = (int(box.x0), int(height - box.y1), int(box.x1), int(height - box.y0))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=_DPI)
        return buf.getvalue(), area
    finally:
        plt.close(fig)


def _cell(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    return html.escape(str(value))


def write_report(directory: Path, title: str, summary: list[tuple[str, Any]],
                 charts: list[Chart], notes: list[str], data: dict[str, Any]) -> Path:
    """Write ``report.html`` (summary, notes, charts) and ``report.json`` (``data`` and the
    charts' series); returns the HTML path."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{_cell(v)}</td></tr>"
                     for k, v in summary)
    figures = []
    for c in charts:
        png, (left, top, right, bottom) = render(c)
        figures.append(
            f"<figure class='chart' data-plot='{left},{top},{right},{bottom}'>"
            f"<img width='{int(_WIDTH_IN * _DPI)}' height='{int(_HEIGHT_IN * _DPI)}' "
            f"alt='{html.escape(c.title)}' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode()}'></figure>")
    page = ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:24px;max-width:1000px}"
            "table{border-collapse:collapse;margin-bottom:16px}"
            "th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}"
            "th{font-weight:normal;color:#444}figure{margin:0 0 12px 0}"
            "</style></head><body>"
            f"<h1>{html.escape(title)}</h1><table>{rows}</table>"
            + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
            + "".join(figures) + "</body></html>")
    path = directory / "report.html"
    path.write_text(page, encoding="utf-8")
    charts_data = [{"title": c.title, "marks": list(c.marks),
                    "series": [{"name": s.name, "x": [float(x) for x in s.x],
                                "y": [float(y) for y in s.y]} for s in c.series]}
                   for c in charts]
    body = {"title": title, **data, "notes": notes, "charts": charts_data}
    (directory / "report.json").write_text(json.dumps(strict_json(body), indent=1),
                                           encoding="utf-8")
    return path

