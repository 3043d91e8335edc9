"""``--batch-scaling`` seen by a user: what ``hetgmp train`` prints and records (summary,
checkpoint manifest), and the part of freshness a batch costs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetgmp.trainer.app.cli import main as cli
from hetgmp.trainer.checkpoint import latest
from hetgmp.trainer.online.stats import LoopStats

SMALL = ["--device", "cpu", "--embed-dim", "8", "--hidden", "16", "--log-every", "0",
         "--threads", "1", "--timeout-s", "120", "--workers", "1", "--heldout", "2000"]


def test_train_prints_what_the_rule_set_and_records_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli(["train", "--records", "16384", "--global-batch", "4096", "--base-batch", "512",
                "--batch-scaling", "cowclip", "--store-l2", "1e-4", "--dense-lr", "0.002",
                "--scaling-warmup", "8192", "--checkpoint-dir", str(tmp_path), *SMALL])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    said = [line for line in lines if line.startswith("batch scaling cowclip")]
    assert said and "embedding L2 0.0001 -> 0.0008" in said[0], lines
    assert "dense lr 0.002 -> 0.00565685" in said[0] and "(2 steps)" in said[0]
    rule = json.loads(lines[-1])["batch_scaling"]
    assert rule["rule"] == "cowclip" and rule["k"] == 8 and rule["clip"] == "cowclip"
    assert rule["store_l2"] == pytest.approx(8e-4) and rule["warmup_steps"] == 2
    assert rule["dense_lr"] == pytest.approx(0.002 * 8 ** 0.5)
    manifest = latest(str(tmp_path))
    assert manifest is not None and manifest.extra["batch_scaling"] == rule


def test_no_rule_prints_nothing_and_records_the_settings_as_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["train", "--records", "4096", "--global-batch", "2048", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "batch scaling" not in out
    rule = json.loads(out.strip().splitlines()[-1])["batch_scaling"]
    assert rule["rule"] == "none" and rule["k"] == 2 and rule["clip"] == "none"
    assert rule["dense_lr"] == rule["given"]["dense_lr"] and rule["warmup_steps"] == 0


def test_the_batch_fill_is_each_records_wait_for_the_newest_of_its_batch() -> None:
    stats = LoopStats(started_ms=0.0)
    # Appended at 1.0, 2.5 and 4.0 s, applied at 5.0 s: waits of 3, 1.5 and 0 s for the
    # batch to fill, of 4, 2.5 and 1 s in all.
    fresh = stats.freshness_of(np.array([1000, 2500, 4000], np.int64), 5000.0)
    np.testing.assert_allclose(fresh, [4.0, 2.5, 1.0])
    report = stats.report()
    assert report["batch_fill_p50_s"] == pytest.approx(1.5, rel=0.03)
    assert report["batch_fill_p99_s"] == pytest.approx(3.0, rel=0.03)
    assert report["freshness_p50_s"] == pytest.approx(2.5, rel=0.03)


def test_the_printed_line_says_what_the_batch_costs_of_freshness_when_known() -> None:
    from hetgmp.trainer.app.train import _fill_phrase

    known = {"freshness_p50_s": 2.5, "batch_fill_p50_s": 1.5, "batch_fill_p99_s": 3.0}
    assert _fill_phrase(known) == ("; freshness p50 2.50 s, of which waiting for the batch to "
                                   "fill 1.50 s (p99 3.00 s)")
    # No append times (the synthetic source), or only a backlog: nothing said.
    assert _fill_phrase({**known, "freshness_p50_s": float("nan")}) == ""
    assert _fill_phrase({**known, "freshness_p50_s": None}) == ""
