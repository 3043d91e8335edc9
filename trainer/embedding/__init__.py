"""The embedding path of one rank: rows keyed by int64 id, their optimizer, replicas of rows
owned elsewhere under bounded staleness, the row exchange of a step, and rows moving to new
owners."""

from trainer.embedding.dedup import Unique, unique_padded
from trainer.embedding.device_exchange import DeviceExchange, DevicePlacement, DevicePlan
from trainer.embedding.device_index import DeviceIndex
from trainer.embedding.device_store import DeviceStore
from trainer.embedding.exchange import Audit, ReadPlan, RowExchange
from trainer.embedding.migrate import ChunkReport, Migration, move_chunk, row_bytes
from trainer.embedding.optimizer import RowOptimizer, initial_rows
from trainer.embedding.replicas import ReplicaTable
from trainer.embedding.store import EmbeddingStore, StoreStats

__all__ = [
    "Audit",
    "ChunkReport",
    "DeviceExchange",
    "DeviceIndex",
    "DevicePlacement",
    "DevicePlan",
    "DeviceStore",
    "EmbeddingStore",
    "Migration",
    "ReadPlan",
    "ReplicaTable",
    "RowExchange",
    "RowOptimizer",
    "StoreStats",
    "Unique",
    "initial_rows",
    "move_chunk",
    "row_bytes",
    "unique_padded",
]
