"""Serving: the model delta log the trainer publishes, and the model a serve process keeps by it.

* :mod:`trainer.serving.deltas`: the log's messages (Arrow IPC record batches) and versions;
* :mod:`trainer.serving.sink`: where a rank's publishes go (kafka-python, acks=all);
* :mod:`trainer.serving.model`: :class:`ServingModel`, a checkpoint kept current by the log;
* :mod:`trainer.serving.follower`: the log's consumer in a serve process;
* :mod:`trainer.serving.server`: the HTTP routes of ``hetgmp serve`` (aiohttp).

The trainer's side, deciding when and what to publish, is :mod:`trainer.online.publisher`.
"""

from trainer.serving.deltas import (
    Delta,
    Publish,
    decode,
    dense_messages,
    log_version,
    mark_message,
    row_messages,
    rows_per_message,
    tombstone_messages,
)
from trainer.serving.follower import Follower, FollowerThread
from trainer.serving.model import ServingModel, ServingTable
from trainer.serving.server import Service, build_app
from trainer.serving.sink import DeltaSink, Failed, KafkaDeltaSink, MemorySink

__all__ = [
    "Delta",
    "DeltaSink",
    "Failed",
    "Follower",
    "FollowerThread",
    "KafkaDeltaSink",
    "MemorySink",
    "Publish",
    "Service",
    "ServingModel",
    "ServingTable",
    "build_app",
    "decode",
    "dense_messages",
    "log_version",
    "mark_message",
    "row_messages",
    "rows_per_message",
    "tombstone_messages",
]
