"""One 2-rank job that trains a Kafka topic, checkpointing every few steps and publishing its
delta log every 50 ms, for the whole session: the serving tests read its checkpoints and log."""

from __future__ import annotations

import pytest
from published_job import (
    LAUNCH,
    MODEL,
    PER_MESSAGE,
    RECORDS,
    STORE,
    SYN,
    TRAIN,
    kafka_spec,
    online_config,
)

from hetgmp.partitioner import Placement
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.testing import ReturnState


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, broker) -> dict:
    from hetgmp.streaming.kafka import KafkaSettings as KS

    kafka = KS(bootstrap_servers=broker.bootstrap_servers, client_id="hetgmp-test")
    root = tmp_path_factory.mktemp("published")
    topic = f"deltas-{root.name}"
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    job = Job(kafka_spec(kafka, topic, f"{topic}-group"), MODEL, STORE, TRAIN,
              placement=Placement.hash(2), online=online_config(root),
              observers=(ReturnState,))
    results = launch(run_rank, job, LAUNCH)
    return {"kafka": kafka, "root": root, "topic": topic, "results": results}


