"""A self-contained HTML report with inline SVG line charts (no plotting library needed)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["Series", "Chart", "write_report", "svg_chart"]

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


@dataclass
class Series:
    """One line of a chart."""

    name: str
    x: Sequence[float]
    y: Sequence[float]


@dataclass
class Chart:
    """A line chart: series, axis labels, and vertical marks (e.g. repartition times)."""

    title: str
    x_label: str
    y_label: str
    series: list[Series]
    marks: list[float] = field(default_factory=list)
    mark_label: str = ""


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    return [lo + i * step for i in range(n + 1)]


def svg_chart(chart: Chart, width: int = 720, height: int = 260) -> str:
    """The chart as an SVG element."""
    left, right, top, bottom = 60, 150, 30, 40
    pts = [(x, y) for s in chart.series for x, y in zip(s.x, s.y)]
    if not pts:
        return f"<p>{html.escape(chart.title)}: no data</p>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(p[1] for p in pts)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 * 1.05 if y1 > y0 else y0 + 1
    sx = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)  # noqa: E731
    sy = lambda y: height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">']
    out.append(f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(chart.title)}</text>')
    out.append(
        f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" fill="none" stroke="#999"/>'
    )
    for t in _ticks(y0, y1):
        out.append(f'<text x="{left - 5}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:.3g}</text>')
        out.append(
            f'<line x1="{left}" x2="{width - right}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
        )
    for t in _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{height - bottom + 14}" text-anchor="middle">{t:.3g}</text>')
    out.append(
        f'<text x="{(left + width - right) / 2}" y="{height - 6}" text-anchor="middle">{html.escape(chart.x_label)}</text>'
    )
    out.append(
        f'<text x="12" y="{(top + height - bottom) / 2}" transform="rotate(-90 12 {(top + height - bottom) / 2})" text-anchor="middle">{html.escape(chart.y_label)}</text>'
    )
    for m in chart.marks:
        if x0 <= m <= x1:
            out.append(
                f'<line x1="{sx(m):.1f}" x2="{sx(m):.1f}" y1="{top}" y2="{height - bottom}" stroke="#aaa" stroke-dasharray="3,3"/>'
            )
    for i, s in enumerate(chart.series):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(s.x, s.y))
        if path:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{path}"/>')
        out.append(
            f'<text x="{width - right + 8}" y="{top + 14 + 16 * i}" fill="{color}">{html.escape(s.name)}</text>'
        )
    if chart.marks and chart.mark_label:
        out.append(
            f'<text x="{width - right + 8}" y="{top + 14 + 16 * len(chart.series)}" fill="#888">┊ {html.escape(chart.mark_label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def write_report(
    directory: Path, title: str, summary: dict[str, Any], charts: list[Chart], notes: list[str]
) -> Path:
    """Write ``report.html`` (charts + summary table) and ``report.json``; returns the HTML path."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = "\n".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items()
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<table border='1' cellpadding='4' style='border-collapse:collapse'>{rows}</table>",
        *(f"<p>{html.escape(n)}</p>" for n in notes),
        *(f"<div>{svg_chart(c)}</div>" for c in charts),
    ]
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body style='font-family:sans-serif'>"
        + "\n".join(body)
        + "</body></html>"
    )
    path = directory / "report.html"
    path.write_text(page, encoding="utf-8")
    data = {
        "title": title,
        "summary": summary,
        "notes": notes,
        "charts": [
            {
                "title": c.title,
                "marks": c.marks,
                "series": [{"name": s.name, "x": list(s.x), "y": list(s.y)} for s in c.series],
            }
            for c in charts
        ],
    }
    (directory / "report.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path
