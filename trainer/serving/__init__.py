"""Serving: the model delta log the trainer publishes, and the model a serve process keeps by it.

* :mod:`hetgmp.trainer.serving.deltas`: the log's messages (Arrow IPC record batches), versions, and
  the checks a message is given alone;
* :mod:`hetgmp.trainer.serving.signing`: an HMAC over every message with a shared key (optional);
* :mod:`hetgmp.trainer.serving.sink`: where a rank's publishes go (kafka-python, acks=all);
* :mod:`hetgmp.trainer.serving.model`: :class:`ServingModel`, a checkpoint kept current by the log;
* :mod:`hetgmp.trainer.serving.follower`: the log's consumer in a serve process;
* :mod:`hetgmp.trainer.serving.server`: the HTTP routes of ``hetgmp serve`` (aiohttp).

The trainer's side, deciding when and what to publish, is :mod:`hetgmp.trainer.online.publisher`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.serving.config import ServeConfig
    from hetgmp.trainer.serving.deltas import (
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
    from hetgmp.trainer.serving.follower import Follower, FollowerThread
    from hetgmp.trainer.serving.model import ServingModel
    from hetgmp.trainer.serving.server import Service, build_app
    from hetgmp.trainer.serving.signing import load_signer
    from hetgmp.trainer.serving.sink import DeltaSink, KafkaDeltaSink

__all__ = [
    "DeltaSink",
    "Follower",
    "FollowerThread",
    "KafkaDeltaSink",
    "Publish",
    "Rejected",
    "ServeConfig",
    "Service",
    "ServingModel",
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

__getattr__ = lazy_exports(__name__, {
    "DeltaSink": "hetgmp.trainer.serving.sink",
    "Follower": "hetgmp.trainer.serving.follower",
    "FollowerThread": "hetgmp.trainer.serving.follower",
    "KafkaDeltaSink": "hetgmp.trainer.serving.sink",
    "Publish": "hetgmp.trainer.serving.deltas",
    "Rejected": "hetgmp.trainer.serving.deltas",
    "ServeConfig": "hetgmp.trainer.serving.config",
    "Service": "hetgmp.trainer.serving.server",
    "ServingModel": "hetgmp.trainer.serving.model",
    "build_app": "hetgmp.trainer.serving.server",
    "decode": "hetgmp.trainer.serving.deltas",
    "dense_messages": "hetgmp.trainer.serving.deltas",
    "load_signer": "hetgmp.trainer.serving.signing",
    "log_version": "hetgmp.trainer.serving.deltas",
    "mark_message": "hetgmp.trainer.serving.deltas",
    "row_messages": "hetgmp.trainer.serving.deltas",
    "rows_per_message": "hetgmp.trainer.serving.deltas",
    "tombstone_messages": "hetgmp.trainer.serving.deltas",
})
