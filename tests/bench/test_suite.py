"""``hetgmp bench all``: each benchmark gets the flags it defines, and bad ones stop it early."""

from __future__ import annotations

import argparse

import pytest

from bench import suite
from hetgmp.trainer.app.cli import main as cli_main


@pytest.fixture()
def parsers():
    return {name: suite._module(name).build_parser() for name in suite.BENCHMARKS}


def test_each_flag_goes_to_the_benchmarks_that_define_it(parsers):
    shares = suite.split_flags(["--quick", "--device", "cuda", "--seed=3", "--offline"], parsers)
    assert shares["ingest"] == ["--quick", "--seed=3"]
    assert shares["partition"] == ["--quick", "--seed=3", "--offline"]
    assert shares["train"] == ["--quick", "--device", "cuda", "--seed=3"]
    assert shares["online"] == ["--quick", "--device", "cuda", "--seed=3"]


def test_a_value_that_looks_like_a_flag_stays_with_its_flag(parsers):
    shares = suite.split_flags(["--seed", "-1", "--staleness", "10", "--quick"], parsers)
    assert shares["train"] == ["--seed", "-1", "--staleness", "10", "--quick"]
    assert shares["partition"] == ["--seed", "-1", "--quick"]


def test_a_flag_taking_a_value_in_one_benchmark_only_is_refused():
    # Which token is the value would depend on the benchmark: the suite refuses to guess.
    one, other = argparse.ArgumentParser(), argparse.ArgumentParser()
    one.add_argument("--x", action="store_true")
    other.add_argument("--x", type=int)
    for order in ({"a": one, "b": other}, {"b": other, "a": one}):
        with pytest.raises(ValueError, match="takes a value in some benchmarks"):
            suite.split_flags(["--x", "5"], order)


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "not a flag of any benchmark"),
    (["--rec", "5"], "not a flag of any benchmark"),  # no abbreviations: which one would it be?
    (["--records"], "needs a value"),
    (["quick"], "not a flag of any benchmark"),
])
def test_flags_no_benchmark_takes_are_refused(parsers, argv, message):
    with pytest.raises(ValueError, match=message):
        suite.split_flags(argv, parsers)


def test_a_share_one_benchmark_refuses_stops_the_suite_before_any_run(gpus, capsys,
                                                                      monkeypatch):
    ran = []
    for name in suite.BENCHMARKS:
        module = suite._module(name)
        monkeypatch.setattr(module, "main", lambda argv, name=name: ran.append(name) or 0)
    gpus(0)
    with pytest.raises(SystemExit) as exc:
        suite.main(["--quick", "--device", "cuda"])
    assert exc.value.code == 2
    assert ran == []
    assert "no CUDA device" in capsys.readouterr().err


def test_the_suite_runs_every_benchmark_with_its_share(capsys, monkeypatch):
    ran = {}

    def fake_main(name: str):
        def run(argv: list[str]) -> int:
            ran[name] = argv
            return 1 if name == "train" else 0
        return run

    for name in suite.BENCHMARKS:
        monkeypatch.setattr(suite._module(name), "main", fake_main(name))
    assert cli_main(["bench", "all", "--quick", "--device", "cpu"]) == 1  # train's status
    assert list(ran) == list(suite.BENCHMARKS)
    assert ran["ingest"] == ["--quick"] and ran["online"] == ["--quick", "--device", "cpu"]
    assert "== hetgmp bench partition --quick" in capsys.readouterr().out


def test_bench_help_names_the_benchmarks(capsys):
    assert cli_main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "all" in out and "hetgmp bench NAME --help" in out
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench"])
    assert exc.value.code == 2
    assert cli_main(["bench", "all", "--help"]) == 0
    assert "to train and online" in capsys.readouterr().out
