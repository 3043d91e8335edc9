"""hetgmp-stream: online training of large-embedding CTR models from Kafka, the embedding
table placed by the stream's own access graph.

The one package users import. Its parts are subpackages: ``hetgmp.streaming`` (Kafka, records,
schemas), ``hetgmp.partitioner`` (placement algorithms), ``hetgmp.trainer`` (ranks, store,
models, online loop, serving) and ``hetgmp.runtime`` (clock, config, logs); the names below are
the ones a user needs, imported when first used (``import hetgmp`` loads no torch): the
configs and the schema, the model contract (``Features``, ``ModelSpec``) and ``train``, which
trains a model (a built-in, a factory's path, or the factory itself) on a source. In the
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
    "ConsumerConfig": "hetgmp.streaming",
    "KafkaSpec": "hetgmp.trainer.sources",
    "SyntheticSpec": "hetgmp.trainer.sources",
    "Features": "hetgmp.trainer.model",
    "Sequence": "hetgmp.trainer.model",
    "ModelSpec": "hetgmp.trainer.model",
    "ModelError": "hetgmp.trainer.model",
    "Job": "hetgmp.trainer.run",
    "train": "hetgmp.trainer.run",
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
