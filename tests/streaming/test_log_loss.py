"""A log that went backwards or was replaced stops the consumer (LogLost) before any record of it
is returned; a log that is merely quiet, or read again from a committed offset, does not."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from hetgmp.runtime import free_port
from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.clients.kafka_python import KafkaPythonConsumer
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.positions import LogGuard, LogLost
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig

# Every test on each client library (see conftest.py).
pytestmark = pytest.mark.usefixtures("library")

PER_MESSAGE = 16


def fill(kafka: KafkaSettings, topic: str, count: int, start: int = 0, partitions: int = 2) -> None:
    report = produce(
        kafka,
        ProduceConfig(topic=topic, count=count, start=start, partitions=partitions,
                      records_per_message=PER_MESSAGE),
        SyntheticConfig(seed=7),
    )
    assert report.acked == count


def drain(consumer: ClickConsumer, expected: int, timeout: float = 60.0) -> list:
    batches, got = [], 0
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        b = consumer.next_batch(4096, timeout=0.5)
        if len(b):
            batches.append(b)
            got += len(b)
    return batches


def offsets(batches) -> set[tuple[int, int]]:
    return {(int(p), int(o)) for b in batches for p, o in zip(b.partitions.tolist(), b.offsets.tolist())}


@pytest.fixture()
def own_broker() -> Iterator[tuple[KafkaSettings, list[EmbeddedBroker]]]:
    """A broker of the test's own on a fixed port, so that it can be killed and started again
    there (``brokers[-1]`` is the live one)."""
    port = free_port()
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=1000)
    brokers = [EmbeddedBroker(port=port).start()]
    try:
        yield kafka, brokers
    finally:
        for b in brokers:
            b.kill()  # in-memory, nothing to save: no need to wait for a clean stop


def restart(brokers: list[EmbeddedBroker]) -> None:
    """Kill the broker and start a new one on its port (in-memory: every topic is gone)."""
    brokers[-1].kill()
    brokers.append(EmbeddedBroker(port=brokers[-1].port).start())


def read_until_lost(consumer: ClickConsumer, timeout: float) -> tuple[list, LogLost | None, float]:
    """Batches returned until LogLost (or ``timeout``), the error and the seconds it took."""
    got, t0 = [], time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            b = consumer.next_batch(4096, timeout=0.5)
            if len(b):
                got.append(b)
    except LogLost as exc:
        return got, exc, time.monotonic() - t0
    return got, None, time.monotonic() - t0


# -- the checks alone ----------------------------------------------------------------------------


def test_a_new_topic_id_is_a_lost_log():
    guard = LogGuard("clicks", "k:9092")
    guard.check("id-1", {})  # adopted: the consumer started before the id was known
    guard.check("id-1", {})
    guard.check(None, {})  # not in the metadata just now: no evidence either way
    with pytest.raises(LogLost, match="from id-1 to id-2") as err:
        guard.check("id-2", {})
    assert (err.value.old_topic_id, err.value.new_topic_id) == ("id-1", "id-2")
    assert "--reset-offsets earliest" in str(err.value) and "committed" in str(err.value)


def test_a_high_watermark_below_the_position_is_a_lost_log():
    guard = LogGuard("clicks", "k:9092", topic_id="id")
    guard.advance(0, 1500)
    guard.advance(1, 10)
    guard.check("id", {0: 1500, 1: None})  # at the end, and no fetch answered yet
    with pytest.raises(LogLost, match="partition 0 .* ends at offset 100 .* at offset 1500") as err:
        guard.check("id", {0: 100, 1: 10})
    assert (err.value.partition, err.value.position, err.value.highwater) == (0, 1500, 100)
    guard.forget([0])  # revoked: no longer this consumer's concern
    guard.check("id", {0: 100, 1: 10})


def test_a_seek_past_a_stale_high_watermark_waits_for_a_fresh_one():
    guard = LogGuard("clicks", "k:9092", topic_id="id")
    guard.expect(0, 500, highwater=200)  # the log grew since that high watermark was fetched
    guard.check("id", {0: 200})
    guard.check("id", {0: 800})
    with pytest.raises(LogLost):  # once fresh, a shorter log counts again
        guard.check("id", {0: 300})


class _OutOfRangeKafka:
    """A consumer client whose poll finds the position outside the log (Tansu answers such a
    fetch with nothing instead; a real Kafka with OffsetOutOfRange)."""

    def poll(self, timeout_ms, max_records):
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        raise OffsetOutOfRangeError({TopicPartition("clicks", 3): 1500})


def test_an_offset_out_of_range_is_a_lost_log_not_a_retry():
    c = ClickConsumer(KafkaSettings(), ConsumerConfig(topic="clicks"))
    c._client = KafkaPythonConsumer(_OutOfRangeKafka(), "clicks", KafkaSettings())
    with pytest.raises(LogLost, match="partition 3 at offset 1500") as err:
        c.next_batch(16, timeout=0.01)
    assert (err.value.partition, err.value.position) == (3, 1500)
    assert c.stats.poll_errors == 0 and c.snapshot() == {}


# -- against the broker ----------------------------------------------------------------------------


@pytest.mark.broker
@pytest.mark.parametrize("grouped", [False, True], ids=["partitions", "group"])
def test_a_log_shorter_than_the_position_stops_the_consumer(own_broker, unique, grouped):
    kafka, brokers = own_broker
    topic = unique("clicks")
    fill(kafka, topic, 4_000)
    group = unique("group") if grouped else ""
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=group)) as c:
        assert sum(len(b) for b in drain(c, 4_000)) == 4_000
        before = c.snapshot()
        assert c.topic_id
        restart(brokers)
        fill(kafka, topic, 800)  # the new log ends far below the positions (125 a partition)
        got, err, took = read_until_lost(c, timeout=30)
        assert err is not None and took < 15
        assert got == []  # not one record of the new log
        # A group's rejoin revokes the partitions (they leave the snapshot); none moved forward.
        snap = c.snapshot()
        assert all(off <= before.get(p, -1) for p, off in snap.items())
    assert topic in str(err) and "--reset-offsets" in str(err)


@pytest.mark.broker
def test_a_new_log_grown_past_the_position_stops_the_consumer(own_broker, unique):
    kafka, brokers = own_broker
    topic = unique("clicks")
    fill(kafka, topic, 4_000)
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id="")) as c:
        assert sum(len(b) for b in drain(c, 4_000)) == 4_000
        before, old_id = c.snapshot(), c.topic_id
        restart(brokers)
        # Past the old positions on every partition, before the consumer polls again: its
        # next fetch lands inside the new log, which the high watermark cannot tell.
        fill(kafka, topic, 24_000, start=4_000)
        got, err, took = read_until_lost(c, timeout=30)
        assert err is not None and took < 15
        assert got == []
        assert c.snapshot() == before
        assert err.old_topic_id == old_id and err.new_topic_id not in (None, old_id)


@pytest.mark.broker
def test_a_quiet_log_and_a_committed_resume_raise_nothing(own_broker, unique):
    kafka, _ = own_broker
    topic, group = unique("clicks"), unique("group")
    fill(kafka, topic, 4_000)
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=group), partitions=[0, 1]) as c:
        first = drain(c, 4_000)
        for _ in range(8):  # a pause: the broker has nothing new for a while
            assert len(c.next_batch(100, timeout=0.5)) == 0
        fill(kafka, topic, 4_000, start=4_000)
        second = drain(c, 4_000)
        assert c.commit()
        committed = c.snapshot()
    assert len(offsets(first) | offsets(second)) == 8_000 // PER_MESSAGE
    assert not offsets(first) & offsets(second)

    fill(kafka, topic, 2_000, start=8_000)
    # The trainer's way: given partitions, resumed at the group's committed offsets.
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=group), partitions=[0, 1]) as c:
        resumed = drain(c, 2_000, timeout=30)
        assert len(c.next_batch(100, timeout=1.0)) == 0
    seen = offsets(resumed)
    assert len(seen) == 2_000 // PER_MESSAGE
    assert {p: min(o for q, o in seen if q == p) for p, _ in seen} == committed


@pytest.mark.broker
def test_a_seek_past_the_last_high_watermark_is_not_a_lost_log(kafka, unique):
    topic = unique("clicks")
    fill(kafka, topic, 1_600, partitions=1)
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id="")) as c:
        drain(c, 1_600)
        fill(kafka, topic, 3_200, start=1_600, partitions=1)
        c.seek({0: 150})  # past the 100 messages this consumer has seen the log reach
        got = [c.next_batch(4096, timeout=0.0)]  # before any fetch at the new position
        got += drain(c, 3_200 - 50 * PER_MESSAGE, timeout=30)
    seen = offsets(got)
    assert min(o for _, o in seen) == 150 and len(seen) == 150


def read_to(consumer: ClickConsumer, partition: int, offset: int, timeout: float = 30.0) -> list:
    """Batches until ``partition``'s position reaches ``offset``."""
    batches, deadline = [], time.monotonic() + timeout
    while consumer.snapshot().get(partition, -1) < offset and time.monotonic() < deadline:
        batches.append(consumer.next_batch(4096, timeout=0.5))
    return batches


@pytest.mark.broker
def test_seek_to_starts_at_either_end_of_the_log(kafka, unique):
    topic = unique("clicks")
    fill(kafka, topic, 3_200, partitions=1)  # 200 messages
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id="",
                                             auto_offset_reset="latest")) as c:
        first = drain(c, 1, timeout=3)  # Tansu's "end" is its last batch's start: read again
        fill(kafka, topic, 1_600, start=3_200, partitions=1)
        seen = offsets(first + read_to(c, 0, 300))
        assert {(0, o) for o in range(200, 300)} <= seen  # nothing after the start is missed
        assert min(o for _, o in seen) > 0  # and the log's beginning was skipped
        c.seek_to(None, "earliest")
        assert c.snapshot() == {}  # nothing of the new position read yet
        again = offsets(read_to(c, 0, 300))
    assert again == {(0, o) for o in range(300)}
