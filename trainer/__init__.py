"""Trainer processes and the ``hetgmp`` command line (the one package that imports the others).

The names below load on first use (PEP 562), so that ``hetgmp --help`` and the commands that
need no torch do not pay for importing it.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "DCN",
    "DeepFM",
    "EmbeddingStore",
    "Job",
    "LaunchConfig",
    "Migration",
    "ModelConfig",
    "OnlineConfig",
    "OnlineLoop",
    "RankResult",
    "ReplicaTable",
    "RowExchange",
    "StepCounters",
    "StoreConfig",
    "Totals",
    "TrainConfig",
    "Trainer",
    "TrainerMetrics",
    "WideDeep",
    "WorkerFailed",
    "build_model",
    "launch",
    "run_rank",
]

_HOME = {
    "DCN": "trainer.model.models",
    "DeepFM": "trainer.model.models",
    "WideDeep": "trainer.model.models",
    "build_model": "trainer.model.models",
    "EmbeddingStore": "trainer.embedding.store",
    "ReplicaTable": "trainer.embedding.replicas",
    "RowExchange": "trainer.embedding.exchange",
    "StepCounters": "trainer.counters",
    "Totals": "trainer.counters",
    "LaunchConfig": "trainer.types",
    "ModelConfig": "trainer.types",
    "StoreConfig": "trainer.types",
    "TrainConfig": "trainer.types",
    "Trainer": "trainer.step",
    "OnlineConfig": "trainer.types",
    "OnlineLoop": "trainer.online.loop",
    "Migration": "trainer.embedding.migrate",
    "TrainerMetrics": "trainer.metrics",
    "Job": "trainer.job",
    "RankResult": "trainer.job",
    "run_rank": "trainer.job",
    "WorkerFailed": "trainer.dist.launch",
    "launch": "trainer.dist.launch",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
