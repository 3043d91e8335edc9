"""A signed delta log on the real broker: the trainer's sink signs every message in a Kafka
header, a follower holding the key applies those and refuses a forged one between them, and a
follower of an unsigned log is unaffected by the header. On both Kafka client libraries: the
headers, the acknowledged offsets and the catch-up go through :mod:`hetgmp.streaming.clients`."""

from __future__ import annotations

import numpy as np
import pytest
from kafka import KafkaProducer

from hetgmp.streaming import ensure_topic
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.trainer.serving import (
    Follower,
    KafkaDeltaSink,
    Publish,
    ServingModel,
    log_version,
    mark_message,
    row_messages,
)
from hetgmp.trainer.serving.signing import Signer

pytestmark = pytest.mark.broker

SHAPE = {"model": "widedeep", "row_dim": 5, "hidden": [4], "cross_layers": 0, "fields": 2,
         "dense": 1, "row_seed": 0, "row_init_scale": 0.01}


def _model(lineage: str) -> ServingModel:
    from hetgmp.trainer.model import FlatParameters, build_model
    from hetgmp.trainer.serving.model import model_config

    n = FlatParameters(build_model(model_config(SHAPE), 2, 1)).numel
    return ServingModel(SHAPE, np.zeros(n, np.float32), lineage=lineage,
                        version=log_version(1, 0), world=1, step=0)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_signed_log_applies_the_trainers_messages_and_refuses_a_forged_one(
        kafka: KafkaSettings, unique, client: str) -> None:
    topic = unique("signed.model")
    ensure_topic(kafka, topic, 1)
    key = Signer(b"s" * 32)
    head = Publish(rank=0, world=1, generation=1, publish=1, step=10, watermark_ms=5,
                   lineage="abc")
    sink = KafkaDeltaSink(kafka, topic, 0, signer=key, client=client)
    (first,) = row_messages(np.arange(4), np.full((4, 5), 0.5, np.float32), head)
    sink.send(first)
    sink.flush()
    assert sink.acked() == {0: 1}  # the offset after the message the broker stored
    # Someone with write access to the topic, who read the lineage from the message above.
    forger = KafkaProducer(**kafka.client_kwargs(), acks="all")
    (forged,) = row_messages(np.arange(4), np.full((4, 5), 9.0, np.float32),
                             Publish(0, 1, 1, 2, 11, 6, "abc"))
    forger.send(topic, forged, partition=0).get(30)
    forger.send(topic, forged, partition=0, headers=Signer(b"x" * 32).headers(forged)).get(30)
    forger.close()
    head2 = Publish(rank=0, world=1, generation=1, publish=2, step=12, watermark_ms=7,
                    lineage="abc")
    (second,) = row_messages(np.arange(2, 6), np.full((4, 5), 0.25, np.float32), head2)
    sink.send(second)
    sink.send(mark_message(1, head2))
    sink.flush()
    assert sink.acked() == {0: 5} and sink.take_failed().messages == 0
    sink.close()

    signed = _model("abc")
    follower = Follower(kafka, topic, signed, {}, signer=key, client=client)
    follower.catch_up(timeout_s=30)
    follower.close()
    assert follower.stats.rejected["signature"] == 2
    np.testing.assert_array_equal(signed.table.gather(np.arange(2))[0], 0.5)
    np.testing.assert_array_equal(signed.table.gather(np.arange(2, 6))[0], 0.25)
    assert signed.applied.by_kind == {"rows": 2, "mark": 1}

    # Without a key, the signature header changes nothing (and the forgery is applied: the
    # reason to sign).
    plain = _model("abc")
    follower = Follower(kafka, topic, plain, {}, client=client)
    follower.catch_up(timeout_s=30)
    follower.close()
    assert sum(follower.stats.rejected.values()) == 0
    np.testing.assert_array_equal(plain.table.gather(np.arange(2))[0], 9.0)

    # From a checkpoint's offsets: what comes after them only (the two forgeries are 1 and 2).
    later = _model("abc")
    follower = Follower(kafka, topic, later, {0: 3}, client=client)
    follower.catch_up(timeout_s=30)
    lag = follower.lag_messages()
    follower.close()
    assert later.applied.by_kind == {"rows": 1, "mark": 1} and lag == 0
    np.testing.assert_array_equal(later.table.gather(np.arange(2, 6))[0], 0.25)
