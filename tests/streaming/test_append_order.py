"""A producer's partitions and times keep the trainer's order (append time, offset, partition)
equal to the order of sending, on from where the topic ends; and where it ends is read right on
the embedded broker, whose list-offsets answer is not the end of the log."""

from __future__ import annotations

import random

import pytest
from kafka import KafkaProducer

from hetgmp.streaming.append_order import AppendOrder, PartitionEnd, topic_ends
from hetgmp.streaming.kafka import KafkaSettings, ensure_topic


def ends(*offsets: int, newest_ms: int | None = None) -> dict[int, PartitionEnd]:
    return {p: PartitionEnd(o, newest_ms if o else None) for p, o in enumerate(offsets)}


def test_a_new_topic_is_written_round_robin_from_partition_0():
    order = AppendOrder(ends(0, 0, 0, 0))
    assert [order.partition() for _ in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert order.continued == 0


def test_a_second_call_goes_on_where_the_first_stopped():
    # 79 messages on 4 partitions: 20, 20, 20 and 19. The old producer started at 0 again.
    order = AppendOrder(ends(20, 20, 20, 19, newest_ms=5_000))
    assert [order.partition() for _ in range(6)] == [3, 0, 1, 2, 3, 0]
    assert order.continued == 79


def test_every_key_is_above_the_last_one_whatever_the_topic_held():
    rng = random.Random(7)
    for _ in range(50):
        held = [rng.randrange(0, 30) for _ in range(rng.randrange(1, 7))]
        order = AppendOrder(ends(*held, newest_ms=1_000))
        nxt, last = list(held), None
        for _ in range(200):  # all in one millisecond: the offsets and partitions decide
            t, p = order.stamp(1_000), order.partition()
            key = (t, nxt[p], p)  # as the broker and the trainer see the message
            nxt[p] += 1
            assert last is None or key > last, (held, last, key)
            last = key


def test_times_start_after_the_newest_message_and_never_go_back():
    order = AppendOrder(ends(3, 2, newest_ms=10_000))
    assert order.stamp(9_000) == 10_001  # a clock behind the topic's newest message
    assert order.stamp(12_000) == 12_000
    assert order.stamp(11_000) == 12_000  # the clock stepped back: ties, never earlier
    assert AppendOrder(ends(0, 0)).stamp(42) == 42


@pytest.mark.broker
@pytest.mark.usefixtures("library")
def test_where_a_topic_ends_is_read_from_fetches(kafka: KafkaSettings, unique, library):
    """Partition 0 ends in a batch of ten messages (list-offsets says 1 on this broker, the base
    offset of the batch + 1), partition 1 in a batch of one, partition 2 is empty."""
    topic = unique("ends")
    ensure_topic(kafka, topic, 3)
    assert topic_ends(kafka, topic, 3, library) == ends(0, 0, 0)
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=200)
    for i in range(10):
        producer.send(topic, b"m%d" % i, partition=0, timestamp_ms=1_000 + i)
    producer.flush()
    producer.send(topic, b"one", partition=1, timestamp_ms=5_000)
    producer.flush()
    producer.close()
    assert topic_ends(kafka, topic, 3, library) == {
        0: PartitionEnd(10, 1_009), 1: PartitionEnd(1, 5_000), 2: PartitionEnd(0, None)}
