"""The contract between a training step and the embedding path of its rank.

:class:`hetgmp.trainer.step.Trainer` routes samples, runs the model's forward and backward and
averages the dense gradients; everything about rows goes through an :class:`EmbeddingPath`:
the rows of a routed batch's distinct ids (:meth:`~EmbeddingPath.read`), their gradients back
(:meth:`~EmbeddingPath.write`), and between steps the replicas' pending updates pushed to their
owners (:meth:`~EmbeddingPath.flush`), rows read for evaluation without touching them
(:meth:`~EmbeddingPath.read_only`), and the placement and replica sets it follows. The rows
themselves, for checkpoints, the delta log and migrations, are its :attr:`~EmbeddingPath.store`
(:class:`~hetgmp.trainer.embedding.EmbeddingStore`).

One implementation does the job: :class:`~hetgmp.trainer.embedding.RowExchange`, on tensors on the
rank's device (CPU and CUDA alike).
"""

from __future__ import annotations

import abc

import numpy as np
import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer.dist import StepCounters
from hetgmp.trainer.embedding.replicas import ReplicaTable
from hetgmp.trainer.embedding.store import EmbeddingStore
from hetgmp.trainer.embedding.types import Read

__all__ = ["EmbeddingPath"]


class EmbeddingPath(abc.ABC):
    """Rows for a rank's steps: read, written back, flushed, and following the placement.

    Attributes:
        store: The rank's rows (primaries): checkpoints, the delta log and migrations read and
            write them between steps.
        placement: The placement in force (assign to change it, between steps).
        replicas: This rank's copies (assign a new table to change the set, between steps,
            once :meth:`flush` pushed every pending update).
    """

    store: EmbeddingStore
    placement: Placement
    replicas: ReplicaTable

    @abc.abstractmethod
    def read(self, ids: torch.Tensor, count: torch.Tensor, step: int, counters: StepCounters,
             extra: torch.Tensor | None = None) -> Read:
        """Rows of the distinct ids ``ids[:count]`` (sorted on the device, the rest padding),
        for ``step``; ``extra`` values on the device are read back with the read's first wait
        (the step's last loss). Collective: every rank reads at every step."""

    @abc.abstractmethod
    def write(self, plan: Read, grads: torch.Tensor, counters: StepCounters) -> None:
        """The gradient of each row ``plan`` read (``[n, row_dim]``), applied by the rows'
        owners (collective)."""

    @abc.abstractmethod
    def flush(self, step: int = -1) -> int:
        """Push the replicas' pending updates to their owners; the rows pushed (collective)."""

    @abc.abstractmethod
    def read_only(self, uniq: np.ndarray, *, replicas: bool = False) -> torch.Tensor:
        """Rows of sorted distinct ids for evaluation, creating and touching nothing (this
        rank's copies where ``replicas``, else the owners' rows; collective)."""

    @abc.abstractmethod
    def set_replicated(self, ids: np.ndarray) -> None:
        """Rows some rank replicates now (every rank's set, between steps)."""
