"""hetgmp bench waits on a CPU: its rows, the one-rank device step's one wait, its refusals."""

from __future__ import annotations

import json

import pytest

from bench.waits import main


def test_counts_waits_by_store_and_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workers", "1,2", "--batch", "64", "--steps", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = {(r["store"], r["workers"]): r for r in summary["rows"]}
    assert set(rows) == {(s, w) for s in ("host", "device") for w in (1, 2)}
    assert rows[("device", 1)]["waits_per_step"] == 1.0  # the step's counts and last loss
    assert rows[("device", 1)]["by_operation"] == {"tolist": 2}
    for key in (("host", 2), ("device", 2)):  # the exchange works in numpy: more than one
        assert rows[key]["waits_per_step"] > 1.0


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--stores", "disk"], ["--steps", "0"],
                                  ["--workers", "x"], ["--batch", "1", "--workers", "2"]])
def test_refuses_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
