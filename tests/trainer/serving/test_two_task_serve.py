"""Two labels end to end (issue 56): the synthetic conversion stream produced into the broker,
MMoE trained on it by two ranks reading Kafka with ``user_history+conversion`` (the items'
table twice as wide as the others), and
``hetgmp serve`` answering over HTTP a score a task for each record, the scores of the model
its checkpoint and delta log hold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from published_job import LAUNCH, PER_MESSAGE, STORE, TRAIN, checkpoints, follow, kafka_spec
from published_job import online_config as published_online
from serve_process import Serve

from hetgmp.partitioner import Placement
from hetgmp.streaming.codec import Decoder
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.run import Job, run_rank

pytestmark = [pytest.mark.broker, pytest.mark.distributed, pytest.mark.slow]

SCHEMA = "user_history+conversion"
SYN = SyntheticConfig(shape="user_history", users=800, items=1_200, conversion=True, seed=5)
RECORDS = 7_680
# The items' table 16 wide, the others 8 (rows stored in blocks of 8).
MODEL = ModelConfig(model="mmoe", embed_dim=8, hidden=(16,), table_dims="C2=16")


def test_serve_answers_a_score_a_task_for_a_two_label_stream_read_from_kafka(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    topic = unique("two-tasks")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    source = kafka_spec(kafka, topic, unique("two-tasks-group"))
    source = replace(source, consumer=replace(source.consumer, schema=SCHEMA))
    job = Job(source, MODEL, STORE, TRAIN, placement=Placement.hash(2),
              online=published_online(tmp_path))
    results = launch(run_rank, job, LAUNCH)
    assert results[0].job_totals.samples == RECORDS
    assert checkpoints(tmp_path)[-1].extra["dims"][:3] == [8, 16, 16]

    lines = SyntheticStream(SYN).lines(RECORDS, 128)  # records no one trained on
    body = b"\n".join(lines) + b"\n"
    batch = Decoder(SYN.schema).decode(lines).batch
    assert batch.labels.shape == (128, 2)
    serve = Serve(tmp_path, kafka, "--schema", SCHEMA)
    try:
        serve.ready()
        status, reply = serve.request("/predict", body)
        assert status == 200, reply
        assert reply["tasks"] == ["label", "conversion"]
        scores = np.asarray(reply["scores"])
        assert scores.shape == (128, 2)
        # The model the final checkpoint and the log after it hold, per task.
        model, follower = follow(kafka, checkpoints(tmp_path)[-1])
        follower.close()
        np.testing.assert_allclose(scores, model.score(batch), rtol=0, atol=1e-5)
        assert np.abs(scores[:, 0] - scores[:, 1]).max() > 1e-3  # two heads answered
    finally:
        serve.stopped_cleanly()
