"""The embedding path of one rank: rows keyed by int64 id and their optimizer, in tensors on
the rank's device; replicas of rows owned elsewhere under bounded staleness; the row exchange
of a step; rows moving to new owners. The step reaches all of it through
:class:`EmbeddingPath` (implemented by :class:`RowExchange`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.embedding.config import StoreConfig
    from trainer.embedding.dedup import unique_padded
    from trainer.embedding.exchange import RowExchange
    from trainer.embedding.migrate import Migration, move_chunk, row_bytes
    from trainer.embedding.optimizer import initial_rows
    from trainer.embedding.replicas import ReplicaTable
    from trainer.embedding.store import EmbeddingStore

__all__ = [
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
    "EmbeddingStore": "trainer.embedding.store",
    "Migration": "trainer.embedding.migrate",
    "ReplicaTable": "trainer.embedding.replicas",
    "RowExchange": "trainer.embedding.exchange",
    "StoreConfig": "trainer.embedding.config",
    "initial_rows": "trainer.embedding.optimizer",
    "move_chunk": "trainer.embedding.migrate",
    "row_bytes": "trainer.embedding.migrate",
    "unique_padded": "trainer.embedding.dedup",
})
