"""Prometheus metrics of the streaming components, read at scrape time.

Nothing is created at import. Each component already keeps plain counters (``ConsumerStats``,
``ProduceReport``, the window's sizes); a custom collector turns them into metric families when
Prometheus scrapes, so the hot path pays nothing for metrics. Register collectors on a
``CollectorRegistry`` you pass in and serve it with :func:`serve`.

Consumer lag is exported only when asked for (``lag=True``): the embedded Tansu broker reports
wrong end offsets (see FACTS.md), and a wrong lag is worse than none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streaming.consumer import ClickConsumer
from streaming.producer import ProduceReport
from streaming.window import AccessWindow

__all__ = ["ConsumerCollector", "ProducerCollector", "WindowCollector", "serve_metrics"]

log = logging.getLogger(__name__)


def _counter(name: str, doc: str, value: float, labels: dict[str, str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


class ConsumerCollector(Collector):
    """Counters of one :class:`~streaming.consumer.ClickConsumer` (labels: topic, and any given)."""

    def __init__(
        self, consumer: ClickConsumer, labels: dict[str, str] | None = None, lag: bool = False
    ) -> None:
        self.consumer = consumer
        self.labels = {"topic": consumer.config.topic, **(labels or {})}
        self.lag = lag

    def collect(self) -> Iterator[Metric]:
        s, lb = self.consumer.stats, self.labels
        yield _counter("hetgmp_records_consumed", "Records decoded from Kafka.", s.records, lb)
        yield _counter("hetgmp_messages_consumed", "Kafka messages consumed.", s.messages, lb)
        yield _counter("hetgmp_consumed_bytes", "Bytes of message values consumed.", s.bytes, lb)
        errors = CounterMetricFamily(
            "hetgmp_decode_errors", "Records that could not be decoded, by reason.", labels=[*lb, "reason"]
        )
        for reason, n in sorted(s.rejected.items()):
            errors.add_metric([*lb.values(), reason], n)
        yield errors
        yield _counter(
            "hetgmp_dead_lettered_records", "Records sent to the dead-letter topic.", s.dead_lettered, lb
        )
        yield _counter(
            "hetgmp_consumer_poll_errors", "Polls that failed and were retried.", s.poll_errors, lb
        )
        yield _counter("hetgmp_offset_commits", "Offset commits that succeeded.", s.commits, lb)
        yield _counter("hetgmp_consumer_rebalances", "Partition assignments received.", s.rebalances, lb)
        position = GaugeMetricFamily(
            "hetgmp_consumer_position", "Next offset to read, per partition.", labels=[*lb, "partition"]
        )
        for p, off in sorted(self.consumer.snapshot().items()):
            position.add_metric([*lb.values(), str(p)], off)
        yield position
        if self.lag:
            lag = GaugeMetricFamily(
                "hetgmp_consumer_lag_records",
                "End offset minus position, per partition.",
                labels=[*lb, "partition"],
            )
            for p, value in sorted(self._lag().items()):
                lag.add_metric([*lb.values(), str(p)], value)
            yield lag

    def _lag(self) -> dict[int, int]:
        inner: Any = self.consumer._consumer
        if inner is None:
            return {}
        try:
            ends = inner.end_offsets(list(inner.assignment()))
        except Exception as exc:  # a scrape must not fail because of the broker
            log.debug("end_offsets failed: %s", exc)
            return {}
        snap = self.consumer.snapshot()
        return {tp.partition: max(end - snap.get(tp.partition, 0), 0) for tp, end in ends.items()}


class ProducerCollector(Collector):
    """Counters of a running :func:`~streaming.producer.produce` (read from its report)."""

    def __init__(self, report: Callable[[], ProduceReport], labels: dict[str, str] | None = None) -> None:
        self.report = report
        self.labels = labels or {}

    def collect(self) -> Iterator[Metric]:
        r, lb = self.report(), self.labels
        yield _counter("hetgmp_records_produced", "Records written to Kafka.", r.records, lb)
        yield _counter("hetgmp_messages_produced", "Kafka messages written.", r.messages, lb)
        yield _counter("hetgmp_produced_bytes", "Bytes of message values written.", r.bytes, lb)
        yield _counter("hetgmp_records_acked", "Records the broker acknowledged.", r.acked, lb)
        yield _counter(
            "hetgmp_records_failed", "Records the broker refused or never acknowledged.", r.failed, lb
        )


class WindowCollector(Collector):
    """Sizes of an :class:`~streaming.window.AccessWindow`."""

    def __init__(self, window: AccessWindow, labels: dict[str, str] | None = None) -> None:
        self.window = window
        self.labels = labels or {}

    def collect(self) -> Iterator[Metric]:
        lb = self.labels
        for name, doc, value in (
            ("hetgmp_window_samples", "Samples in the access window.", len(self.window)),
            ("hetgmp_window_bytes", "Bytes held by the access window.", self.window.nbytes),
            (
                "hetgmp_window_samples_seen",
                "Samples added to the window since start.",
                self.window.samples_seen,
            ),
        ):
            family = GaugeMetricFamily(name, doc, labels=list(lb))
            family.add_metric(list(lb.values()), value)
            yield family


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``registry`` on ``http://host:port/metrics``; returns the server (``shutdown()``)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
