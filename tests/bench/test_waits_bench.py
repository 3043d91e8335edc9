"""hetgmp bench waits on a CPU: its rows, the step's waits by ranks, its refusals."""

from __future__ import annotations

import json

import pytest

from bench.waits import main


@pytest.mark.slow
def test_counts_waits_by_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workers", "1,2", "--batch", "64", "--steps", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {r["workers"]: r for r in summary["rows"]}
    assert set(rows) == {1, 2}
    assert all(r["device"] == "cpu" and "store" not in r for r in rows.values())
    assert rows[1]["waits_per_step"] == 1.0  # the step's counts and last loss
    assert rows[1]["by_operation"] == {"tolist": 2}
    # More ranks: the split sizes, then the owner's lookup (the protocol's floor).
    assert rows[2]["waits_per_step"] == 2.0
    assert rows[2]["by_operation"] == {"tolist": 4}


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--stores", "device"], ["--steps", "0"],
                                  ["--workers", "x"], ["--batch", "1", "--workers", "2"]])
def test_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
