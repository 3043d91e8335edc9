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
        [sys.executable, "-m", "trainer.app.cli", "--log-level", "WARNING", "demo",
         "--duration-s", "25", "--rate", "4000", "--warmup", "8000",
         "--repartition-interval", "12000", "--window", "30000", "--checkpoint-interval", "20000",
         "--metrics-port", "19300", "--report-dir", str(tmp_path), "--no-live", "--device", "cpu"],
        capture_output=True, text=True, timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    report = Path(lines[-2].split("report:", 1)[1].strip())
    assert report.is_file() and report.stat().st_size > 1000
    page = report.read_text()
    assert page.count("<svg") >= 4  # remote rows, AUC, throughput, migrations
    s = json.loads(report.with_suffix(".json").read_text())["summary"]
    # The live view was drawn from the ranks' metrics endpoints while they trained.
    assert any("remote rows/sample" in line for line in lines)
    assert s["workers"] == 2 and s["samples_trained"] > 40_000
    assert s["device"] == "cpu"
    # Stopped between steps: the last checkpoint holds every record trained.
    assert s["last_checkpoint_records"] == s["samples_trained"] <= s["records_produced"]
    assert s["placement_version"] >= 2 and s["repartitions"] >= 2 and s["rows_migrated"] > 0
    assert s["checkpoints"] >= 1 and any(Path(s["checkpoint_dir"]).iterdir())
    assert 0.6 < s["progressive_auc_last"] < 1.0
    assert 0 < s["freshness_p99_s"] < 10
