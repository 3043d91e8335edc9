"""Trainer processes and the ``hetgmp`` command line (the one package that imports the others).

The names below load on first use (PEP 562), so that ``hetgmp --help`` and the commands that
need no torch do not pay for importing it.
"""

from __future__ import annotations

from hetgmp.runtime import lazy_exports

_HOME = {
    "build_model": "hetgmp.trainer.model",
    "EmbeddingStore": "hetgmp.trainer.embedding",
    "ReplicaTable": "hetgmp.trainer.embedding",
    "RowExchange": "hetgmp.trainer.embedding",
    "Migration": "hetgmp.trainer.embedding",
    "StepCounters": "hetgmp.trainer.dist",
    "Totals": "hetgmp.trainer.dist",
    "LaunchConfig": "hetgmp.trainer.dist",
    "ModelConfig": "hetgmp.trainer.model",
    "OnlineConfig": "hetgmp.trainer.online",
    "StoreConfig": "hetgmp.trainer.embedding",
    "TrainConfig": "hetgmp.trainer.step",
    "Trainer": "hetgmp.trainer.step",
    "OnlineLoop": "hetgmp.trainer.online",
    "Source": "hetgmp.trainer.sources",
    "KafkaSpec": "hetgmp.trainer.sources",
    "SyntheticSpec": "hetgmp.trainer.sources",
    "Job": "hetgmp.trainer.run",
    "RankResult": "hetgmp.trainer.run",
    "run_rank": "hetgmp.trainer.run",
    "Comm": "hetgmp.trainer.dist",
    "ThreadComm": "hetgmp.trainer.dist",
    "PeerLost": "hetgmp.trainer.dist",
    "WorkerFailed": "hetgmp.trainer.dist",
    "launch": "hetgmp.trainer.dist",
    "run_threads": "hetgmp.trainer.dist",
}

__all__ = sorted(_HOME)


__getattr__ = lazy_exports(__name__, _HOME)
