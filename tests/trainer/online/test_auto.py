"""``--placement auto``: the decisions alone, then on the embedded broker that it keeps hash where
every rank touches every row and keeps graph on the default synthetic stream."""

from __future__ import annotations

import pytest

from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.online.auto import AutoPlacement

TRIAL = 1_000


def _steps(auto: AutoPlacement, records: int, n: int, *, placed: int, hash_rows: int,
           samples: int = 100, migrating: bool = False, loop: int = 0) -> tuple[int, list[str]]:
    """``n`` control rounds of ``samples`` records each, ``placed`` bytes of which ``loop`` are
    the loop's; the decisions returned."""
    said = []
    for _ in range(n):
        records += samples
        s = auto.observe(records=records, samples=samples, embedding_bytes=placed - loop,
                         loop_bytes=loop, hash_rows=hash_rows, migrating=migrating)
        if s is not None:
            said.append(s)
    return records, said


def _to_trial(auto: AutoPlacement, records: int) -> int:
    """Hash measured at 10 bytes a row over 20 steps, then a graph placement migrated in."""
    # The window filling for the try (300 bytes a step) is not hash's cost.
    records, said = _steps(auto, records, 20, placed=1_300, loop=300, hash_rows=100)
    assert said == [] and auto.price == pytest.approx(10.0)
    auto.on_graph()
    assert auto.routes and auto.state == "hash"
    records, said = _steps(auto, records, 3, placed=50_000, hash_rows=100, migrating=True)
    assert said == [] and auto.price == pytest.approx(10.0)  # the migration is not hash's cost
    auto.on_migrated(records)
    assert auto.state == "trial"
    return records


def test_graph_is_kept_when_it_sends_fewer_bytes_than_hash_would_for_the_same_batches() -> None:
    auto = AutoPlacement(TRIAL, margin=0.05)
    records = _to_trial(auto, 0)
    # Hash would fetch 120 rows a step for these batches: 1,200 bytes at its price; graph sends
    # 1,000 (200 of them window and migrations), which is below 95% of that.
    records, said = _steps(auto, records, 19, placed=1_000, loop=200, hash_rows=120)
    assert said == [] and auto.state == "trial"  # a first trial lasts two intervals
    records, said = _steps(auto, records, 1, placed=1_000, hash_rows=120)
    assert said == [] and auto.state == "graph" and auto.routes and auto.feeding
    d = auto.decisions[-1]
    assert d["decision"] == "keep graph"
    assert (d["graph_bytes_per_sample"], d["hash_bytes_per_sample"]) == (10.0, 12.0)
    # The stream changes: graph now costs more than hash would; one interval later it goes.
    records, said = _steps(auto, records, 10, placed=1_300, hash_rows=120)
    assert said == ["hash"] and auto.state == "rest"
    assert not auto.routes and not auto.feeding


def test_a_run_that_ends_on_trial_reports_no_choice() -> None:
    # The graph placement is in force while on trial, but auto has not chosen it: a summary
    # that said "graph" read as a decision nobody took.
    auto = AutoPlacement(TRIAL, margin=0.05)
    assert auto.report(0)["kind"] == "undecided" and auto.report(0)["in_force"] == "hash"
    records = _to_trial(auto, 0)
    records, _ = _steps(auto, records, 5, placed=1_000, hash_rows=120)
    r = auto.report(records)
    assert (r["kind"], r["in_force"], r["state"]) == ("undecided", "graph", "trial")
    assert r["records_to_decision"] == 2 * TRIAL - 500
    records, _ = _steps(auto, records, 15, placed=1_000, hash_rows=120)
    r = auto.report(records)
    assert (r["kind"], r["in_force"], r["records_to_decision"]) == ("graph", "graph", None)
    records, said = _steps(auto, records, 10, placed=1_300, hash_rows=120)
    assert said == ["hash"] and auto.report(records)["kind"] == "hash"
    records, said = _steps(auto, records, 40, placed=1_300, hash_rows=120)
    assert said == ["graph"]  # tried again: hash in force, and chosen until the next verdict
    assert (auto.report(records)["kind"], auto.report(records)["in_force"]) == ("hash", "hash")


def test_graph_goes_back_to_hash_when_it_does_not_pay_then_is_tried_again_later() -> None:
    auto = AutoPlacement(TRIAL, margin=0.05)
    records = _to_trial(auto, 0)
    # Within the margin of hash's 1,000 bytes a step: not worth it.
    records, said = _steps(auto, records, 20, placed=960, hash_rows=100)
    assert said == ["hash"] and auto.decisions[-1]["decision"] == "back to hash"
    # The rest lasts 4 trial lengths, hash is measured again meanwhile ...
    records, said = _steps(auto, records, 39, placed=2_000, hash_rows=100)
    assert said == [] and auto.state == "rest" and auto.price == pytest.approx(20.0)
    records, said = _steps(auto, records, 1, placed=2_000, hash_rows=100)
    assert said == ["graph"] and auto.state == "hash" and auto.feeding and not auto.routes
    # ... and after a second failed try, twice as long.
    auto.on_graph()
    auto.on_migrated(records)
    records, said = _steps(auto, records, 20, placed=5_000, hash_rows=100)
    assert said == ["hash"]
    records, said = _steps(auto, records, 79, placed=1_000, hash_rows=100)
    assert said == []
    assert _steps(auto, records, 1, placed=1_000, hash_rows=100)[1] == ["graph"]


def test_a_resumed_graph_placement_is_kept_until_hash_was_measured() -> None:
    auto = AutoPlacement(TRIAL, graph=True, records=5_000)
    assert auto.routes and auto.price is None
    _, said = _steps(auto, 5_000, 30, placed=10**9, hash_rows=1)
    assert said == [] and auto.state == "graph"
    assert {d["decision"] for d in auto.decisions} == {"keep graph"}
    with pytest.raises(ValueError):
        AutoPlacement(0)


# -- on the embedded broker --------------------------------------------------------------------

RECORDS = 80_000


def _auto_run(online_run, syn: SyntheticConfig, name: str) -> dict:
    results = online_run(name, syn, RECORDS, placement="auto", warmup=12_000, interval=12_000)
    auto = results[0].online["placement_auto"]
    assert auto == results[1].online["placement_auto"]  # every rank decided the same
    # Batch-aware routing is chosen by each rank on its own batches, with what it weighed.
    for result in results:
        routing = result.online["batch_routing"]
        assert routing["mode"] == "auto" and routing["rounds"] in (0, 3), routing
        for decision in routing["decisions"]:
            assert decision["decision"] == "retried" or decision["seconds_cost_per_step"] > 0
    return auto


@pytest.mark.broker
@pytest.mark.slow
def test_auto_keeps_hash_where_every_rank_touches_every_row(online_run) -> None:
    # 26 fields of 2 to 10 values: every batch uses nearly all of the 150 rows on every rank,
    # so no placement cuts fetches and the loop's own traffic is pure cost.
    auto = _auto_run(online_run, SyntheticConfig(seed=3, vocab_min=2, vocab_max=10), "tiny")
    decisions = [d["decision"] for d in auto["decisions"]]
    assert decisions and decisions[0] == "back to hash", auto
    assert "keep graph" not in decisions
    first = auto["decisions"][0]
    assert first["graph_bytes_per_sample"] > first["hash_bytes_per_sample"] * 0.97


@pytest.mark.broker
@pytest.mark.slow
def test_auto_keeps_graph_on_the_default_synthetic_stream(online_run) -> None:
    auto = _auto_run(online_run, SyntheticConfig(seed=3), "default")
    decisions = [d["decision"] for d in auto["decisions"]]
    assert decisions and set(decisions) == {"keep graph"}, auto
    assert auto["state"] == "graph"
    first = auto["decisions"][0]
    assert first["graph_bytes_per_sample"] < 0.97 * first["hash_bytes_per_sample"]
