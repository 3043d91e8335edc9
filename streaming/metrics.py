"""Prometheus metrics of the streaming components, read at scrape time.

Nothing is created at import. Each component already keeps plain counters (``ConsumerStats``,
``ProduceReport``, the window's sizes); a custom collector turns them into metric families when
Prometheus scrapes, so the hot path pays nothing for metrics. Register collectors on a
``CollectorRegistry`` you pass in and serve it with :func:`serve`.

Consumer lag, per partition, in offsets (``kafka_consumergroup_lag``, as kafka_exporter names
it) and in seconds, comes from the high watermarks of the fetch responses the client already
holds (:meth:`ClickConsumer.lag`): no request at scrape time, and right on the embedded Tansu
broker too, whose ListOffsets end offsets are not (see FACTS.md). A partition without a fetch
answered yet has no lag sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hetgmp.streaming.consumer import ClickConsumer
from hetgmp.streaming.producer import ProduceReport
from hetgmp.streaming.window import AccessWindow

__all__ = ["ConsumerCollector", "ProducerCollector", "WindowCollector", "serve_metrics"]

log = logging.getLogger(__name__)


def _counter(name: str, doc: str, value: float, labels: dict[str, str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


class ConsumerCollector(Collector):
    """Counters of one :class:`~hetgmp.streaming.consumer.ClickConsumer` (labels: topic, and any given)."""

    def __init__(
        self, consumer: ClickConsumer, labels: dict[str, str] | None = None,
        positions: Callable[[], dict[int, int]] | None = None,
    ) -> None:
        """``positions``: where the lag counts from (default: what the consumer returned; a
        trainer passes what it trained)."""
        self.consumer = consumer
        self.labels = {"topic": consumer.config.topic, **(labels or {})}
        self.positions = positions

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
        truncated = CounterMetricFamily(
            "hetgmp_source_values_truncated",
            "List values dropped past their field's max_len, by field.", labels=[*lb, "field"])
        for name, n in sorted(s.truncated.items()):
            truncated.add_metric([*lb.values(), name], n)
        yield truncated
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
        group = self.consumer.config.group_id or "none"
        records = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "Offsets (messages) behind the partition's high watermark (the last fetch response's).",
            labels=[*lb, "consumergroup", "partition"])
        seconds = GaugeMetricFamily(
            "hetgmp_consumer_lag_seconds",
            "How long ago the newest record read was appended, where records are behind; else 0.",
            labels=[*lb, "consumergroup", "partition"])
        try:
            lag = self.consumer.lag(self.positions() if self.positions else None)
        except Exception as exc:  # a scrape must not fail because of the client
            log.debug("lag unavailable: %s", exc)
            lag = {}
        for p, (behind, age) in sorted(lag.items()):
            records.add_metric([*lb.values(), group, str(p)], behind)
            seconds.add_metric([*lb.values(), group, str(p)], age)
        yield records
        yield seconds


class ProducerCollector(Collector):
    """Counters of a running :func:`~hetgmp.streaming.producer.produce` (read from its report)."""

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
    """Sizes of an :class:`~hetgmp.streaming.window.AccessWindow`."""

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
