"""``hetgmp train``'s flags and what its summary line says, without starting a rank."""

from __future__ import annotations

import argparse

import pytest

from hetgmp.trainer.app.cli import build_parser
from hetgmp.trainer.app.train import add_train_flags


def _train_args(*argv: str) -> argparse.Namespace:
    full = ["train", *argv]
    args, extra = build_parser(full).parse_known_args(full)
    assert not extra
    return args


def _group(title: str) -> list[argparse.Action]:
    parser = argparse.ArgumentParser()
    add_train_flags(parser)
    for group in parser._action_groups:  # argparse keeps no public list of its groups
        if group.title == title:
            return group._group_actions
    raise AssertionError(f"no group {title!r}")


@pytest.mark.parametrize("title", ["source", "metrics"])
def test_every_source_and_metrics_flag_shows_its_default_and_variable(title: str) -> None:
    actions = _group(title)
    assert actions
    for action in actions:
        assert action.help and "(default: " in action.help and "env HETGMP_" in action.help, \
            action.option_strings


def test_source_and_metrics_flags_take_their_environment_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETGMP_SOURCE_EVAL_WINDOW", "123")
    monkeypatch.setenv("HETGMP_SOURCE_SOURCE", "kafka")
    monkeypatch.setenv("HETGMP_SOURCE_HELDOUT_AFTER", "2026-12-02T03:00:00Z")
    monkeypatch.setenv("HETGMP_METRICS_LINGER_S", "2.5")
    args = _train_args()
    assert args.eval_window == 123 and args.source == "kafka" and args.metrics_linger_s == 2.5
    assert args.heldout_after == "2026-12-02T03:00:00Z"
    assert _train_args("--eval-window", "7").eval_window == 7  # the command line still wins
    from hetgmp.trainer.app.train import _job

    job, _ = _job(args)
    assert job.heldout_after_ms == 1_796_180_400_000 and job.progressive == 123


def test_records_default_is_per_source_and_help_says_so(capsys) -> None:
    from hetgmp.trainer.app.train import _job

    kafka, _ = _job(_train_args("--source", "kafka"))
    assert kafka.run_records == 0  # until the topic stays idle, not 200,000
    synthetic, _ = _job(_train_args())
    assert synthetic.source.records == 200_000
    assert _job(_train_args("--source", "kafka", "--records", "5"))[0].run_records == 5
    (records,) = [a for a in _group("source") if "--records" in a.option_strings]
    said = " ".join((records.help or "").split())
    assert "200000 for --source synthetic" in said and "0 for --source kafka" in said


def test_an_unreadable_heldout_after_is_a_usage_error(capsys) -> None:
    from hetgmp.trainer.app.cli import main

    try:
        code = main(["train", "--source", "kafka", "--heldout-after", "tomorrow"])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert "--heldout-after" in err and "'tomorrow': expected milliseconds since the epoch" in err


def test_the_summary_line_says_when_the_progressive_auc_is_in_sample() -> None:
    from hetgmp.trainer.app.train import auc_phrase

    base = {"heldout_auc": None, "progressive_auc": 0.71234, "eval_window": 2000,
            "progressive_in_sample": False}
    assert auc_phrase(base) == "AUC 0.7123 (progressive, last 2,000 samples)"
    said = auc_phrase({**base, "progressive_in_sample": True})
    assert "in-sample" in said and "earlier pass" in said
    assert auc_phrase({**base, "heldout_auc": 0.65}) == "AUC 0.65 (held-out)"
