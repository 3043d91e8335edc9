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
    "DCN": "trainer.models",
    "DeepFM": "trainer.models",
    "WideDeep": "trainer.models",
    "build_model": "trainer.models",
    "EmbeddingStore": "trainer.store",
    "ReplicaTable": "trainer.replicas",
    "RowExchange": "trainer.exchange",
    "StepCounters": "trainer.counters",
    "Totals": "trainer.counters",
    "LaunchConfig": "trainer.types",
    "ModelConfig": "trainer.types",
    "StoreConfig": "trainer.types",
    "TrainConfig": "trainer.types",
    "Trainer": "trainer.step",
    "OnlineConfig": "trainer.types",
    "OnlineLoop": "trainer.online",
    "Migration": "trainer.migrate",
    "TrainerMetrics": "trainer.metrics",
    "Job": "trainer.worker",
    "RankResult": "trainer.worker",
    "run_rank": "trainer.worker",
    "WorkerFailed": "trainer.launch",
    "launch": "trainer.launch",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
