"""The consumer against the real embedded broker: round trip, resume, group split, failures."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer

from hetgmp.runtime import free_port
from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.clients.kafka_python import KafkaPythonConsumer, KafkaPythonDeadLetters
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig, LogLost
from hetgmp.streaming.kafka import KafkaSettings, ensure_topic
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

# Every test on each client library (see conftest.py).
pytestmark = [pytest.mark.broker, pytest.mark.usefixtures("library")]

PER_MESSAGE = 16


def fill(kafka: KafkaSettings, topic: str, count: int, start: int = 0, partitions: int = 4) -> None:
    report = produce(
        kafka,
        ProduceConfig(
            topic=topic, count=count, start=start, partitions=partitions, records_per_message=PER_MESSAGE
        ),
        SyntheticConfig(seed=11),
    )
    assert report.records == count


def drain(consumer: ClickConsumer, expected: int, timeout: float = 60.0) -> list:
    batches, got = [], 0
    deadline = time.monotonic() + timeout
    while got < expected and time.monotonic() < deadline:
        b = consumer.next_batch(4096, timeout=0.5)
        if len(b):
            batches.append(b)
            got += len(b)
    return batches


def messages(batches) -> Counter:
    return Counter(
        (int(p), int(o)) for b in batches for p, o in zip(b.partitions.tolist(), b.offsets.tolist())
    )


def config(topic: str, group: str, **kw) -> ConsumerConfig:
    return ConsumerConfig(topic=topic, group_id=group, **kw)


def test_auto_reads_with_the_library_asked_for_and_an_explicit_one_wins(kafka, unique, library):
    topic = unique("clicks")
    fill(kafka, topic, 512, partitions=1)
    with ClickConsumer(kafka, config(topic, "")) as c:
        assert c.client == library
        assert sum(len(b) for b in drain(c, 512)) == 512
        topic_id = c.topic_id
    assert topic_id is not None
    other = "confluent" if library == "kafka-python" else "kafka-python"
    if other == "confluent":
        with pytest.raises(ValueError, match="needs confluent-kafka"):  # monkeypatched away
            config(topic, "", client="confluent")
    else:
        with ClickConsumer(kafka, config(topic, "", client=other)) as c:
            assert c.client == other and sum(len(b) for b in drain(c, 512)) == 512
            assert c.topic_id == topic_id  # one spelling: checkpoints of either client resume


def test_lag_counts_from_the_fetched_high_watermark_in_offsets_and_seconds(kafka, unique):
    topic = unique("clicks")
    fill(kafka, topic, 4_000, partitions=1)  # 250 messages of 16
    with ClickConsumer(kafka, config(topic, "")) as c:
        assert c.lag() == {}  # no fetch answered yet: no lag, rather than a wrong one
        first = c.next_batch(100, timeout=10)
        deadline = time.monotonic() + 10
        while c.lag().get(0, (0, 0))[0] < 150 and time.monotonic() < deadline:
            time.sleep(0.05)  # the next fetch response brings the high watermark up to date
        assert c.snapshot() == {0: 100}
        newest = int(first.timestamps_ms.max())
        assert c.lag(now_ms=newest + 5_000) == {0: (150, 5.0)}
        assert c.lag({0: 50}, now_ms=newest)[0] == (200, 0.0)
        drain(c, 4_000 - len(first))
        assert c.lag() == {0: (0, 0.0)}  # caught up: nothing behind, no age


def test_round_trip_commit_and_resume(kafka, unique):
    topic, group = unique("clicks"), unique("group")
    fill(kafka, topic, 40_000)  # 2,500 messages: many fetches of every partition
    with ClickConsumer(kafka, config(topic, group)) as c:
        batches = drain(c, 40_000)
        assert c.commit()
        snap = c.snapshot()
    got = sum(len(b) for b in batches)
    assert got == 40_000
    per_message = messages(batches)
    assert set(per_message.values()) == {PER_MESSAGE}  # every record once, none twice
    assert sum(snap.values()) == 40_000 // PER_MESSAGE
    # Content survives the trip: the decoded ids are the generator's, as a multiset.
    ids = np.concatenate([b.ids for b in batches])
    expected = SyntheticStream(SyntheticConfig(seed=11)).feature_ids(0, 40_000)
    np.testing.assert_array_equal(np.sort(ids, axis=None), np.sort(expected, axis=None))

    fill(kafka, topic, 8_000, start=40_000)
    with ClickConsumer(kafka, config(topic, group)) as c:
        more = drain(c, 8_000, timeout=30)
        extra = drain(c, 1, timeout=2)  # nothing beyond the new records
    assert sum(len(b) for b in more) == 8_000 and not extra
    resumed = messages(more)
    first = {p: min(o for q, o in resumed if q == p) for p, _ in resumed}
    assert first == {p: snap[p] for p in first}  # starts exactly at the committed offsets


def test_two_consumers_in_one_group_split_the_partitions(kafka, unique):
    topic, group = unique("clicks"), unique("group")
    fill(kafka, topic, 32_000)
    results: dict[int, list] = {}
    assignments: dict[int, set] = {}
    retries: dict[int, int] = {}

    read = [0, 0]

    def run(i: int) -> None:
        with ClickConsumer(kafka, config(topic, group)) as c:
            batches, deadline, idle = [], time.monotonic() + 60, 0
            # Until both have read everything between them and this one, with partitions of
            # its own, heard nothing for 2 s (a record read twice would show in the count
            # below), or 8 s of silence.
            while time.monotonic() < deadline and idle < 16 and \
                    not (sum(read) >= 32_000 and idle >= 4 and c.assignment):
                b = c.next_batch(512, timeout=0.5)
                idle = 0 if len(b) else idle + 1
                if len(b):
                    batches.append(b)
                    read[i] += len(b)
                    assignments[i] = c.assignment
                # Commit after every batch, rebalances included (the second member's join).
                c.commit()
            results[i] = batches
            retries[i] = c.stats.commit_retries

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.5)
    for t in threads:
        t.join()
    seen = messages(results[0]) + messages(results[1])
    assert len(seen) == 32_000 // PER_MESSAGE  # nothing lost
    # Each member ends up owning a disjoint share of the partitions.
    assert assignments[0] and assignments[1]
    assert not (assignments[0] & assignments[1])
    assert assignments[0] | assignments[1] == {0, 1, 2, 3}
    # Everything read was committed: the group's offsets are the end of every partition (and
    # a consumer resuming from them reads nothing). A new member of the group is not used for
    # this: on Tansu its join waits out the old members' rebalance timeout, so it would read
    # nothing for want of an assignment, proving nothing.
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(**kafka.client_kwargs())
    try:
        committed = {tp.partition: om.offset
                     for tp, om in admin.list_group_offsets(group)[group].items()}
    finally:
        admin.close()
    assert committed == {p: 32_000 // PER_MESSAGE // 4 for p in range(4)}
    with ClickConsumer(kafka, config(topic, group), partitions=[0, 1, 2, 3]) as c:
        assert sum(len(b) for b in drain(c, 1, timeout=2)) == 0


def test_undecodable_records_are_dead_lettered_with_reason(kafka, unique):
    topic, group = unique("clicks"), unique("group")
    ensure_topic(kafka, topic, 1)
    good = SyntheticStream(SyntheticConfig(seed=1)).lines(0, 3)
    producer = KafkaProducer(**kafka.client_kwargs())
    for value in [
        good[0],
        b"not\ta\trecord",
        good[1] + b"\n" + b"2" + good[2][1:],
        b"",
        b"\xff\xfe" + good[2],
    ]:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    with ClickConsumer(kafka, config(topic, group, dead_letter_max_bytes=8)) as c:
        batches = drain(c, 2, timeout=30)
        assert c.commit()
        stats = c.stats
    assert sum(len(b) for b in batches) == 2
    assert dict(stats.rejected) == {
        "wrong_field_count": 1,
        "bad_label": 1,
        "empty_message": 1,
        "invalid_utf8": 1,
    }
    dlq = KafkaConsumer(
        f"{topic}.dlq", **kafka.client_kwargs(), auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    letters = list(dlq)
    dlq.close()
    reasons = sorted(dict(m.headers)["hetgmp.reason"].decode() for m in letters)
    assert reasons == ["bad_label", "empty_message", "invalid_utf8", "wrong_field_count"]
    truncated = [m for m in letters if dict(m.headers)["hetgmp.truncated"] == b"1"]
    assert truncated and all(len(m.value) == 8 for m in truncated)
    assert all(dict(m.headers)["hetgmp.source"].decode().startswith(f"{topic}/0/") for m in letters)


def test_consumer_waits_for_a_broker_that_is_not_up_yet(unique, caplog):
    port = free_port()
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=1000)
    topic = unique("clicks")
    out: dict = {}

    def run() -> None:
        # The topic appears only after the broker: the consumer is told to wait for it.
        with ClickConsumer(kafka, config(topic, "", connect_timeout_s=60, topic_wait_s=30)) as c:
            out["batches"] = drain(c, 1_000, timeout=30)

    caplog.set_level(logging.WARNING, logger="hetgmp.streaming.kafka")
    t = threading.Thread(target=run)
    t.start()
    time.sleep(3)
    with EmbeddedBroker(port=port):
        fill(kafka, topic, 1_000, partitions=2)
        t.join(timeout=60)
    assert sum(len(b) for b in out["batches"]) == 1_000
    assert any("not reachable" in r.getMessage() for r in caplog.records)


def test_broker_killed_and_restarted_mid_run(unique):
    port = free_port()
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=1000)
    topic = unique("clicks")
    broker = EmbeddedBroker(port=port).start()
    try:
        fill(kafka, topic, 4_000, partitions=2)
        with ClickConsumer(kafka, config(topic, unique("group"))) as c:
            assert sum(len(b) for b in drain(c, 4_000)) == 4_000
            broker.kill()
            for _ in range(6):  # polling a dead broker neither raises nor returns data
                assert len(c.next_batch(100, timeout=0.5)) == 0
            broker = EmbeddedBroker(port=port).start()  # in-memory: the topic is gone
            fill(kafka, topic, 2_000, start=4_000, partitions=2)
            # The log it was reading is gone: the consumer says so rather than read on as if
            # the new log followed the old one.
            with pytest.raises(LogLost):
                drain(c, 2_000, timeout=90)
        # Told to start the new log at its beginning, a consumer reads all of it.
        with ClickConsumer(kafka, config(topic, "")) as c:
            c.seek_to(None, "earliest")
            after = drain(c, 2_000, timeout=90)
        assert sum(len(b) for b in after) == 2_000
    finally:
        broker.stop()


class _RebalancingKafka:
    """A stand-in for KafkaConsumer whose first commits hit a rebalance (Tansu rarely does)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.commits: list[dict] = []
        self.polls = 0

    def assignment(self):
        from kafka import TopicPartition

        return {TopicPartition("t", 0), TopicPartition("t", 1)}

    def commit(self, offsets):
        from kafka.errors import RebalanceInProgressError

        if self.failures:
            self.failures -= 1
            raise RebalanceInProgressError()
        self.commits.append({tp.partition: om.offset for tp, om in offsets.items()})

    def poll(self, timeout_ms, max_records):
        self.polls += 1
        return {}


@pytest.mark.parametrize("failures,ok", [(0, True), (3, True), (50, False)])
def test_commit_retries_through_rebalances(failures, ok):
    c = ClickConsumer(KafkaSettings(), ConsumerConfig(topic="t", commit_retries=5))
    fake = _RebalancingKafka(failures)
    c._client = KafkaPythonConsumer(fake, "t", KafkaSettings())
    c._positions = {0: 10, 1: 20}
    assert c.commit() is ok
    assert fake.commits == ([{0: 10, 1: 20}] if ok else [])
    assert c.stats.commit_retries == min(failures, 6)
    assert fake.polls == min(failures, 6)  # each retry polls to let the rejoin complete


class _RefusingKafka:
    """A consumer client whose polls fail with ``error`` (the embedded broker has no ACLs to
    refuse a client with)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.closed = False

    def poll(self, timeout_ms, max_records):
        raise self.error

    def close(self, autocommit):
        self.closed = True


def test_a_refused_client_stops_the_consumer_but_a_lost_broker_is_retried():
    from kafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

    from hetgmp.streaming.consumer import ConsumerFailed

    c = ClickConsumer(KafkaSettings(), ConsumerConfig(topic="clicks"))
    c._client = KafkaPythonConsumer(_RefusingKafka(KafkaConnectionError("broker gone")), "clicks",
                                    KafkaSettings())
    assert len(c.next_batch(16, timeout=0.01)) == 0 and c.stats.poll_errors == 1
    # Retrying an authorization failure reads nothing for ever; the job used to end "idle".
    c._client = KafkaPythonConsumer(_RefusingKafka(TopicAuthorizationFailedError()), "clicks",
                                    KafkaSettings())
    with pytest.raises(ConsumerFailed, match="'clicks'.*TopicAuthorizationFailedError"):
        c.next_batch(16, timeout=0.01)


class _FailingDeadLetters:
    """A dead-letter producer whose sends fail (kafka-python's flush() only logs that)."""

    def __init__(self, flush_error: Exception | None = None) -> None:
        from kafka.producer.future import FutureProduceResult, FutureRecordMetadata

        self.flush_error = flush_error
        result = FutureProduceResult(None)
        self.future = FutureRecordMetadata(result, 0, -1, None, 0, 0, -1)
        result.failure(RuntimeError("topic refused"))

    def send(self, topic, value, headers):
        return self.future

    def flush(self, timeout):
        if self.flush_error is not None:
            raise self.flush_error

    def close(self, timeout):
        pass


def test_dead_letters_that_were_not_written_stop_the_commit():
    from hetgmp.streaming.consumer import ConsumerFailed

    c = ClickConsumer(KafkaSettings(), ConsumerConfig(topic="clicks", commit_retries=0))
    kafka = _RebalancingKafka(0)
    c._client, c._positions = KafkaPythonConsumer(kafka, "t", KafkaSettings()), {0: 10}
    c._dlq = KafkaPythonDeadLetters(KafkaSettings(), _FailingDeadLetters())
    c._dead_letter(c.decoder.decode([b"not\ta\trecord"], [0], [9]).rejects)
    with pytest.raises(ConsumerFailed, match="1 of 1 dead letters were not written"):
        c.commit()
    assert kafka.commits == []  # the offsets past the lost dead letter stay uncommitted


def test_stop_closes_the_consumer_when_dead_letters_cannot_be_flushed():
    from kafka.errors import KafkaTimeoutError

    c = ClickConsumer(KafkaSettings(), ConsumerConfig(topic="clicks"))
    client = _RefusingKafka(RuntimeError("unused"))
    c._client = KafkaPythonConsumer(client, "clicks", KafkaSettings())
    c._dlq = KafkaPythonDeadLetters(KafkaSettings(), _FailingDeadLetters(KafkaTimeoutError("gone")))
    with pytest.raises(KafkaTimeoutError):
        c.stop()
    assert client.closed and c._client is None
