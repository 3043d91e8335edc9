"""hetgmp bench gpu end to end on a CPU with tiny batches: its JSON rows, its refusals."""

from __future__ import annotations

import json

import pytest

from bench.gpu import PATHS, main
from trainer.counters import PHASES


def test_bench_gives_one_row_per_path_and_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--device", "cpu", "--batches", "128,256", "--steps", "2", "--warmup", "1"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "gpu"
    rows = {(r["path"], r["global_batch"]): r for r in summary["rows"]}
    assert set(rows) == {(p, b) for p in PATHS for b in (128, 256)}
    for (path, _), row in rows.items():
        assert set(row) >= {"path", "device", "global_batch", "samples_per_s", "ms_by_phase",
                            "syncs_per_step", "peak_mem_mb"}
        assert row["device"] == "cpu" and row["samples_per_s"] > 0
        phases = set(row["ms_by_phase"])
        assert phases == ({"compute"} if path == "model_only" else set(PHASES))
    # Off CUDA the waits are audited: the device path's one (the step's counts), none in the
    # model alone.
    assert rows[("device", 128)]["syncs_per_step"] == 1.0
    assert rows[("model_only", 128)]["syncs_per_step"] == 0.0


def test_interleaved_paths_give_the_same_rows(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--device", "cpu", "--batches", "128", "--steps", "2", "--warmup", "1",
          "--paths", "host,device", "--interleave"])
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [r["path"] for r in rows] == ["host", "device"]
    assert all(r["samples_per_s"] > 0 and set(r["ms_by_phase"]) == set(PHASES) for r in rows)
    assert rows[1]["syncs_per_step"] == 1.0
    assert rows[0]["peak_mem_mb"] == rows[1]["peak_mem_mb"]  # the two paths' together


def test_the_stash_index_adds_a_wait_per_insert(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--device", "cpu", "--batches", "128", "--steps", "1", "--warmup", "1",
          "--paths", "device", "--index-design", "stash"])
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert row["syncs_per_step"] >= 2.0  # every step of this stream creates rows (and grows)


@pytest.mark.parametrize("argv", [["--paths", "fpga"], ["--steps", "0"], ["--batches", "x"],
                                  ["--device", "nonsense"]])
def test_bench_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
