"""The producer counts what the broker acknowledged, says when it did not, and paces evenly."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from kafka import KafkaConsumer, TopicPartition

from hetgmp.runtime import FakeClock, free_port
from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.kafka import KafkaSettings, TopicNotFound, topic_partitions
from hetgmp.streaming.producer import ProduceConfig, ProduceFailed, ProduceReport, produce
from hetgmp.streaming.synthetic import SyntheticConfig

pytestmark = [pytest.mark.broker, pytest.mark.usefixtures("library")]

PER_MESSAGE = 16


def stored(kafka: KafkaSettings, topic: str, timeout: float = 30.0) -> list:
    """Every message the broker has for ``topic``: each partition read to its high watermark."""
    try:
        parts = topic_partitions(kafka, topic)
    except TopicNotFound:
        return []
    client = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False,
                           auto_offset_reset="earliest", allow_auto_create_topics=False)
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    client.assign(tps)
    client.seek_to_beginning(*tps)
    messages: list = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for batch in client.poll(timeout_ms=300).values():
                messages.extend(batch)
            ends = {tp: client.highwater(tp) for tp in tps}
            if all(end is not None and client.position(tp) >= end for tp, end in ends.items()):
                return messages
    finally:
        client.close()
    raise AssertionError(f"could not read {topic} to its end in {timeout}s")


def records_in(messages: list) -> int:
    return sum(m.value.count(b"\n") + 1 for m in messages)


def test_a_plain_run_is_acknowledged_in_full(kafka, unique):
    topic = unique("clicks")
    report = produce(kafka, ProduceConfig(topic=topic, count=5_000, partitions=2,
                                          records_per_message=PER_MESSAGE),
                     SyntheticConfig(seed=2))
    assert report.records == report.acked == 5_000
    assert report.failed == 0 and report.first_error is None
    assert records_in(stored(kafka, topic)) == 5_000


def test_records_a_restarted_broker_lost_are_reported(unique):
    port = free_port()
    # librdkafka retries a message until the request timeout (its delivery timeout here), so
    # a short one lets it give up well inside the 20 s run.
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=1000,
                          request_timeout_ms=5000)
    topic = unique("clicks")
    brokers = [EmbeddedBroker(port=port).start()]
    report = ProduceReport()
    drained, killed = threading.Event(), threading.Event()
    out: dict = {}

    def progress(r: ProduceReport) -> None:
        # Hold the run once everything sent so far is answered, until the broker is killed:
        # what it had acknowledged is then exactly what it stored.
        if drained.is_set() or r.records < 3_000:
            return
        deadline = time.monotonic() + 30
        while r.acked + r.failed < r.records and time.monotonic() < deadline:
            time.sleep(0.02)
        drained.set()
        killed.wait(60)

    def run() -> None:
        config = ProduceConfig(topic=topic, count=60_000, rate=3_000, partitions=2,
                               records_per_message=PER_MESSAGE, chunk_records=1_024,
                               progress_every_s=0.1)
        try:
            produce(kafka, config, SyntheticConfig(seed=3), progress=progress, report=report)
        except ProduceFailed as exc:
            out["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert drained.wait(60)
        acked_before, stored_before = report.acked, records_in(stored(kafka, topic))
        brokers[-1].kill()  # in-memory storage: everything it had is gone
        killed.set()
        time.sleep(3)  # the run goes on sending meanwhile
        brokers.append(EmbeddedBroker(port=port).start())  # from this thread: it outlives it
        runner.join(180)
        assert not runner.is_alive()
        stored_after = records_in(stored(kafka, topic))
    finally:
        killed.set()
        for b in brokers:
            b.kill()  # in-memory, nothing to save: no need to wait for a clean stop
    assert stored_before == acked_before >= 3_000
    err = out["error"]
    assert err.report is report
    # Acknowledged means stored: before the kill on the first broker, after it on the second.
    assert report.acked == acked_before + stored_after
    assert report.failed > 0 and report.acked + report.failed == report.records
    assert str(err).startswith(f"{report.records - report.acked:,} of {report.records:,} records "
                               "were not acknowledged by the broker (first error: ")
    assert report.first_error and report.first_error in str(err)
    # It stopped at the first failure instead of sending the whole 20 s run into a gap.
    assert report.records < 60_000


def test_a_paced_run_sends_evenly(kafka, unique):
    topic, rate = unique("paced"), 4_000.0
    clock = FakeClock()
    count = 8_000  # two seconds, and one generated chunk (16,384 records by default)
    report = produce(kafka, ProduceConfig(topic=topic, count=count, rate=rate, partitions=2,
                                          records_per_message=PER_MESSAGE),
                     SyntheticConfig(seed=4), clock=clock)
    assert report.acked == count
    # Records carry the producer clock's time, here the fake one that only pacing moves.
    messages = stored(kafka, topic)
    stamps = sorted(m.timestamp for m in messages)
    t0 = stamps[0]
    per_slice: Counter[int] = Counter()
    for m in messages:
        per_slice[(m.timestamp - t0) // 100] += m.value.count(b"\n") + 1
    # Every 100 ms, the first one included (the bucket starts with one message, not full).
    assert max(per_slice.values()) <= rate * 0.1 + PER_MESSAGE, per_slice
    # No slice is empty (no burst-then-sleep), and the whole run took count / rate.
    assert set(per_slice) == set(range(max(per_slice) + 1))
    assert (stamps[-1] - t0) / 1000 == pytest.approx(count / rate, rel=0.02)


def test_a_paced_run_keeps_its_rate_on_the_real_clock(kafka, unique):
    topic, rate, count = unique("paced"), 2_000.0, 3_000
    t0 = time.monotonic()
    produce(kafka, ProduceConfig(topic=topic, count=count, rate=rate, partitions=1,
                                 records_per_message=PER_MESSAGE), SyntheticConfig(seed=5))
    took = time.monotonic() - t0
    stamps = sorted(m.timestamp for m in stored(kafka, topic))
    span = (stamps[-1] - stamps[0]) / 1000
    assert span == pytest.approx((count - PER_MESSAGE) / rate, rel=0.1) and took < span + 10
    # At most the bucket's 0.1 s of records plus 0.1 s of refill in any 100 ms (a late wake-up
    # may spend the bucket): never the 16k burst of a chunk at once.
    per_slice = Counter((s - stamps[0]) // 100 for s in stamps)
    assert max(per_slice.values()) * PER_MESSAGE <= rate * 0.2 + PER_MESSAGE
