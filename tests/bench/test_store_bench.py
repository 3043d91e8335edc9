"""The store benchmark end to end on a small stream: its JSON summary line, its refusals."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from bench.store_bench import PHASES, _check, main
from hetgmp.trainer.embedding import EmbeddingStore


def test_bench_times_every_phase_at_every_size(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--batch", "128,256", "--steps", "3", "--warmup", "1", "--dim", "8"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "store"
    rows = summary["rows"]
    assert [r["global_batch"] for r in rows] == [128, 256]
    for row in rows:
        assert row["device"] == "cpu" and set(row["ms_by_phase"]) == set(PHASES)
        assert row["ms_per_step"] == pytest.approx(sum(row["ms_by_phase"].values()), abs=0.01)
        # Distinct ids of a step: more than the samples (26 fields), at most every entry.
        assert row["global_batch"] < row["distinct_ids_per_step"] <= 26 * row["global_batch"]
        assert row["rows_in_store"] >= row["distinct_ids_per_step"]
        assert row["rows_per_s"] == pytest.approx(
            1000 * row["distinct_ids_per_step"] / row["ms_per_step"], rel=1e-3)
        assert min(row["samples_per_s"], row["lookup_rows_per_s"], row["apply_rows_per_s"]) > 0
        # A phase alone moves rows faster than the whole step.
        assert min(row["lookup_rows_per_s"], row["apply_rows_per_s"]) > row["rows_per_s"]


def test_rows_mode_fills_each_size_and_holds_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--rows", "8000,64000", "--batch", "32", "--steps", "3", "--warmup", "1",
                 "--dim", "16", "--evict-rounds", "2"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["mode"] == "rows"
    small, big = summary["rows"]
    assert (small["rows"], big["rows"]) == (8000, 64000)
    for row in (small, big):
        assert row["rows_after_maintain_max"] == row["rows"] < row["rows_peak"]
        # N/32 new rows pass the cap: down to the low-water mark (1/32 below the cap), N/16
        # evicted; the second round's N/32 then fit under the cap.
        assert row["evicted"] == row["rows"] // 16
        assert 0 < row["overhead_bytes_per_row"] <= 32
    assert small["lookup_apply_vs_first"] == 1.0
    assert big["lookup_apply_vs_first"] == pytest.approx(
        big["lookup_apply_rows_per_s"] / small["lookup_apply_rows_per_s"], rel=1e-2)


def test_check_refuses_a_store_that_missed_an_update() -> None:
    batches = [np.array([1, 2, 2, 3], np.int64), np.array([3, 4], np.int64)]
    store = EmbeddingStore(4)
    for step, b in enumerate(batches):
        ids = torch.from_numpy(np.unique(b))
        store.lookup(ids, step)
        store.apply(ids, torch.zeros(ids.numel(), 4), torch.ones(ids.numel(), dtype=torch.int64))
    _check(store, batches)  # every distinct id has a row, one version a step that used it
    with pytest.raises(RuntimeError, match="distinct ids"):
        _check(store, [*batches, np.array([4], np.int64)])


@pytest.mark.parametrize("argv", [["--designs", "sorted"], ["--steps", "0"], ["--batch", "x"],
                                  ["--batch", "0"], ["--device", "nonsense"],
                                  ["--warmup", "-1"], ["--rows", "10"], ["--rows", "x"]])
def test_bench_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_the_engines_bench_reads_back_what_each_engine_was_given(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each engine's first read batch is compared with the rows written (a mismatch raises).
    code = main(["--engines", "--rows", "20000", "--batch", "512", "--spill", "4096",
                 "--dir", str(tmp_path)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["engine"]: r for r in summary["rows"]}
    lmdb = importlib.util.find_spec("lmdb") is not None  # only the comparison needs it
    assert set(rows) == {"rocksdb", "mmap"} | ({"lmdb"} if lmdb else set())
    for r in rows.values():
        assert r["row_bytes"] == 64 * 4 + 4 + 8 and r["read_rows_per_s"] > 0
        assert r["disk_over_row"] >= 0.99  # every row is on disk
    assert list(tmp_path.iterdir()) == []  # each engine's files removed


def test_the_tiers_bench_compares_both_stores_and_checks_their_rows(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--tiers", "--table-rows", "20000", "--memory-rows", "2000", "--draws", "2048",
                 "--steps", "3", "--warmup", "1", "--dim", "8", "--dir", str(tmp_path),
                 "--read-seconds", "0.2"])
    assert code == 0  # the rows of both stores are compared at the end (a mismatch raises)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "store_tiers" and summary["disk_over_row"] > 0.9
    assert summary["disk_reads_per_s"] > 0  # the uniform pattern's physical limit, measured
    rows = {r["pattern"]: r for r in summary["rows"]}
    assert set(rows) == {"zipf", "uniform"}
    # Skewed draws find more of their ids in memory than uniform ones.
    assert 0 <= rows["uniform"]["memory_hit_rate"] < rows["zipf"]["memory_hit_rate"] <= 1
    # An oracle's hit rate (the most popular rows pinned): skewed draws favour it too.
    assert 0 < rows["uniform"]["oracle_hit_rate"] < rows["zipf"]["oracle_hit_rate"] <= 1
    assert rows["uniform"]["tiered_over_disk_reads"] > 0
    assert all(r["tiered_rows_per_s"] > 0 and r["memory_rows_per_s"] > 0 for r in rows.values())
    assert list(tmp_path.iterdir()) == []  # the tier removed its files


@pytest.mark.parametrize("memory", ["0", "3000"], ids=["memory", "disk-tier"])
def test_the_checkpoints_bench_compares_increments_with_full_checkpoints(
        tmp_path, capsys: pytest.CaptureFixture[str], memory: str) -> None:
    code = main(["--checkpoints", "--table-rows", "20000", "--changed-rows", "200",
                 "--memory-rows", memory, "--rounds", "2", "--dim", "8", "--dir", str(tmp_path)])
    assert code == 0  # the chain's rows are compared with the full checkpoint's (else it fails)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "checkpoints" and [r["depth"] for r in summary["rows"]] == [1, 2]
    for r in summary["rows"]:  # 1% of the rows changed: the increment is a few % of the bytes
        assert r["increment_bytes"] < 0.05 * r["full_bytes"], r
    assert list(tmp_path.iterdir()) == []  # checkpoints and tier removed


def test_the_checkpoints_fingerprint_is_order_free_and_sees_one_bit() -> None:
    from bench.increments import fingerprint

    rng = np.random.default_rng(0)
    ids = rng.permutation(1000).astype(np.int64)
    values = rng.standard_normal((1000, 8)).astype(np.float32)
    state, versions = rng.random((1000, 1)).astype(np.float32), rng.integers(0, 9, 1000)
    whole = fingerprint([(ids, values, state, versions)])
    split = fingerprint([(ids[500:], values[500:], state[500:], versions[500:]),
                         (ids[:500], values[:500], state[:500], versions[:500])])
    assert whole == split and whole[0] == 1000
    flipped = values.copy()
    flipped.view(np.uint32)[123, 4] ^= 1  # one bit of one value
    assert fingerprint([(ids, flipped, state, versions)]) != whole
    bumped = versions.copy()
    bumped[7] += 1
    assert fingerprint([(ids, values, state, bumped)]) != whole
    swapped = ids.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # two rows' ids exchanged
    assert fingerprint([(swapped, values, state, versions)]) != whole
