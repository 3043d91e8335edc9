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

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.serving.config import ServeConfig
    from trainer.serving.deltas import (
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
    from trainer.serving.follower import Follower, FollowerThread
    from trainer.serving.model import ServingModel
    from trainer.serving.server import Service, build_app
    from trainer.serving.signing import load_signer
    from trainer.serving.sink import DeltaSink, KafkaDeltaSink

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
    "DeltaSink": "trainer.serving.sink",
    "Follower": "trainer.serving.follower",
    "FollowerThread": "trainer.serving.follower",
    "KafkaDeltaSink": "trainer.serving.sink",
    "Publish": "trainer.serving.deltas",
    "Rejected": "trainer.serving.deltas",
    "ServeConfig": "trainer.serving.config",
    "Service": "trainer.serving.server",
    "ServingModel": "trainer.serving.model",
    "build_app": "trainer.serving.server",
    "decode": "trainer.serving.deltas",
    "dense_messages": "trainer.serving.deltas",
    "load_signer": "trainer.serving.signing",
    "log_version": "trainer.serving.deltas",
    "mark_message": "trainer.serving.deltas",
    "row_messages": "trainer.serving.deltas",
    "rows_per_message": "trainer.serving.deltas",
    "tombstone_messages": "trainer.serving.deltas",
})
