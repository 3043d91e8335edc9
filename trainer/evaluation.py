"""Scoring a model while and after it trains: held-out records and the progressive AUC.

Progressive validation scores each training sample before its update (the logits of the step
that trains on it), so the AUC of the most recent samples is a held-out figure that costs no
extra forward pass. :class:`Progressive` keeps a bounded window of them.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from streaming import auc
from trainer.dist import Comm
from trainer.sources import SyntheticShard, SyntheticSpec
from trainer.step import Trainer

__all__ = ["Progressive", "score_heldout"]

_EVAL_CHUNK = 8192


class Progressive:
    """The most recent ``keep`` samples of a rank with their scores before their update.

    Args:
        keep: Samples kept (a rank's share of the window).
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._parts: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()
        self._held = 0

    def add(self, labels: np.ndarray, logits: np.ndarray) -> None:
        """One step's labels and logits."""
        self._parts.append((labels, logits))
        self._held += len(labels)
        while self._parts and self._held - len(self._parts[0][0]) >= self.keep:
            self._held -= len(self._parts.popleft()[0])

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels and scores of the samples kept."""
        if not self._parts:
            return np.zeros(0), np.zeros(0)
        return (np.concatenate([p[0] for p in self._parts]),
                np.concatenate([p[1] for p in self._parts]))

    def local_auc(self) -> float:
        """This rank's progressive AUC (NaN without both classes)."""
        y, p = self.arrays()
        return auc(y, p) if 0 < y.sum() < y.size else math.nan

    def job_auc(self, comm: Comm) -> float:
        """The progressive AUC over every rank's samples (collective)."""
        parts = comm.all_gather_object(self.arrays())
        return auc(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def score_heldout(trainer: Trainer, spec: SyntheticSpec, comm: Comm,
                  local_view: bool = False) -> tuple[float, float]:
    """AUC and mean log-loss of the held-out records, each rank scoring its share
    (collective)."""
    shard = SyntheticShard(spec, _EVAL_CHUNK, comm.rank, comm.world)
    labels, scores = [], []
    while not shard.exhausted:
        batch = shard.next_batch()
        labels.append(batch.labels)
        scores.append(trainer.predict(batch, local_view=local_view))
    parts = comm.all_gather_object((np.concatenate(labels), np.concatenate(scores)))
    y = np.concatenate([p[0] for p in parts])
    p = np.clip(np.concatenate([p[1] for p in parts]), 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return auc(y, p), logloss
