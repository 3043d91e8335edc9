"""``hetgmp bench batch`` on a tiny configuration: a row per batch and rule with the figures the
issue names, the rule's settings, and the gaps to the base batch."""

from __future__ import annotations

import json

import pytest

from bench.batch import main, parse_args


def test_batch_bench_prints_a_row_per_batch_and_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--shape", "user_item", "--records", "8192", "--heldout", "2000",
                 "--batches", "1024,4096", "--rules", "none,linear,cowclip",
                 "--dist-batches", "", "--embed-dim", "8", "--hidden", "16",
                 "--scaling-warmup", "4096", "--stream-rate", "1000"])
    assert code == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["bench"] == "batch"
    rows = {(r["batch"], r["scaling"]): r for r in last["rows"]}
    assert list(rows) == [(b, s) for b in (1024, 4096) for s in ("none", "linear", "cowclip")]
    for r in rows.values():
        assert {"batch", "scaling", "auc", "logloss", "samples_per_s"} <= set(r)
        assert 0.4 < r["auc"] < 1.0 and r["samples_per_s"] > 0 and r["ranks"] == 1
    # At the base batch every rule trains what none trains (the clip binds nothing at r = 1).
    assert rows[(1024, "cowclip")]["auc"] == rows[(1024, "none")]["auc"]
    big = rows[(4096, "cowclip")]
    assert big["dense_lr"] == pytest.approx(2e-3) and big["store_l2"] == pytest.approx(4e-4)
    assert big["warmup_steps"] == 1 and big["clip"] == "cowclip" and big["clipped_share"] == 0
    assert rows[(4096, "linear")]["store_lr"] == pytest.approx(0.08)
    # A stream of 1,000 records/s fills 4,096 in 4.1 s: a record waits 2.05 s on average.
    assert big["fill_wait_mean_s"] == pytest.approx(2.048) and big["steps"] == 2
    assert set(last["auc_gaps"]) == {f"auc_gap_user_item_1r_4096_{s}"
                                     for s in ("none", "linear", "cowclip")}


def test_unknown_rules_and_shapes_are_usage_errors() -> None:
    for argv in (["--rules", "cubic"], ["--shape", "criteo"], ["--batches", "1k"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_rows_started_near_zero_let_the_clip_bind(capsys: pytest.CaptureFixture[str]) -> None:
    # At the default init (±0.05) no gradient reaches count x r x |row| (the test above); rows
    # started as CowClip's paper starts them, near zero, are clipped.
    code = main(["--shape", "user_item", "--records", "8192", "--heldout", "2000",
                 "--batches", "4096", "--rules", "cowclip", "--dist-batches", "",
                 "--embed-dim", "8", "--hidden", "16", "--scaling-warmup", "4096",
                 "--store-init-scale", "1e-5"])
    assert code == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert row["clip"] == "cowclip" and row["clipped_share"] > 0
