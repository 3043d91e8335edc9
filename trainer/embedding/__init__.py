"""The embedding path of one rank: rows keyed by int64 id and their optimizer, in tensors on
the rank's device; replicas of rows owned elsewhere under bounded staleness; the row exchange
of a step; rows moving to new owners. The step reaches all of it through
:class:`EmbeddingPath` (implemented by :class:`RowExchange`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.embedding.config import StoreConfig
    from hetgmp.trainer.embedding.dedup import unique_padded
    from hetgmp.trainer.embedding.exchange import RowExchange
    from hetgmp.trainer.embedding.migrate import Migration, move_chunk, row_bytes
    from hetgmp.trainer.embedding.optimizer import initial_rows
    from hetgmp.trainer.embedding.replicas import ReplicaTable
    from hetgmp.trainer.embedding.store import EmbeddingStore
    from hetgmp.trainer.embedding.tier import DiskTier

__all__ = [
    "DiskTier",
    "EmbeddingStore",
    "Migration",
    "ReplicaTable",
    "RowExchange",
    "StoreConfig",
    "initial_rows",
    "move_chunk",
    "row_bytes",
    "unique_padded",
]

__getattr__ = lazy_exports(__name__, {
    "DiskTier": "hetgmp.trainer.embedding.tier",
    "EmbeddingStore": "hetgmp.trainer.embedding.store",
    "Migration": "hetgmp.trainer.embedding.migrate",
    "ReplicaTable": "hetgmp.trainer.embedding.replicas",
    "RowExchange": "hetgmp.trainer.embedding.exchange",
    "StoreConfig": "hetgmp.trainer.embedding.config",
    "initial_rows": "hetgmp.trainer.embedding.optimizer",
    "move_chunk": "hetgmp.trainer.embedding.migrate",
    "row_bytes": "hetgmp.trainer.embedding.migrate",
    "unique_padded": "hetgmp.trainer.embedding.dedup",
})
