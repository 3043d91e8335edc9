"""hetgmp-stream: online training of large-embedding CTR models from Kafka, the embedding
table placed by the stream's own access graph.

The one package users import. Its parts are subpackages: ``hetgmp.streaming`` (Kafka, records,
schemas), ``hetgmp.partitioner`` (placement algorithms), ``hetgmp.trainer`` (ranks, store,
models, online loop, serving) and ``hetgmp.runtime`` (clock, config, logs); the names below are
the ones a user needs, imported when first used (``import hetgmp`` loads no torch). In the
repository the subpackages are the top-level folders (``streaming/``, ...), which this folder
links to; a wheel holds them inside it.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Schema": "hetgmp.streaming",
    "SchemaError": "hetgmp.streaming",
    "load_schema": "hetgmp.streaming.schema_file",
    "parse_schema": "hetgmp.streaming",
    "KafkaSettings": "hetgmp.streaming",
    "SyntheticConfig": "hetgmp.streaming",
    "PartitionConfig": "hetgmp.partitioner",
    "Placement": "hetgmp.partitioner",
    "ModelConfig": "hetgmp.trainer.model",
    "StoreConfig": "hetgmp.trainer.embedding",
    "TrainConfig": "hetgmp.trainer.step",
    "OnlineConfig": "hetgmp.trainer.online",
    "LaunchConfig": "hetgmp.trainer.dist",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hetgmp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
