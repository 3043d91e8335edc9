"""The Kafka source of a rank ends when its record budget is spent, on the embedded broker."""

from __future__ import annotations

import pytest

from hetgmp.partitioner import Placement
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings, ensure_topic
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.sources import KafkaShard, KafkaSpec
from hetgmp.trainer.step import TrainConfig

pytestmark = pytest.mark.broker

SYN = SyntheticConfig(vocab_max=20_000, seed=3)
PER_MESSAGE = 16  # the producer's default packing
# Long enough that a source which only ends by idling fails the test's timeout instead.
IDLE_S = 120.0


@pytest.mark.timeout(90)
def test_a_record_budget_ends_training_within_one_message(kafka: KafkaSettings,
                                                          unique) -> None:
    """--records 500 over 16-record messages, 96 a step: the last batches are cut at message
    boundaries, and records polled past the budget must not keep the source alive (it used to
    step on empty batches for ever)."""
    topic, budget = unique("budget-ends"), 500
    produce(kafka, ProduceConfig(topic=topic, count=2_000, partitions=1,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=unique("budget-ends-group")),
                     records=budget, idle_s=IDLE_S, poll_s=0.05)
    job = Job(spec, ModelConfig(model="widedeep", embed_dim=4, hidden=(8,)), StoreConfig(),
              TrainConfig(global_batch=96, log_every=0), placement=Placement.hash(1))
    result = run_rank(LocalComm(), job)
    # Whole messages only: the budget is passed by less than one message, never missed.
    assert budget <= result.job_totals.samples < budget + PER_MESSAGE


@pytest.mark.timeout(60)
def test_a_rank_with_no_budget_share_ends_at_once(kafka: KafkaSettings, unique) -> None:
    """One record for two ranks: rank 0's share is nothing, whatever cap the loop gives."""
    topic = unique("budget-zero")
    ensure_topic(kafka, topic, 2)
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=unique("budget-zero-group")),
                     records=1, idle_s=IDLE_S, poll_s=0.05)
    shard = KafkaShard(spec, global_batch=8, rank=0, world=2)
    try:
        assert shard.partitions == [0]
        assert len(shard.next_batch(cap=4)) == 0
        assert shard.exhausted
    finally:
        shard.close()


def _committed(kafka: KafkaSettings, topic: str, group: str, partitions: int) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    client = KafkaConsumer(**kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
    try:
        return {p: client.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_a_partition_whose_last_message_is_rejected_whole_is_committed_past_it(
        kafka: KafkaSettings, unique, tmp_path) -> None:
    """The group used to show a lag of 1 for ever, and every resume dead-lettered the message
    again: no record of it was handed out, so the source's position never passed it."""
    from kafka import KafkaProducer

    from hetgmp.trainer import checkpoint as ckpt
    from hetgmp.trainer.online import OnlineConfig

    topic, group = unique("rejected-tail"), unique("rejected-tail-group")
    produce(kafka, ProduceConfig(topic=topic, count=480, partitions=1,
                                 records_per_message=PER_MESSAGE), SYN)
    producer = KafkaProducer(**kafka.client_kwargs())
    producer.send(topic, b"not\ta\tclick\tlog\nnor\tthis", partition=0).get(timeout=30)
    producer.close()
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=group), idle_s=3.0,
                     poll_s=0.05)

    def run(resume: bool) -> object:
        online = OnlineConfig(repartition_interval="0", checkpoint_dir=str(tmp_path),
                              resume=resume)
        job = Job(spec, ModelConfig(model="widedeep", embed_dim=4, hidden=(8,)), StoreConfig(),
                  TrainConfig(global_batch=96, log_every=0), online=online,
                  placement=Placement.hash(1))
        return run_rank(LocalComm(), job)

    first = run(resume=False)
    assert first.job_totals.samples == 480  # type: ignore[attr-defined]
    end = 480 // PER_MESSAGE + 1  # the offset after the rejected message
    manifest = ckpt.latest(tmp_path)
    assert manifest is not None and manifest.offsets == {0: end}
    assert _committed(kafka, topic, group, 1) == {0: end}
    again = run(resume=True)  # nothing left: the rejected message is not read again
    assert again.job_totals.samples == 0  # type: ignore[attr-defined]
    assert again.online["offsets"] == {0: end}  # type: ignore[attr-defined]


@pytest.mark.timeout(240)
def test_a_run_resumed_after_the_broker_lost_its_log_refuses_or_resets(unique,
                                                                       tmp_path) -> None:
    """The in-memory broker restarted: the topic exists again, with a new id and other records
    at the old offsets. Resuming at the checkpoint's offsets would skip the new records and
    claim the old ones: it is refused, and --reset-offsets earliest trains the new log."""
    from hetgmp.runtime import free_port
    from hetgmp.streaming import EmbeddedBroker, LogLost
    from hetgmp.trainer import checkpoint as ckpt
    from hetgmp.trainer.online import OnlineConfig

    port, topic, group = free_port(), unique("lost-log"), unique("lost-log-group")
    settings = ModelConfig(model="widedeep", embed_dim=4, hidden=(8,))

    def run(kafka: KafkaSettings, resume: bool, reset: str = "checkpoint") -> object:
        spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=group), idle_s=3.0,
                         poll_s=0.05, reset_offsets=reset)  # type: ignore[arg-type]
        online = OnlineConfig(repartition_interval="0", checkpoint_dir=str(tmp_path),
                              resume=resume)
        job = Job(spec, settings, StoreConfig(), TrainConfig(global_batch=96, log_every=0),
                  online=online, placement=Placement.hash(1))
        return run_rank(LocalComm(), job)

    with EmbeddedBroker(port=port) as broker:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        produce(kafka, ProduceConfig(topic=topic, count=3_200, partitions=2), SYN)
        assert run(kafka, resume=False).job_totals.samples == 3_200  # type: ignore[attr-defined]
    before = ckpt.latest(tmp_path)
    assert before is not None and before.topic_id and sum(before.offsets.values()) == 200
    with EmbeddedBroker(port=port) as broker:  # the same address, an empty log
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        produce(kafka, ProduceConfig(topic=topic, count=4_800, partitions=2),
                SyntheticConfig(vocab_max=20_000, seed=4))
        with pytest.raises(LogLost, match="not the one the checkpoint read"):
            run(kafka, resume=True)
        result = run(kafka, resume=True, reset="earliest")
        assert result.job_totals.samples == 4_800  # type: ignore[attr-defined]
    after = ckpt.latest(tmp_path)
    assert after is not None and after.records == 3_200 + 4_800
    assert sum(after.offsets.values()) == 300 and after.topic_id != before.topic_id
