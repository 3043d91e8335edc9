"""The store benchmark end to end on a small stream: its JSON summary line, its refusals."""

from __future__ import annotations

import json

import pytest

from bench.store_bench import PHASES, main
from trainer.embedding.device_index import DESIGNS


def test_bench_times_every_phase_of_every_store(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--batch", "256", "--steps", "3", "--warmup", "1", "--dim", "8"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "store"
    rows = summary["rows"]
    assert [(r["store"], r["design"]) for r in rows] == \
        [("host", None)] + [("device", d) for d in DESIGNS]
    for row in rows:
        assert set(row["ms_by_phase"]) == set(PHASES)
        assert row["ms_per_step"] == pytest.approx(sum(row["ms_by_phase"].values()), abs=0.01)
        assert row["samples_per_s"] > 0 and row["distinct_ids_per_step"] > 256
    assert all(r["vs_host"] > 0 for r in rows[1:])


@pytest.mark.parametrize("argv", [["--designs", "btree"], ["--steps", "0"],
                                  ["--device", "nonsense"], ["--warmup", "-1"]])
def test_bench_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
