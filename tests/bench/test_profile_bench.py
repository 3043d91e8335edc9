"""``hetgmp bench profile`` on a tiny step: phases timed, ops listed by self CPU time."""

from __future__ import annotations

import json

import pytest

from bench.profile_step import main


def test_the_profile_times_phases_and_lists_the_steps_ops(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--shape", "multi_hot", "--global-batch", "256", "--warmup", "1", "--steps", "2",
                 "--profile-steps", "1", "--rows", "8", "--embed-dim", "8", "--hidden", "16"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "profile" and summary["values_per_sample"] > 100  # bags
    assert set(summary["seconds_by_phase"]) == {"route", "read", "compute", "write", "dense"}
    assert summary["seconds_by_phase"]["compute"] > 0 and summary["samples_per_s"] > 0
    ops = summary["top_ops_ms"]
    assert 0 < len(ops) <= 8 and all(name.startswith("aten::") or name for name in ops)
    assert list(ops.values()) == sorted(ops.values(), reverse=True)


def test_bad_sizes_are_usage_errors() -> None:
    with pytest.raises(SystemExit):
        main(["--steps", "0"])
