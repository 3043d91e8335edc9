"""The demo end to end (short): it must finish, exit 0, and write a report whose every chart
shows data in a browser; its hetgmp serve answered, with model lags and latencies inside the run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import chart_ink

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_short_demo_finishes_and_its_report_draws_every_chart(tmp_path):
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "hetgmp.trainer.app.cli", "--log-level", "WARNING", "demo",
         "--duration-s", "30", "--warmup", "8000", "--repartition-interval", "12000",
         "--window", "30000", "--checkpoint-interval", "20000", "--metrics-port", "19300",
         "--report-dir", str(tmp_path), "--no-live", "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # Ages and latencies are bounded by the run itself, not by how fast this machine is: a record
    # is appended and trained, a delta published and served, within the run's wall time.
    wall_s = time.monotonic() - started
    lines = r.stdout.strip().splitlines()
    report = Path(lines[-2].split("report:", 1)[1].strip())
    assert report.is_file() and report.stat().st_size > 1000
    s = json.loads(report.with_suffix(".json").read_text())["figures"]
    # The live view was drawn from the ranks' metrics endpoints while they trained.
    assert any("remote rows/sample" in line for line in lines)
    assert s["workers"] == 2 and s["samples_trained"] > 60_000
    assert s["device"] == "cpu"
    # Stopped between steps: the last checkpoint holds every record trained.
    assert s["last_checkpoint_records"] == s["samples_trained"] <= s["records_produced"]
    assert s["placement_version"] >= 2 and s["repartitions"] >= 2 and s["rows_migrated"] > 0
    assert s["steps_during_migrations"] > 0  # migrations span steps: training went on
    assert s["checkpoints"] >= 1 and any(Path(s["checkpoint_dir"]).iterdir())
    assert 0.6 < s["progressive_auc_last"] < 1.0
    assert 0 < s["freshness_p50_s"] <= s["freshness_p99_s"] < wall_s
    # hetgmp serve followed the ranks' delta log and answered the load generator.
    assert any("serving    model lag" in line for line in lines)
    assert s["serve_requests_ok"] > 20 and s["serve_requests_failed"] == 0
    assert s["serve_records_scored"] >= 256 * 20
    assert 0 < s["model_lag_p50_s"] < wall_s and 0 < s["serve_latency_p99_ms"] < wall_s * 1000
    page = report.read_text()
    assert "Records produced / consumed / trained" in page  # labels, not raw keys
    ink = chart_ink(report, tmp_path)
    assert len(ink) == 6 and min(ink) > 100, ink  # every chart drew its data
