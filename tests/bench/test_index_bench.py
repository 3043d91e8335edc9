"""The id index benchmark end to end on tiny tables: its JSON summary line, its refusals."""

from __future__ import annotations

import json

import pytest

from bench.index_bench import BASELINE, main
from trainer.embedding.device_index import DESIGNS


def test_bench_prints_one_json_row_per_size_and_design(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--entries", "3000,5000", "--batch", "256", "--reps", "3"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "index"
    rows = {(r["entries"], r["design"]): r for r in summary["rows"]}
    assert set(rows) == {(n, d) for n in (3000, 5000) for d in (*DESIGNS, BASELINE)}
    for row in rows.values():
        assert row["batch"] == 256
        assert row["device"] == ("host" if row["design"] == BASELINE else "cpu")
        assert min(row["lookup_per_s"], row["insert_per_s"], row["remove_per_s"]) > 0
        # Every design stores at least an id and a value per entry.
        assert row["nbytes_per_entry"] >= 16


@pytest.mark.parametrize("argv", [["--designs", "btree"], ["--entries", "1000", "--batch", "512"],
                                  ["--reps", "0"], ["--entries", "x"]])
def test_bench_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
