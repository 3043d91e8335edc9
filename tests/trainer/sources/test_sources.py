"""The Kafka source of a rank ends when its record budget is spent, on the embedded broker."""

from __future__ import annotations

import pytest

from partitioner import Placement
from streaming.consumer import ConsumerConfig
from streaming.kafka import KafkaSettings, ensure_topic
from streaming.producer import ProduceConfig, produce
from streaming.synthetic import SyntheticConfig
from trainer.dist.comm import LocalComm
from trainer.job import Job
from trainer.run import run_rank
from trainer.sources import KafkaShard, KafkaSpec
from trainer.types import ModelConfig, StoreConfig, TrainConfig

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
