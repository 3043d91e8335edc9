"""The report's charts, as a browser shows them: every chart that has data draws it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from browser import chart_ink

from hetgmp.trainer.app.report import Chart, Series, write_report


@pytest.mark.slow
def test_charts_with_data_show_it_in_the_browser_and_an_empty_one_does_not(
        tmp_path: Path) -> None:
    t = np.arange(0, 60, 1.0)
    charts = [
        Chart("a line", "seconds", "rows / sample", [Series("all ranks", t, 2 + np.sin(t))],
              marks=[20.0, 40.0], mark_label="new placement"),
        Chart("bars", "seconds", "rows", [Series("moved", [10, 30, 50], [300, 120, 80],
                                                  bars=True)]),
        Chart("nothing to show", "seconds", "AUC", [Series("mean", t, np.full(t.size, np.nan))]),
    ]
    page = write_report(tmp_path / "r", "test", [("Samples trained", "1,000")], charts, [], {})
    ink = chart_ink(page, tmp_path)
    assert len(ink) == 3
    assert ink[0] > 300 and ink[1] > 300, ink  # a line of 60 points, three bars
    assert ink[2] == 0, ink  # NaN only: "no data", nothing coloured
