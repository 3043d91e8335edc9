"""hetgmp bench gpu end to end on a CPU with tiny batches: its JSON rows, its refusals."""

from __future__ import annotations

import json

import pytest

from bench.gpu import PATHS, main
from hetgmp.trainer.dist import PHASES


@pytest.mark.slow
def test_bench_gives_one_row_per_path_and_batch(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--device", "cpu", "--batches", "128,256", "--steps", "2", "--warmup", "1"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "gpu"
    rows = {(r["path"], r["global_batch"]): r for r in summary["rows"]}
    assert set(rows) == {(p, b) for p in ("trainer", "model_only") for b in (128, 256)}
    assert set(PATHS) == {"trainer", "model_only"}
    for (path, _), row in rows.items():
        assert set(row) >= {"path", "device", "global_batch", "samples_per_s", "ms_by_phase",
                            "syncs_per_step", "peak_mem_mb"}
        assert row["device"] == "cpu" and row["samples_per_s"] > 0
        phases = set(row["ms_by_phase"])
        assert phases == ({"compute"} if path == "model_only" else set(PHASES))
    # Off CUDA the waits are audited: the step's one (its counts, with the last loss), none in
    # the model alone.
    assert rows[("trainer", 128)]["syncs_per_step"] == 1.0
    assert rows[("model_only", 128)]["syncs_per_step"] == 0.0
    # Both paths ran: the trainer's row carries its speed over the model's alone.
    for batch in (128, 256):
        trainer, model = rows[("trainer", batch)], rows[("model_only", batch)]
        assert trainer["trainer_over_model_only"] == pytest.approx(
            trainer["samples_per_s"] / model["samples_per_s"], abs=1e-3)
        assert "trainer_over_model_only" not in model


def test_one_path_alone_gives_no_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--device", "cpu", "--batches", "128", "--steps", "1", "--warmup", "0",
          "--paths", "trainer"])
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert row["path"] == "trainer" and "trainer_over_model_only" not in row


@pytest.mark.parametrize("argv", [["--paths", "host"], ["--paths", "device"], ["--steps", "0"],
                                  ["--batches", "x"], ["--device", "nonsense"],
                                  ["--index-design", "sorted"], ["--interleave"]])
def test_bench_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
