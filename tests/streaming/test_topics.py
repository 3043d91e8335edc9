"""A missing topic is reported at once (and not created by asking); bad consumer settings stop the
program before it reads anything."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings, TopicNotFound, ensure_topic, topic_partitions
from hetgmp.streaming.producer import ProduceConfig


@pytest.mark.parametrize("group", ["", "some-group"])
def test_a_missing_topic_is_reported_at_once_and_not_created(kafka, unique, group):
    topic = unique("missing")
    t0 = time.monotonic()
    with pytest.raises(TopicNotFound) as err:
        ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=group)).start()
    assert time.monotonic() - t0 < 10  # it used to wait five minutes, or for ever in a group
    message = str(err.value)
    assert topic in message and kafka.bootstrap_servers in message and "hetgmp produce" in message
    with pytest.raises(TopicNotFound):  # looking it up did not create it
        topic_partitions(kafka, topic)


def test_topic_partitions_waits_for_a_topic_that_appears(kafka, unique, caplog):
    topic = unique("late")
    creator = threading.Timer(2.0, ensure_topic, args=(kafka, topic, 3))
    caplog.set_level(logging.WARNING, logger="hetgmp.streaming.kafka")
    creator.start()
    try:
        assert topic_partitions(kafka, topic, wait_s=30) == {0, 1, 2}
    finally:
        creator.join()
    waits = [r for r in caplog.records if "does not exist" in r.getMessage()]
    assert len(waits) == 1  # one line when the wait starts, not one a second


def test_a_missing_partition_is_reported(kafka, unique):
    topic = unique("clicks")
    ensure_topic(kafka, topic, 2)
    with pytest.raises(RuntimeError, match=r"partitions \[5\] .* do not exist"):
        ClickConsumer(kafka, ConsumerConfig(topic=topic, group_id=""), partitions=[0, 5]).start()


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_record_bytes", 0),  # rejected every record as too large, and the run ended "done"
        ("dead_letter_max_bytes", 0),
        ("session_timeout_ms", 0),
        ("heartbeat_interval_ms", 6000),  # not below the session timeout
        ("max_poll_interval_ms", -1),
        ("fetch_max_bytes", 0),
        ("connect_timeout_s", 0.0),
        ("topic_wait_s", -1.0),
        ("commit_retries", -1),
        ("auto_offset_reset", "none"),
        ("topic", ""),
    ],
)
def test_consumer_settings_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        ConsumerConfig(**{field: value})


def test_consumer_defaults_are_valid():
    ConsumerConfig()
    ConsumerConfig(commit_retries=0, topic_wait_s=0.0, heartbeat_interval_ms=5999)


def test_idempotence_needs_acks_from_all_replicas():
    with pytest.raises(ValueError, match="idempotence"):
        ProduceConfig(acks="1")
    assert ProduceConfig(acks="1", idempotence=False, client="confluent").acks == "1"
    assert (ProduceConfig().acks, ProduceConfig().idempotence) == ("all", True)


def test_acks_1_is_refused_where_the_clients_count_cannot_be_trusted():
    """kafka-python with acks=1 reported 36,736 records written across a broker restart that
    the broker did not hold; librdkafka counted exactly. The producer's count must hold."""
    with pytest.raises(ValueError, match="acks '1' with the kafka-python client"):
        ProduceConfig(acks="1", idempotence=False, client="kafka-python")
    assert ProduceConfig(acks="0", idempotence=False, client="kafka-python").acks == "0"


@pytest.mark.parametrize("partitions", [0, 10_001, 1_000_000])
def test_a_partition_count_past_what_clients_read_is_refused(partitions):
    with pytest.raises(ValueError, match="partitions"):
        ProduceConfig(partitions=partitions)
    # before any connection: no broker answers on this port, and none is asked
    with pytest.raises(ValueError, match="10,000"):
        ensure_topic(KafkaSettings(bootstrap_servers="127.0.0.1:9"), "t", partitions)
