"""The embedding path of one rank: rows keyed by int64 id and their optimizer, in tensors on
the rank's device; replicas of rows owned elsewhere under bounded staleness; the row exchange
of a step; rows moving to new owners. The step reaches all of it through
:class:`EmbeddingPath` (implemented by :class:`RowExchange`)."""

from trainer.embedding.config import StoreConfig
from trainer.embedding.dedup import Unique, unique_padded
from trainer.embedding.exchange import Audit, RowExchange
from trainer.embedding.migrate import ChunkReport, Migration, move_chunk, row_bytes
from trainer.embedding.optimizer import RowOptimizer, initial_rows
from trainer.embedding.path import EmbeddingPath
from trainer.embedding.replicas import ReplicaTable
from trainer.embedding.store import EmbeddingStore, StoreStats
from trainer.embedding.types import Read

__all__ = [
    "Audit",
    "ChunkReport",
    "EmbeddingPath",
    "EmbeddingStore",
    "Migration",
    "Read",
    "ReplicaTable",
    "RowExchange",
    "RowOptimizer",
    "StoreConfig",
    "StoreStats",
    "Unique",
    "initial_rows",
    "move_chunk",
    "row_bytes",
    "unique_padded",
]
