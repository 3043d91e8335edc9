"""``hetgmp bench serve`` short: a row for each run, the poisoned log refused message by message
with the scores unchanged, the stalled connections closed in time; and its parts alone."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bench.serve import FIELDS, main, parse_args
from bench.serve_probes import POISON_KINDS, craft, expected_reason, metric_sums
from hetgmp.trainer.serving import Publish, log_version
from hetgmp.trainer.serving.follower import DeltaGate, FollowerStats

# The serving tests' small model, loaded by file (tests/trainer is not on this directory's path).
_spec = importlib.util.spec_from_file_location(
    "small_serving_for_bench", Path(__file__).parents[1] / "trainer" / "small_serving.py")
assert _spec is not None and _spec.loader is not None
small = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(small)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_serve_bench_prints_a_row_for_each_run(capsys: pytest.CaptureFixture[str]) -> None:
    # Enough steps that a checkpoint comes before the last one, however fast the ranks are.
    code = main(["--records", "24000", "--rate", "8000", "--global-batch", "1024",
                 "--checkpoint-s", "0.5", "--serve-s", "1", "--stalled", "5",
                 "--poison-every", "3", "--header-timeout-s", "1", "--body-timeout-s", "1"])
    out = capsys.readouterr().out
    print(out)  # the figures, for the record (pytest -s shows them)
    assert code == 0, out[-3000:]
    last = json.loads(out.strip().splitlines()[-1])
    assert last["bench"] == "serve"
    rows = {r["run"]: r for r in last["rows"]}
    assert list(rows) == ["publish_1s", "publish_0.25s", "poisoned", "slow_clients"]
    for r in rows.values():
        assert set(r) == {"run", *FIELDS}, r["run"]
    for name, interval in (("publish_1s", 1.0), ("publish_0.25s", 0.25)):
        r = rows[name]
        assert r["publish_interval_s"] == interval and r["samples_trained"] > 0
        assert r["delta_bytes_per_sample"] > 0 and r["serve_records_per_s"] > 0
        assert r["poisoned_messages"] is None and r["stalled_connections"] is None
        # A run this short may end before serve answers (no append time is then reached).
        if r["freshness_p50_s"] is not None:
            assert 0 < r["freshness_p50_s"] <= r["freshness_p99_s"]
    p = rows["poisoned"]
    assert p["valid_messages"] > 0
    assert p["rejected_messages"] == p["poisoned_messages"] > 0
    assert p["rejected_by_reason"] == p["expected_by_reason"]
    assert p["applied_messages"]["poisoned"] == p["applied_messages"]["clean"]
    assert p["rejected_messages_clean"] == 0
    assert p["max_score_diff_vs_clean"] == 0.0
    assert p["freshness_p50_s"] is None and p["stalled_connections"] is None
    s = rows["slow_clients"]
    assert s["stalled_connections"] == 10
    assert s["stalled_closed_within_timeout"] == s["stalled_connections"]
    assert s["normal_p99_ms_idle"] > 0 and s["normal_p99_ms_with_stalled"] > 0
    assert "slow_clients" in out.splitlines()[-2]  # the table comes before the JSON line


@pytest.mark.parametrize("kind", POISON_KINDS)
def test_each_crafted_message_is_refused_for_its_reason(kind: str) -> None:
    model = small.small_model()
    head = Publish(rank=0, world=2, generation=small.GEN, publish=small.PUBLISHES + 1, step=500,
                   watermark_ms=1_700_000_000_000, lineage=small.LINEAGE,
                   base=log_version(2, 17))
    gate = DeltaGate(model, FollowerStats())
    assert not gate.receive(craft(kind, head, small.IDS[:4], 17), None, "test@0")
    assert {r: n for r, n in gate.stats.rejected.items() if n} == {expected_reason(kind): 1}


def test_publish_interval_is_an_alias_and_bad_intervals_are_refused() -> None:
    assert parse_args([]).intervals == [1.0, 0.25]
    assert parse_args(["--publish-interval", "0.5"]).intervals == [0.5]
    assert parse_args(["--publish-intervals", "2,1,0.5"]).intervals == [2.0, 1.0, 0.5]
    for bad in ("0", "1,x", "1,1.0", ""):
        with pytest.raises(SystemExit) as exc:
            parse_args(["--publish-intervals", bad])
        assert exc.value.code == 2


def test_metric_sums_reads_a_labelled_counter() -> None:
    text = ("# HELP hetgmp_serve_deltas_rejected_total refused\n"
            "# TYPE hetgmp_serve_deltas_rejected_total counter\n"
            'hetgmp_serve_deltas_rejected_total{reason="shape"} 3.0\n'
            'hetgmp_serve_deltas_rejected_total{reason="order"} 2.0\n')
    assert metric_sums(text, "hetgmp_serve_deltas_rejected_total", "reason") == {
        "shape": 3.0, "order": 2.0}
    assert metric_sums(text, "hetgmp_serve_deltas_applied_total", "kind") == {}
