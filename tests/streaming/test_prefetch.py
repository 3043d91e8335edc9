"""Fetch and decode on their own thread: bounded while the caller is away, nothing lost or
reordered, offsets only of what was handed out, the consumer's errors in order."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig, ConsumerStats
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.positions import LogLost
from hetgmp.streaming.prefetch import Prefetcher
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.streaming.types import ClickBatch, Schema

PER_MESSAGE = 16


def fill(kafka: KafkaSettings, topic: str, count: int, partitions: int = 2) -> None:
    report = produce(kafka, ProduceConfig(topic=topic, count=count, partitions=partitions,
                                          records_per_message=PER_MESSAGE), SyntheticConfig(seed=5))
    assert report.acked == count


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.broker
@pytest.mark.usefixtures("library")
@pytest.mark.timeout(120)
def test_the_queue_stays_bounded_while_the_caller_is_away_and_loses_nothing(kafka, unique):
    topic, count, bound = unique("prefetch-bounded"), 60_000, 4_000
    fill(kafka, topic, count)
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=""), partitions=[0, 1]) as c:
        reader = Prefetcher(c, max_records=bound, fetch_messages=1024, poll_s=0.1).start()
        try:
            # Nobody reads for a while: the thread fills the queue, then stops polling.
            assert wait_until(lambda: reader.queued_records >= bound, 30)
            fetched = sum(c.snapshot().values())
            time.sleep(1.5)
            assert sum(c.snapshot().values()) == fetched  # no poll while full
            # One message past the bound at most; not the 60k records waiting on the broker.
            assert reader.peak_records <= bound + PER_MESSAGE
            assert fetched * PER_MESSAGE <= bound + PER_MESSAGE
            per_record = reader.peak_bytes / reader.peak_records
            assert per_record < 400  # 26 ids, 13 dense, label, partition, offset, time
            # Then everything, once, in offset order per partition.
            batches, got = [], 0
            deadline = time.monotonic() + 60
            while got < count and time.monotonic() < deadline:
                b = reader.next_batch(3_000, timeout=0.5)
                batches.append(b)
                got += len(b)
            data = ClickBatch.concat(batches)
            assert len(data) == count
            for p in (0, 1):
                offs = data.offsets[data.partitions == p]
                assert np.all(np.diff(offs) >= 0)
                assert np.array_equal(np.unique(offs), np.arange(count // 2 // PER_MESSAGE))
            assert reader.snapshot() == {0: count // 2 // PER_MESSAGE, 1: count // 2 // PER_MESSAGE}
            assert reader.peak_records <= bound + PER_MESSAGE
        finally:
            reader.stop()


@pytest.mark.broker
@pytest.mark.usefixtures("library")
@pytest.mark.timeout(120)
def test_a_commit_through_the_thread_covers_what_was_handed_out_not_what_was_read_ahead(
        kafka, unique):
    from kafka.admin import KafkaAdminClient

    topic, group = unique("prefetch-commit"), unique("prefetch-commit-group")
    fill(kafka, topic, 8_000, partitions=1)
    with ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=group), partitions=[0]) as c:
        reader = Prefetcher(c, max_records=2_000, fetch_messages=64, poll_s=0.1).start()
        try:
            first = reader.next_batch(1_000, timeout=10)
            assert len(first)
            assert wait_until(lambda: reader.queued_records > 0, 10)
            handed = reader.snapshot()
            assert handed[0] == int(first.offsets.max()) + 1
            assert c.snapshot()[0] > handed[0]  # the thread has read past it
            assert reader.call(lambda consumer: consumer.commit(handed))
        finally:
            reader.stop()
    admin = KafkaAdminClient(**kafka.client_kwargs())
    try:
        committed = {tp.partition: meta.offset
                     for tp, meta in admin.list_group_offsets(group)[group].items()}
    finally:
        admin.close()
    assert committed == handed


class _Consumer:
    """Hands out three one-record batches, then fails as a lost log would; records which thread
    each call ran on."""

    schema = Schema.from_counts(1, 1)

    def __init__(self) -> None:
        self.stats = ConsumerStats()
        self.polled = 0
        self.threads: list[str] = []

    def snapshot(self) -> dict[int, int]:
        return {0: self.polled}

    def highwaters(self) -> dict[int, int]:
        return {}

    def next_batch(self, max_records: int, timeout: float) -> ClickBatch:
        if self.polled == 3:
            raise LogLost("the log went away", topic="t")
        self.polled += 1
        self.stats.messages += 1
        self.stats.records += 1
        return ClickBatch.of_ids(labels=np.ones(1, np.float32), dense=np.zeros((1, 1), np.float32),
                          ids=np.full((1, 1), self.polled, np.int64),
                          partitions=np.zeros(1, np.int32),
                          offsets=np.array([self.polled - 1], np.int64),
                          timestamps_ms=np.zeros(1, np.int64))


@pytest.mark.timeout(30)
def test_the_consumers_error_comes_after_the_batches_fetched_before_it():
    consumer = _Consumer()
    reader = Prefetcher(consumer, max_records=100, poll_s=0.01).start()  # type: ignore[arg-type]
    try:
        assert wait_until(lambda: reader._error is not None, 10)
        got = reader.next_batch(1, timeout=1)
        assert got.ids.ravel().tolist() == [1] and reader.snapshot() == {0: 1}
        rest = reader.next_batch(10, timeout=1)
        assert rest.ids.ravel().tolist() == [2, 3] and reader.snapshot() == {0: 3}
        with pytest.raises(LogLost):
            reader.next_batch(10, timeout=1)
        # The thread is gone: calls run on the caller's thread now, rather than hang.
        assert reader.call(lambda c: threading.current_thread().name) == \
            threading.current_thread().name
    finally:
        reader.stop()


@pytest.mark.timeout(30)
def test_calls_run_on_the_polling_thread():
    consumer = _Consumer()
    consumer.next_batch = lambda n, t: (time.sleep(0.01), ClickBatch.empty(consumer.schema))[1]
    reader = Prefetcher(consumer, max_records=100, poll_s=0.01).start()  # type: ignore[arg-type]
    try:
        assert reader.call(lambda c: threading.current_thread().name) == "hetgmp-fetch"
        with pytest.raises(ZeroDivisionError):
            reader.call(lambda c: 1 / 0)
    finally:
        reader.stop()
    assert reader.call(lambda c: threading.current_thread().name) == \
        threading.current_thread().name
