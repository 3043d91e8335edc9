"""Serving: the model delta log the trainer publishes, and the model a serve process keeps by it.

* :mod:`trainer.serving.deltas`: the log's messages (Arrow IPC record batches), versions, and
  the checks a message is given alone;
* :mod:`trainer.serving.signing`: an HMAC over every message with a shared key (optional);
* :mod:`trainer.serving.sink`: where a rank's publishes go (kafka-python, acks=all);
* :mod:`trainer.serving.model`: :class:`ServingModel`, a checkpoint kept current by the log;
* :mod:`trainer.serving.follower`: the log's consumer in a serve process;
* :mod:`trainer.serving.server`: the HTTP routes of ``hetgmp serve`` (aiohttp).

The trainer's side, deciding when and what to publish, is :mod:`trainer.online.publisher`.
"""

from trainer.serving.config import ServeConfig
from trainer.serving.deltas import (
    REJECT_REASONS,
    Delta,
    Publish,
    Rejected,
    decode,
    dense_messages,
    log_version,
    mark_message,
    row_messages,
    rows_per_message,
    tombstone_messages,
)
from trainer.serving.follower import DeltaGate, Follower, FollowerStats, FollowerThread
from trainer.serving.model import ServingModel, ServingTable
from trainer.serving.server import Service, build_app
from trainer.serving.signing import Signer, load_signer
from trainer.serving.sink import DeltaSink, Failed, KafkaDeltaSink, MemorySink

__all__ = [
    "REJECT_REASONS",
    "Delta",
    "DeltaGate",
    "DeltaSink",
    "Failed",
    "Follower",
    "FollowerStats",
    "FollowerThread",
    "KafkaDeltaSink",
    "MemorySink",
    "Publish",
    "Rejected",
    "ServeConfig",
    "Service",
    "ServingModel",
    "ServingTable",
    "Signer",
    "build_app",
    "decode",
    "dense_messages",
    "load_signer",
    "log_version",
    "mark_message",
    "row_messages",
    "rows_per_message",
    "tombstone_messages",
]
