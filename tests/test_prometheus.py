"""The real Prometheus server scrapes a trainer exporter; the config passes promtool.

Needs Debian's `prometheus` package (`prometheus`, `promtool`); `make tools` installs it. Without
it these tests fail with that message rather than skip: an unchecked dashboard is not a pass.
"""

from __future__ import annotations

import re
import runpy
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from hetgmp.runtime import free_port, free_ports
from hetgmp.streaming.consumer import ConsumerStats
from hetgmp.streaming.metrics import ConsumerCollector, ProducerCollector
from hetgmp.streaming.producer import ProduceReport
from hetgmp.trainer.dist import KINDS, StepCounters
from hetgmp.trainer.run.metrics import TrainerMetrics, serve_rank

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def prom(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tests/prometheus_server.py (a helper, imported by its plain name)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import prometheus_server

    return prometheus_server


def dashboard_expressions() -> list[str]:
    module = runpy.run_path(str(ROOT / "deploy/grafana/make_dashboard.py"), run_name="not_main")
    return module["dashboard_expressions"]()


def sample_names(registry: CollectorRegistry) -> set[str]:
    return {s.name for family in registry.collect() for s in family.samples}


# Metric names in a dashboard expression: ours, and kafka_exporter's where ours mean the same.
METRIC = r"(?:hetgmp|kafka)_\w+"


def streaming_sample_names() -> set[str]:
    """Sample names the consumer and producer collectors export (consumer faked, no broker)."""
    registry = CollectorRegistry()
    consumer = SimpleNamespace(config=SimpleNamespace(topic="t", group_id="g"),
                               snapshot=lambda: {0: 1}, lag=lambda positions=None: {0: (3, 1.5)},
                               stats=ConsumerStats(rejected=Counter(bad_json=1)))
    registry.register(ConsumerCollector(consumer))  # type: ignore[arg-type]
    registry.register(ProducerCollector(ProduceReport))
    return sample_names(registry)


def serve_sample_names() -> set[str]:
    """Sample names a serve process exports, with a small real model that has scored once."""
    from hetgmp.streaming import Schema
    from hetgmp.trainer.model import FlatParameters, ModelConfig, build_model
    from hetgmp.trainer.serving import Service, ServingModel
    from hetgmp.trainer.serving.deltas import Delta, Publish
    from hetgmp.trainer.sources.synthetic import synthetic_batch

    shape = {"model": "deepfm", "row_dim": 5, "hidden": [8], "cross_layers": 0, "fields": 26,
             "dense": 13}
    flat = FlatParameters(build_model(ModelConfig(embed_dim=4, hidden=(8,)), 26, 13)).flat
    model = ServingModel(shape, flat.detach().numpy(), lineage="x", version=1, world=1, step=0)
    model.apply(Delta("mark", Publish(0, 1, 0, 1, 1, 1_000, "x"), np.zeros(0, np.int64),
                      np.zeros((0, 0), np.float32), messages=0))  # a watermark: lag exported
    service = Service(model, None, Schema())
    from hetgmp.streaming.synthetic import SyntheticStream

    model.score(synthetic_batch(SyntheticStream(), 0, 4))
    service.metrics.requests.labels("200").inc()
    service.metrics.latency.observe(0.01)
    service.metrics.records.inc(4)
    service.pool.shutdown()
    return sample_names(service.registry)


def test_every_dashboard_metric_is_exported():
    trainer = CollectorRegistry()
    m = TrainerMetrics(trainer, rank=0, staleness_bound=1)
    # Gauges have samples once they have a value: give every one a value.
    m.on_step(StepCounters(samples_trained=1, global_samples=1), 0.1, np.ones(1), False)
    m.on_placement(1, 1, 1, 1.0, 1.0)
    m.on_placement_choice(True, 1.0, 1.0)
    m.on_route_choice({"rounds": 0.0})
    m.on_checkpoint(0.0)
    m.on_heldout_auc(0.5)
    m.on_store({"memory_rows": 1, "created": 2, "evicted": 0, "looked_up": 3, "disk_rows": 1,
                "spilled": 1, "restored": 1, "disk_bytes": 4096})  # with a disk tier
    known = sample_names(trainer) | streaming_sample_names() | serve_sample_names()
    assert "hetgmp_records_consumed_total" in known  # CounterMetricFamily adds _total
    exprs = dashboard_expressions()
    assert len(exprs) >= 30
    for expr in exprs:
        names = set(re.findall(METRIC, expr))
        assert names and names <= known, (expr, names - known)


def test_prometheus_config_passes_promtool(prom):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(prom.INSTALL_HINT.replace("prometheus binary", "promtool binary"))
    r = subprocess.run([promtool, "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_missing_binary_says_how_to_install(prom, monkeypatch):
    monkeypatch.setattr(prom.shutil, "which", lambda name: None)
    with pytest.raises(prom.PrometheusMissing, match="make tools"):
        prom.PrometheusServer(["127.0.0.1:1"]).start()


class Driver(threading.Thread):
    """Plays a trainer rank: a step every 50 ms, and every other event now and then."""

    def __init__(self, metrics: TrainerMetrics) -> None:
        super().__init__(daemon=True)
        self.metrics = metrics
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test
            self.error = e

    def _run(self) -> None:
        m, i = self.metrics, 0
        while not self.halt.wait(0.05):
            c = StepCounters(samples_read=256, samples_trained=250, global_samples=500, unique_ids=900,
                             owned_reads=500, replica_reads=300, replica_refreshes=20, replica_pushes=15,
                             remote_rows=100, rows_served=110, staleness=np.array([200, 50, 30, 20]),
                             loss_sum=300.0, loss_samples=250)
            for k, kind in enumerate(KINDS):
                c.traffic.add(kind, 1000 * (k + 1), 900 * (k + 1))
            # Every step takes 30 ms: the p50 interpolates inside the (0.025, 0.05] bucket.
            m.on_step(c, 0.03, np.full(250, 0.4), migrating=i % 4 == 0)
            m.on_migration_chunk(64, 64 * 200)
            m.on_store({"memory_rows": 1000, "created": 2000 + i, "evicted": 0,
                        "looked_up": 5000 * (i + 1), "disk_rows": 1000 + i,
                        "spilled": 100 * (i + 1), "restored": 50 * (i + 1),
                        "disk_bytes": 1 << 20})
            if i % 5 == 0:
                m.on_placement(1 + i // 5, 5000, 300, 1.1, 1.05)
                m.on_repartition(0.2, "incremental")
                m.on_migration_done(0.3)
                m.on_heldout_auc(0.7)
            if i % 10 == 0:
                m.on_checkpoint(time.time())
            i += 1


@pytest.mark.slow
def test_real_prometheus_scrapes_a_trainer_rank_and_answers_the_dashboard(prom):
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, rank=1, staleness_bound=4)
    base = free_port() - 1
    port = serve_rank(registry, base, rank=1)
    assert port == base + 1
    driver = Driver(metrics)
    driver.start()
    try:
        with prom.PrometheusServer([f"127.0.0.1:{port}"]) as server:
            server.wait_for_targets_up(timeout=30)
            (row,) = server.wait_for("hetgmp_samples_trained_total", timeout=10)
            assert row["metric"]["rank"] == "1" and row["metric"]["job"] == "hetgmp"
            assert float(row["value"][1]) > 0
            p50 = server.wait_for(
                "histogram_quantile(0.5, sum by (le) (rate(hetgmp_step_duration_seconds_bucket[1m])))",
                timeout=10,
            )
            assert 0.025 <= float(p50[0]["value"][1]) <= 0.05

            # Every dashboard expression is valid PromQL; those over trainer metrics alone return
            # data (the consumer's and producer's are not exported here; the annotation needs
            # 10 s of history).
            exposed = sample_names(registry)
            for expr in dashboard_expressions():
                names = set(re.findall(METRIC, expr))
                if " offset " in expr or not names <= exposed:
                    server.query(expr)  # raises ValueError on a parse error
                    continue
                result = server.wait_for(expr, timeout=10)
                assert all(np.isfinite(float(r["value"][1])) for r in result), (expr, result)
    finally:
        driver.halt.set()
        driver.join(5)
    assert driver.error is None, driver.error


# -- a real run: producer, broker, two training ranks, Prometheus ------------------------------

#: Every metric the operations issue names, as exposed by a rank or the producer after a run.
NAMED = [
    "hetgmp_records_consumed_total", "hetgmp_decode_errors_total",
    "hetgmp_dead_lettered_records_total", "hetgmp_step_duration_seconds_bucket",
    "hetgmp_samples_trained_total", "hetgmp_remote_rows_total", "hetgmp_remote_rows_per_sample",
    "hetgmp_exchanged_bytes_total", "hetgmp_replica_refreshes_total",
    "hetgmp_replica_pushes_total", "hetgmp_replica_staleness_updates_bucket",
    "hetgmp_rows_owned", "hetgmp_rows_replicated", "hetgmp_placement_version",
    "hetgmp_repartition_duration_seconds_bucket", "hetgmp_migrated_rows_total",
    "hetgmp_migrated_bytes_total", "hetgmp_migration_duration_seconds_bucket",
    "hetgmp_imbalance_ratio", "hetgmp_train_loss", "hetgmp_train_logloss_total", "hetgmp_heldout_auc",
    "hetgmp_freshness_seconds_bucket", "hetgmp_checkpoint_age_seconds",
    "hetgmp_partitioner_moves_total",
]
RUN_RECORDS = 80_000
BAD_RECORDS = 7


def _run_state(ranks: list[str], report: ProduceReport, errors: list) -> str:
    """Records produced, the trainer's errors, and what each rank's endpoint says."""
    from hetgmp.trainer.app.demo import scrape

    parts = [f"produced {report.records}", f"trainer errors {errors!r}"]
    for url in ranks:
        try:
            got = scrape(url)
        except OSError as exc:
            parts.append(f"{url}: {exc}")
            continue
        parts.append(f"{url}: " + ", ".join(
            f"{name} {sum(v for _, v in got.get(name, []))}" for name in (
                "hetgmp_records_consumed_total", "hetgmp_samples_trained_total",
                "hetgmp_placement_version")))
    return "; ".join(parts)


def _predictions(serve, stop: threading.Event) -> None:
    """Send 64 records every 100 ms once ``serve`` listens, until ``stop``."""
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    serve.listening(120)
    body = b"\n".join(SyntheticStream(SyntheticConfig(seed=1)).lines(0, 64))
    while not stop.wait(0.1):
        serve.request("/predict", body)


@pytest.mark.broker
@pytest.mark.slow
def test_real_run_feeds_every_dashboard_expression(prom, kafka, unique, tmp_path):
    from kafka import KafkaProducer
    from serve_process import Serve

    from hetgmp.streaming import serve_metrics
    from hetgmp.streaming.consumer import ConsumerConfig
    from hetgmp.streaming.kafka import ensure_topic
    from hetgmp.streaming.producer import ProduceConfig, produce
    from hetgmp.streaming.synthetic import SyntheticConfig
    from hetgmp.trainer.app.demo import scrape
    from hetgmp.trainer.dist import LaunchConfig
    from hetgmp.trainer.dist.launcher import launch, stop_event
    from hetgmp.trainer.embedding import StoreConfig
    from hetgmp.trainer.model import ModelConfig
    from hetgmp.trainer.online import OnlineConfig
    from hetgmp.trainer.run import Job, run_rank
    from hetgmp.trainer.sources import KafkaSpec
    from hetgmp.trainer.step import TrainConfig

    topic = unique("prom-run")
    ensure_topic(kafka, topic, 2)
    # A few malformed records: counted by reason and dead-lettered, never fatal (invariant 6).
    raw = KafkaProducer(**kafka.client_kwargs())
    for i in range(BAD_RECORDS):
        raw.send(topic, value=b"not\ta\tcriteo\trecord %d" % i, partition=i % 2)
    raw.flush()
    raw.close()

    report = ProduceReport()
    producer_registry = CollectorRegistry()
    producer_registry.register(ProducerCollector(lambda: report, {"topic": topic}))
    producer_port = free_port()
    producer_server = serve_metrics(producer_registry, producer_port)
    # The ranks bind base and base + 1 seconds from now, after gloo and Kafka have opened
    # connections: below the ephemeral range none of those can take either port meanwhile.
    base = free_ports(19500, 3)
    serve_port = base + 2  # hetgmp serve, once the run's first checkpoint is there
    targets = [f"127.0.0.1:{producer_port}", f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}",
               f"127.0.0.1:{serve_port}"]
    job = Job(
        KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=unique("prom-group")), idle_s=60,
                  poll_s=0.05),
        ModelConfig(embed_dim=8, hidden=(16,)),
        # A disk tier under a small memory tier: the store panels' disk series and rates.
        store=StoreConfig(max_rows=20_000, disk_dir=str(tmp_path / "tier")),
        # auto: the default stream keeps graph, and the decisions feed the auto panel.
        train=TrainConfig(global_batch=1024, placement="auto", warmup=8_000, log_every=0),
        online=OnlineConfig(repartition_interval="12000", window=30_000,
                            checkpoint_dir=str(tmp_path), checkpoint_interval="15000",
                            max_records=RUN_RECORDS),
        metrics_port=base, metrics_linger_s=120)
    stop = stop_event()
    results: list = []
    errors: list = []

    def train() -> None:
        try:
            results.extend(launch(run_rank, job, LaunchConfig(device="cpu", workers=2, timeout_s=120), stop))
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    trainer = threading.Thread(target=train, daemon=True)
    # Slow enough that Prometheus scrapes the run many times, and sees several placements.
    producer = threading.Thread(target=lambda: produce(
        kafka, ProduceConfig(topic=topic, count=RUN_RECORDS, rate=4000, partitions=2),
        SyntheticConfig(seed=1), report=report), daemon=True)
    ranks = [f"http://127.0.0.1:{base + r}/metrics" for r in range(2)]
    serve = Serve(tmp_path, kafka, port=serve_port, wait=False)
    load = threading.Thread(target=_predictions, args=(serve, stop), daemon=True)
    try:
        with prom.PrometheusServer(targets) as server:
            trainer.start()
            producer.start()
            load.start()
            try:
                server.wait_for("max(hetgmp_placement_version) > 0", timeout=60)
            except TimeoutError as exc:  # once in a clean CI clone: say where the run stood
                raise AssertionError(f"{exc}\nrun: {_run_state(ranks, report, errors)}") from None
            # While the run goes on: every dashboard expression returns data.
            missing = []
            for expr in dashboard_expressions():
                try:
                    server.wait_for(expr, timeout=20)
                except TimeoutError:
                    missing.append(expr)
            assert not missing, missing

            # After it: the endpoints expose every named metric with the run's final figures.
            producer.join(60)
            total = lambda samples, name: sum(  # noqa: E731
                v for s in samples for _, v in s.get(name, []))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not errors:
                # A rank writing its final checkpoint on a loaded box can take over the
                # scrape's default 2 s to answer (one make test run timed out here).
                samples = [scrape(u, timeout=15) for u in ranks]
                if total(samples, "hetgmp_checkpoints_total") and total(
                        samples, "hetgmp_samples_trained_total") >= RUN_RECORDS and all(
                        r.get("hetgmp_checkpoint_age_seconds") for r in samples):
                    break
                time.sleep(0.5)
            assert not errors, errors
            time.sleep(1.0)  # the final checkpoint of the bounded run
            samples = [scrape(u, timeout=15) for u in ranks]
            names = set().union(*samples)
            assert set(NAMED) <= names, set(NAMED) - names
            # A bounded run: every record produced was consumed and trained, the bad ones counted.
            assert total(samples, "hetgmp_records_consumed_total") == report.records == RUN_RECORDS
            assert total(samples, "hetgmp_samples_trained_total") == RUN_RECORDS
            assert total(samples, "hetgmp_decode_errors_total") == BAD_RECORDS
            assert total(samples, "hetgmp_dead_lettered_records_total") == BAD_RECORDS
            assert min(v for s in samples for _, v in s["hetgmp_placement_version"]) > 0
            assert total(samples, "hetgmp_migrated_rows_total") > 0
            assert total(samples, "hetgmp_partitioner_moves_total") > 0  # incremental passes ran
            assert 0.5 < max(v for s in samples for _, v in s["hetgmp_heldout_auc"]) < 1.0
            assert all(v >= 1.0 for s in samples for _, v in s["hetgmp_imbalance_ratio"])
            assert serve.metric("hetgmp_serve_records_scored_total") > 0
            assert serve.metric("hetgmp_serve_publish_gaps_total") == 0
    finally:
        stop.set()  # ends the ranks' linger and the predictions
        trainer.join(60)
        producer_server.shutdown()
        serve.stop()
    assert not errors, errors
    assert results and results[0].job_totals.samples == RUN_RECORDS
