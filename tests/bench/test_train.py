"""``hetgmp bench train`` on a tiny configuration: every row is there and the contract holds."""

from __future__ import annotations

import json

import pytest

from bench.train import main

pytestmark = pytest.mark.distributed


def test_train_bench_prints_one_row_per_configuration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HETGMP_LINK", "3gbit")  # as bench/link.sh sets it
    code = main(["--window", "6000", "--records", "6144", "--heldout", "2000",
                 "--embed-dim", "8", "--hidden", "16", "--global-batch", "1024",
                 "--repeats", "2", "--paired-chunk", "2"])
    assert code == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["bench"] == "train" and last["link"] == "3gbit" and last["device"] == "cpu"
    rows = {r["config"]: r for r in last["rows"]}
    assert list(rows) == ["single", "hash", "graph_s0", "graph_s10", "graph_s100"]
    for r in rows.values():
        assert {"samples_per_s", "bytes_per_sample", "remote_rows_per_sample", "auc"} <= set(r)
        assert r["samples_per_s"] > 0 and 0.4 < r["auc"] < 1.0
    assert rows["single"]["bytes_per_sample"] == 0 and rows["hash"]["bytes_per_sample"] > 0
    # s = 0 is synchronous training, whatever the placement (invariant 3) ...
    assert abs(rows["graph_s0"]["auc"] - rows["single"]["auc"]) < 1e-4
    assert abs(rows["hash"]["auc"] - rows["single"]["auc"]) < 1e-4
    # ... and the bound holds at every replica read.
    for s in (0, 10, 100):
        assert rows[f"graph_s{s}"]["max_staleness"] <= s
    assert "bytes_graph_s10_over_hash" in last["ratios"]
    # The speed pair ran twice each and reports its best run; the others ran once.
    for name, runs in (("hash", 2), ("graph_s10", 2), ("graph_s0", 1), ("graph_s100", 1)):
        assert len(rows[name]["samples_per_s_runs"]) == runs
        assert rows[name]["samples_per_s"] == max(rows[name]["samples_per_s_runs"])
    ratios = last["ratios"]
    mean = {n: sum(rows[n]["samples_per_s_runs"]) / 2 for n in ("hash", "graph_s10")}
    assert ratios["speed_graph_s10_over_hash_by_means"] == pytest.approx(
        mean["graph_s10"] / mean["hash"], abs=1e-3)
    assert ratios["speed_graph_s10_over_hash_sequential"] == pytest.approx(
        rows["graph_s10"]["samples_per_s"] / rows["hash"]["samples_per_s"], abs=1e-3)
    # The target's ratio is the side-by-side run's (6 steps: 3 rounds of 2 steps each).
    paired = {n: rows[n]["samples_per_s_paired"] for n in ("hash", "graph_s10")}
    assert all(v > 0 for v in paired.values())
    assert ratios["speed_graph_s10_over_hash"] == pytest.approx(
        paired["graph_s10"] / paired["hash"], abs=2e-3)
    assert ratios["speed_graph_s10_over_hash_ci95"] > 0
    assert "seconds_by_phase_paired" in rows["graph_s10"]
    assert set(ratios) == {"bytes_graph_s10_over_hash", "speed_graph_s10_over_hash",
                           "speed_graph_s10_over_hash_by_means", "speed_graph_s10_over_hash_ci95",
                           "speed_graph_s10_over_hash_sequential", "auc_loss_s100_vs_s0",
                           "auc_loss_s10_vs_s0", "auc_single_minus_graph_s0",
                           "speed_hash_over_single"}
    assert ratios["speed_hash_over_single"] == pytest.approx(
        rows["hash"]["samples_per_s"] / rows["single"]["samples_per_s"], abs=1e-3)
    assert {r["shape"] for r in rows.values()} == {"segments"}
    assert rows["hash"]["rows_per_s"] == pytest.approx(rows["hash"]["samples_per_s"] * 26, rel=0.05)


def test_a_shape_with_lists_runs_beside_the_first_and_compares_rows_looked_up(
    capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--shape", "segments,user_history", "--window", "3000", "--records", "4096",
                 "--heldout", "1000", "--embed-dim", "8", "--hidden", "16",
                 "--global-batch", "1024", "--staleness", "0,10", "--paired-chunk", "0"])
    assert code == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {(r["shape"], r["config"]): r for r in last["rows"]}
    assert set(rows) == {(s, c) for s in ("segments", "user_history")
                         for c in ("single", "hash", "graph_s0", "graph_s10")} | {
        ("user_history", c) for c in ("model_alone", "dense_only", "pooling")}
    # A list shape's ceilings, measured beside it (issue 54): plain PyTorch with
    # nn.EmbeddingBag, the model alone on pooled inputs, and the pooling against the stock
    # bag's own backward.
    alone, bound = rows[("user_history", "model_alone")], rows[("user_history", "dense_only")]
    assert alone["samples_per_s"] > 0 and bound["samples_per_s"] > 0
    assert rows[("user_history", "pooling")]["speed_over_embedding_bag"] > 0
    history = rows[("user_history", "hash")]
    # A history of 20 items, missing ones aside: far more rows than samples.
    assert 20 < history["ids_per_sample"] < 28 and history["rows_per_s"] > history["samples_per_s"]
    ratios = last["ratios"]
    assert ratios["speed_single_over_model_alone_user_history"] == pytest.approx(
        rows[("user_history", "single")]["samples_per_s"] / alone["samples_per_s"], abs=1e-3)
    assert {"bytes_graph_s10_over_hash", "bytes_graph_s10_over_hash_user_history",
            "rows_per_s_user_history_over_segments_hash",
            "rows_per_s_user_history_over_segments_graph_s10"} <= set(ratios)
    assert ratios["rows_per_s_user_history_over_segments_hash"] == pytest.approx(
        history["rows_per_s"] / rows[("segments", "hash")]["rows_per_s"], abs=1e-3)


def test_the_one_store_needs_no_flag_of_its_own() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--device-store"])
    assert exc.value.code == 2


def test_paired_ratio_is_over_the_whole_run_with_an_interval_from_matched_rounds() -> None:
    from bench.train import PairedRun, paired_ratio
    from hetgmp.trainer.dist import Totals

    first = PairedRun([100, 100, 100], [1.0, 1.0, 2.0], Totals())
    second = PairedRun([100, 100, 100], [1.0, 0.5, 1.0], Totals())
    ratio, half, rounds = paired_ratio(first, second)
    assert rounds == 3
    assert ratio == pytest.approx((300 / 2.5) / (300 / 4.0))
    # Round ratios 1, 2, 2: mean 5/3, sample sd 1/sqrt(3).
    assert half == pytest.approx(1.96 * (1 / 3**0.5) / 3**0.5)
