"""The demo end to end (short): it must finish, exit 0 and write its report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_short_demo_finishes_and_writes_its_report(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            "--log-level",
            "WARNING",
            "demo",
            "--duration-s",
            "14",
            "--rate",
            "15000",
            "--window",
            "30000",
            "--repartition-every-s",
            "3",
            "--report-dir",
            str(tmp_path),
            "--no-live",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = Path(r.stdout.strip().splitlines()[-2].split("report:", 1)[1].strip())
    assert report.is_file() and report.stat().st_size > 1000
    data = json.loads(report.with_suffix(".json").read_text())
    s = data["summary"]
    assert s["records_consumed"] > 50_000
    assert s["records_rejected"] == 0
    assert s["repartitions"] >= 1
    # The graph placement must beat hashing on the stream it was computed from.
    assert s["remote_rows_per_sample_graph"] < s["remote_rows_per_sample_hash"]
    assert "<svg" in report.read_text()
