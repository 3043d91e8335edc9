"""Trainer metrics: real step counters in, Prometheus text out, parsed back and checked."""

from __future__ import annotations

import importlib

import numpy as np
import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hetgmp.partitioner import PassReport
from hetgmp.trainer.dist import KINDS, StepCounters, Totals
from hetgmp.trainer.run.metrics import FRESHNESS_BUCKETS, STALENESS_BUCKETS, BucketCounts, TrainerMetrics


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def scrape(registry: CollectorRegistry) -> tuple[dict[tuple[str, tuple], float], dict[str, str]]:
    """Samples by (name, sorted labels without rank), and the type of each family."""
    text = generate_latest(registry).decode()
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "rank"))
            samples[(s.name, labels)] = s.value
    return samples, types


def step(seed: int, staleness: list[int]) -> StepCounters:
    c = StepCounters(
        samples_read=100 + seed, samples_trained=90 + seed, global_samples=400, unique_ids=50 + seed,
        owned_reads=20, replica_reads=10 + seed, replica_refreshes=3, replica_pushes=2 + seed,
        remote_rows=17 + seed, rows_served=11, staleness=np.array(staleness, np.int64),
        loss_sum=200.0 + seed, loss_samples=90 + seed,
    )
    for i, kind in enumerate(KINDS):
        c.traffic.add(kind, 1000 * (i + 1) + seed, 10 * (i + 1), seconds=0.5 * i + seed)
    return c


@pytest.fixture()
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_step_counters_add_up_over_two_steps(registry):
    m = TrainerMetrics(registry, rank=3, staleness_bound=10)
    a, b = step(0, [5, 2]), step(7, [1, 0, 0, 4])
    m.on_step(a, 0.02, np.zeros(0), migrating=False)
    m.on_step(b, 0.3, np.zeros(0), migrating=True)
    s, _ = scrape(registry)

    assert s[("hetgmp_steps_total", ())] == 2
    assert s[("hetgmp_migration_steps_total", ())] == 1
    for name, field in [
        ("samples_trained", "samples_trained"), ("samples_read", "samples_read"),
        ("remote_rows", "remote_rows"), ("unique_rows", "unique_ids"),
        ("replica_reads", "replica_reads"), ("replica_refreshes", "replica_refreshes"),
        ("replica_pushes", "replica_pushes"),
    ]:
        assert s[(f"hetgmp_{name}_total", ())] == getattr(a, field) + getattr(b, field), name
    for i, kind in enumerate(KINDS):
        sent = s[("hetgmp_exchanged_bytes_total", (("direction", "sent"), ("kind", kind)))]
        received = s[("hetgmp_exchanged_bytes_total", (("direction", "received"), ("kind", kind)))]
        assert sent == a.traffic.sent[i] + b.traffic.sent[i] == 2000 * (i + 1) + 7
        assert received == 20 * (i + 1)
        waited = s[("hetgmp_collective_seconds_total", (("kind", kind),))]
        assert waited == pytest.approx(1.0 * i + 7)
    assert s[("hetgmp_train_logloss_total", ())] == pytest.approx(a.loss_sum + b.loss_sum)
    # The gauges hold the last step.
    assert s[("hetgmp_train_loss", ())] == pytest.approx(207.0 / 97)
    assert s[("hetgmp_remote_rows_per_sample", ())] == pytest.approx((24 + 3) / 97)
    assert s[("hetgmp_staleness_bound_updates", ())] == 10
    assert s[("hetgmp_step_duration_seconds_count", ())] == 2
    assert s[("hetgmp_step_duration_seconds_sum", ())] == pytest.approx(0.32)
    assert s[("hetgmp_step_duration_seconds_bucket", (("le", "0.01"),))] == 0
    assert s[("hetgmp_step_duration_seconds_bucket", (("le", "0.025"),))] == 1
    assert s[("hetgmp_step_duration_seconds_bucket", (("le", "0.5"),))] == 2


def test_staleness_histogram_buckets_come_from_the_lag_counts(registry):
    m = TrainerMetrics(registry, rank=0, staleness_bound=100)
    lags = np.zeros(1500, np.int64)
    lags[[0, 1, 3, 10, 11, 999, 1000, 1499]] = [7, 2, 4, 1, 5, 6, 8, 9]
    m.on_step(step(0, list(lags)), 0.1, np.zeros(0), False)
    m.on_step(step(1, [1, 1]), 0.1, np.zeros(0), False)  # a shorter histogram adds up too
    s, types = scrape(registry)

    assert types["hetgmp_replica_staleness_updates"] == "histogram"
    lags[:2] += 1
    values = np.arange(lags.size)
    for bound in STALENESS_BUCKETS:
        le = (("le", f"{float(bound)}"),)
        assert s[("hetgmp_replica_staleness_updates_bucket", le)] == lags[values <= bound].sum(), bound
    assert s[("hetgmp_replica_staleness_updates_bucket", (("le", "+Inf"),))] == lags.sum() == 44
    assert s[("hetgmp_replica_staleness_updates_count", ())] == 44
    assert s[("hetgmp_replica_staleness_updates_sum", ())] == values @ lags


def test_freshness_is_bucketed_with_le_semantics(registry):
    m = TrainerMetrics(registry, rank=0, staleness_bound=0)
    fresh = np.array([0.01, 0.05, 0.0501, 0.3, 0.3, 2.5, 59.0, 61.0, -0.2, np.nan])
    m.on_step(step(0, [0]), 0.1, fresh, False)
    s, _ = scrape(registry)

    expected = {0.05: 3, 0.1: 4, 0.25: 4, 0.5: 6, 1.0: 6, 2.5: 7, 5.0: 7, 30.0: 7, 60.0: 8}
    for bound, n in expected.items():
        assert bound in FRESHNESS_BUCKETS
        assert s[("hetgmp_freshness_seconds_bucket", (("le", str(bound)),))] == n, bound
    # The NaN is skipped; the negative (clock skew) counts as 0 s.
    assert s[("hetgmp_freshness_seconds_count", ())] == 9
    assert s[("hetgmp_freshness_seconds_sum", ())] == pytest.approx(fresh[:8].sum())


def test_placement_repartition_migration_checkpoint_auc(registry):
    clock = FakeClock(1000.0)
    m = TrainerMetrics(registry, rank=1, staleness_bound=5, clock=clock)
    s, _ = scrape(registry)
    # Gauges without a value have no sample (not NaN): absent() tells the truth.
    assert ("hetgmp_checkpoint_age_seconds", ()) not in s
    assert ("hetgmp_heldout_auc", ()) not in s
    assert ("hetgmp_train_loss", ()) not in s
    assert ("hetgmp_placement_graph", ()) not in s  # not --placement auto (yet)
    assert s[("hetgmp_repartitions_total", (("kind", "full"),))] == 0  # rate() sees the first one
    m.on_placement_choice(False, 410.5, None)  # hash measured, graph not yet
    s, _ = scrape(registry)
    assert s[("hetgmp_placement_graph", ())] == 0
    assert s[("hetgmp_placement_hash_bytes_per_sample", ())] == 410.5
    assert ("hetgmp_placement_graph_bytes_per_sample", ()) not in s
    m.on_placement_choice(True, 400.0, 250.0)
    s, _ = scrape(registry)
    assert (s[("hetgmp_placement_graph", ())], s[("hetgmp_placement_graph_bytes_per_sample", ())],
            s[("hetgmp_placement_hash_bytes_per_sample", ())]) == (1, 250.0, 400.0)

    m.on_placement(4, rows_owned=1200, rows_replicated=30, imbalance_samples=1.25, imbalance_rows=1.5)
    m.on_repartition(3.0, "full")
    m.on_repartition(0.2, "incremental", PassReport(100, 900, 90, regroup=40, refine=7,
                                                    row_balance=3))
    m.on_repartition(0.04, "incremental", PassReport(50, 800, 80, group_balance=11,
                                                     row_balance=2))
    m.on_migration_chunk(100, 6400)
    m.on_migration_chunk(50, 3200)
    m.on_migration_done(2.0)
    m.on_checkpoint(990.0)
    m.on_heldout_auc(0.75)
    clock.now = 1012.5
    s, _ = scrape(registry)

    assert s[("hetgmp_placement_version", ())] == 4
    assert s[("hetgmp_rows_owned", ())] == 1200
    assert s[("hetgmp_rows_replicated", ())] == 30
    assert s[("hetgmp_imbalance_ratio", (("what", "samples"),))] == 1.25
    assert s[("hetgmp_imbalance_ratio", (("what", "rows"),))] == 1.5
    assert s[("hetgmp_repartitions_total", (("kind", "full"),))] == 1
    assert s[("hetgmp_repartitions_total", (("kind", "incremental"),))] == 2
    moved = {step: s[("hetgmp_partitioner_moves_total", (("step", step),))]
             for step in ("regroup", "group_balance", "refine", "row_balance")}
    assert moved == {"regroup": 40, "group_balance": 11, "refine": 7, "row_balance": 5}
    incremental = (("kind", "incremental"),)
    assert s[("hetgmp_repartition_duration_seconds_count", incremental)] == 2
    assert s[("hetgmp_repartition_duration_seconds_bucket", (*incremental, ("le", "0.05")))] == 1
    assert s[("hetgmp_repartition_duration_seconds_sum", (("kind", "full"),))] == 3.0
    assert s[("hetgmp_migrated_rows_total", ())] == 150
    assert s[("hetgmp_migrated_bytes_total", ())] == 9600
    assert s[("hetgmp_migrations_total", ())] == 1
    assert s[("hetgmp_migration_duration_seconds_bucket", (("le", "2.5"),))] == 1
    assert s[("hetgmp_checkpoints_total", ())] == 1
    assert s[("hetgmp_checkpoint_age_seconds", ())] == 22.5  # computed at scrape time
    assert s[("hetgmp_heldout_auc", ())] == 0.75
    with pytest.raises(ValueError, match="kind"):
        m.on_repartition(1.0, "weekly")


def test_names_follow_conventions_and_every_series_has_the_rank(registry):
    m = TrainerMetrics(registry, rank=2, staleness_bound=1)
    m.on_step(step(0, [1]), 0.1, np.array([1.0]), False)
    m.on_placement(1, 1, 1, 1.0, 1.0)
    m.on_placement_choice(True, 1.0, 1.0)
    m.on_route_choice({"rounds": 3.0, "seconds_saved_per_step": 0.002,
                       "seconds_cost_per_step": 0.001})
    m.on_checkpoint(0.0)
    m.on_heldout_auc(0.5)
    m.on_store({"memory_rows": 5, "created": 9, "evicted": 0, "looked_up": 20, "disk_rows": 4,
                "spilled": 6, "restored": 2, "disk_bytes": 4096})
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert len(families) >= 30
    routing = {f.name: f.samples[0].value for f in families
               if f.name.startswith("hetgmp_batch_routing")}
    assert routing == {"hetgmp_batch_routing_rounds": 3.0,
                       "hetgmp_batch_routing_seconds_saved_per_step": 0.002,
                       "hetgmp_batch_routing_seconds_cost_per_step": 0.001}
    for family in families:
        assert family.name.startswith("hetgmp_"), family.name
        assert family.samples, f"{family.name} has no sample after every event"
        for s in family.samples:
            assert s.labels["rank"] == "2", s
            if family.type == "counter":
                assert s.name.endswith("_total"), s.name
            assert not s.name.endswith("_created"), s.name
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_updates")), family.name
    # A second exporter of another rank on its own registry does not clash.
    TrainerMetrics(CollectorRegistry(), rank=3, staleness_bound=1)
    with pytest.raises(ValueError, match="Duplicated"):
        TrainerMetrics(registry, rank=2, staleness_bound=1)


def test_bucket_counts_match_numpy_histogram():
    rng = np.random.default_rng(0)
    values = rng.exponential(2.0, 10_000)
    h = BucketCounts(FRESHNESS_BUCKETS)
    h.observe(values[:5000])
    h.observe(values[5000:])
    cumulative = [n for _, n in h.buckets()]
    expected = [(values <= b).sum() for b in FRESHNESS_BUCKETS] + [values.size]
    assert cumulative == expected
    assert h.sum == pytest.approx(values.sum())


def test_importing_creates_nothing_in_the_global_registry():
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    importlib.reload(importlib.import_module("hetgmp.trainer.run.metrics"))
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    assert not any(n.startswith("hetgmp_") for n in before)


def test_job_totals_add_bytes_and_keep_the_longer_wait_of_two_ranks() -> None:
    a, b = Totals(), Totals()
    a.add(step(0, [1]))
    a.add(step(0, [1]))
    b.add(step(7, [1]))
    slow_a = step(0, [1])
    slow_a.traffic.seconds[:3] += 100.0  # rank a waits longer in the first three kinds
    a.add(slow_a)
    job = a.merge(b)
    for i in range(len(KINDS)):
        assert job.traffic.sent[i] == 3 * 1000 * (i + 1) + (1000 * (i + 1) + 7)
        waited_a = 3 * 0.5 * i + (100.0 if i < 3 else 0.0)
        assert job.traffic.seconds[i] == pytest.approx(max(waited_a, 0.5 * i + 7))
        assert job.traffic.calls[i] == 3
    assert job.summary()["collective_seconds_gradient"] == pytest.approx(
        max(3 * 0.5 * KINDS.index("gradient"), 0.5 * KINDS.index("gradient") + 7), abs=1e-4)


def test_a_step_without_samples_adds_no_loss(registry):
    """A rank that trains nothing in a step keeps its loss gauge; the sums say what the job did."""
    m = TrainerMetrics(registry, rank=0, staleness_bound=0)
    a = step(2, [0])
    idle = StepCounters(samples_read=0, samples_trained=0, global_samples=400)
    m.on_step(a, 0.1, np.zeros(0), False)
    m.on_step(idle, 0.1, np.zeros(0), False)
    s, types = scrape(registry)

    assert types["hetgmp_train_logloss"] == "counter"
    assert s[("hetgmp_train_logloss_total", ())] == pytest.approx(a.loss_sum)
    assert s[("hetgmp_samples_trained_total", ())] == a.samples_trained
    assert s[("hetgmp_train_loss", ())] == pytest.approx(a.loss_sum / a.samples_trained)


def test_the_store_by_tier_and_its_counts(registry):
    m = TrainerMetrics(registry, rank=0, staleness_bound=0)
    assert not any(k[0].startswith("hetgmp_store") for k in scrape(registry)[0])
    m.on_store({"memory_rows": 100, "created": 300, "evicted": 0, "looked_up": 1000})
    samples, _ = scrape(registry)
    assert samples[("hetgmp_store_rows", (("tier", "memory"),))] == 100
    assert ("hetgmp_store_rows", (("tier", "disk"),)) not in samples  # no tier, no disk series
    assert "hetgmp_store_disk_bytes" not in {k[0] for k in samples}
    m.on_store({"memory_rows": 100, "created": 300, "evicted": 0, "looked_up": 1500,
                "disk_rows": 200, "spilled": 260, "restored": 60, "disk_bytes": 65536})
    samples, types = scrape(registry)
    assert samples[("hetgmp_store_rows", (("tier", "disk"),))] == 200
    assert samples[("hetgmp_store_disk_bytes", ())] == 65536
    assert samples[("hetgmp_store_spilled_rows_total", ())] == 260
    assert samples[("hetgmp_store_restored_rows_total", ())] == 60
    assert samples[("hetgmp_store_looked_up_rows_total", ())] == 1500
    assert types["hetgmp_store_spilled_rows"] == "counter"
