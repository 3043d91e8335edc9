"""Trainer processes and the ``hetgmp`` command line (the one package that imports the others).

The names below load on first use (PEP 562), so that ``hetgmp --help`` and the commands that
need no torch do not pay for importing it.
"""

from __future__ import annotations

from runtime import lazy_exports

_HOME = {
    "build_model": "trainer.model",
    "EmbeddingStore": "trainer.embedding",
    "ReplicaTable": "trainer.embedding",
    "RowExchange": "trainer.embedding",
    "Migration": "trainer.embedding",
    "StepCounters": "trainer.dist",
    "Totals": "trainer.dist",
    "LaunchConfig": "trainer.dist",
    "ModelConfig": "trainer.model",
    "OnlineConfig": "trainer.online",
    "StoreConfig": "trainer.embedding",
    "TrainConfig": "trainer.step",
    "Trainer": "trainer.step",
    "OnlineLoop": "trainer.online",
    "Source": "trainer.sources",
    "KafkaSpec": "trainer.sources",
    "SyntheticSpec": "trainer.sources",
    "Job": "trainer.run",
    "RankResult": "trainer.run",
    "run_rank": "trainer.run",
    "Comm": "trainer.dist",
    "ThreadComm": "trainer.dist",
    "PeerLost": "trainer.dist",
    "WorkerFailed": "trainer.dist",
    "launch": "trainer.dist",
    "run_threads": "trainer.dist",
}

__all__ = sorted(_HOME)


__getattr__ = lazy_exports(__name__, _HOME)
