"""``hetgmp bench models`` on a tiny configuration: DIN and DeepFM on the same records at both
placements, the ratios the issue names, and MMoE's AUC for each task."""

from __future__ import annotations

import json

import pytest

from bench.models import main, parse_args

pytestmark = pytest.mark.distributed


def test_models_bench_compares_din_with_deepfm_and_reports_each_task(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--window", "2000", "--records", "4096", "--heldout", "2048",
                 "--global-batch", "512", "--embed-dim", "4", "--hidden", "8",
                 "--history-len", "6"])
    assert code == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["config"]: r for r in last["rows"]}
    assert list(rows) == [f"{m}_{p}" for m in ("din", "deepfm", "mmoe")
                          for p in ("hash_s0", "graph_s10")]
    for r in rows.values():
        assert r["samples_per_s"] > 0 and 0.3 < r["auc"] < 1.0
    assert rows["din_graph_s10"]["max_staleness"] <= 10
    assert set(rows["mmoe_hash_s0"]["tasks"]) == {"label", "conversion"}
    ratios = last["ratios"]
    assert {"auc_din_minus_deepfm_hash_s0", "auc_din_minus_deepfm_graph_s10",
            "bytes_graph_over_hash_din"} <= set(ratios)
    assert ratios["auc_din_minus_deepfm_hash_s0"] == pytest.approx(
        rows["din_hash_s0"]["auc"] - rows["deepfm_hash_s0"]["auc"], abs=1e-5)


def test_models_bench_refuses_an_unknown_model() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--models", "din,transformer"])
