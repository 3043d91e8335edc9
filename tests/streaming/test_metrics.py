"""Streaming metrics: served over HTTP, parsed as Prometheus text, values match the run."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hetgmp.runtime import free_port
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.kafka import ensure_topic
from hetgmp.streaming.metrics import ConsumerCollector, ProducerCollector, WindowCollector
from hetgmp.streaming.metrics import serve_metrics as serve
from hetgmp.streaming.producer import ProduceConfig, ProduceReport, produce
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.streaming.window import AccessWindow, WindowConfig

pytestmark = pytest.mark.broker


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_consumer_producer_and_window_metrics_match_the_run(kafka, unique):
    topic = unique("metrics")
    ensure_topic(kafka, topic, 2)
    report = ProduceReport()
    registry = CollectorRegistry()
    registry.register(ProducerCollector(lambda: report, {"topic": topic}))
    produce(
        kafka, ProduceConfig(topic=topic, count=3000, partitions=2), SyntheticConfig(seed=5), report=report
    )
    bad = KafkaProducer(**kafka.client_kwargs())
    bad.send(topic, b"oops", partition=0)
    bad.flush()
    bad.close()

    window = AccessWindow(26, WindowConfig(capacity=1000))
    port = free_port()
    server = serve(registry, port)
    try:
        with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=""), partitions=[0, 1]) as c:
            registry.register(ConsumerCollector(c))
            registry.register(WindowCollector(window))
            deadline = time.monotonic() + 30
            while c.stats.records < 3000 and time.monotonic() < deadline:
                window.add(c.next_batch(1000, 0.5).ids)
            time.sleep(0.5)
            c.next_batch(10, 0.5)  # the bad record follows the producer's on partition 0
            m = scrape(port)
            snap = c.snapshot()
    finally:
        server.shutdown()
    t = (("topic", topic),)
    assert m[("hetgmp_records_produced_total", t)] == 3000
    assert m[("hetgmp_records_consumed_total", t)] == 3000
    assert m[("hetgmp_decode_errors_total", (("reason", "wrong_field_count"), ("topic", topic)))] == 1
    assert m[("hetgmp_dead_lettered_records_total", t)] == 1
    for p, off in snap.items():
        assert m[("hetgmp_consumer_position", (("partition", str(p)), ("topic", topic)))] == off
    assert m[("hetgmp_window_samples", ())] == 1000
    assert m[("hetgmp_window_samples_seen", ())] == 3000
    # Lag from the fetch responses' high watermarks: everything read, so none (and the broker's
    # wrong ListOffsets end offsets play no part).
    for p in (0, 1):
        labels = (("consumergroup", "none"), ("partition", str(p)), ("topic", topic))
        assert m[("kafka_consumergroup_lag", labels)] == 0
        assert m[("hetgmp_consumer_lag_seconds", labels)] == 0
    assert np.isfinite(m[("hetgmp_window_bytes", ())])


def test_collectors_build_nothing_at_import():
    import importlib

    import prometheus_client

    before = set(prometheus_client.REGISTRY._names_to_collectors)
    importlib.reload(importlib.import_module("hetgmp.streaming.metrics"))
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
