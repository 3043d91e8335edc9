"""Scoring a model while and after it trains: held-out records and the progressive AUC.

Progressive validation scores each training sample before its update (the logits of the step
that trains on it), so the AUC of the most recent samples is a held-out figure that costs no
extra forward pass. :class:`Progressive` keeps a bounded window of them.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import torch

from hetgmp.streaming import ClickBatch, Schema, auc
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.sources import SyntheticShard, SyntheticSpec
from hetgmp.trainer.step import Trainer

__all__ = ["Progressive", "score_batches", "score_heldout"]

_EVAL_CHUNK = 8192


class Progressive:
    """The training samples of a job's most recent steps, with their scores before their update.

    The window is the fewest whole steps, newest first, that hold ``keep`` samples of the job
    (every rank's together): each rank keeps its own share of those steps, so the union over
    the ranks (:meth:`job_scores`) is the same set of samples whatever the ranks and however
    unequal their shares (graph placement, batch-aware routing), and the same as one process
    keeps on the same global batches.

    Scores may stay on the device as tensors: they are copied to the host together when
    read (:meth:`arrays`, every few steps for the metric), not one wait a step.

    Args:
        keep: Samples of the job the window holds at least.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._parts: collections.deque[tuple[np.ndarray, np.ndarray | torch.Tensor, int]] = \
            collections.deque()
        self._held = 0  # samples of the job in the steps kept

    def add(self, labels: np.ndarray, logits: np.ndarray | torch.Tensor,
            step_samples: int | None = None) -> None:
        """One step's labels and logits on this rank (numpy, or a tensor on any device).

        Args:
            labels: This rank's samples of the step.
            logits: Their scores before the update.
            step_samples: The step's samples over every rank (the same on every rank); this
                rank's by default (one process).
        """
        step = len(labels) if step_samples is None else int(step_samples)
        self._parts.append((labels, logits, step))
        self._held += step
        while self._parts and self._held - self._parts[0][2] >= self.keep:
            self._held -= self._parts.popleft()[2]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels and scores of the samples kept."""
        if not self._parts:
            return np.zeros(0), np.zeros(0)
        scores = [p[1] for p in self._parts]
        if all(isinstance(x, torch.Tensor) for x in scores):  # one copy to the host
            logits = torch.cat(scores).cpu().numpy()  # type: ignore[arg-type]
        else:
            logits = np.concatenate([x.cpu().numpy() if isinstance(x, torch.Tensor) else x
                                     for x in scores])
        return np.concatenate([p[0] for p in self._parts]), logits

    def local_auc(self) -> float:
        """This rank's progressive AUC (NaN without both classes)."""
        y, p = self.arrays()
        return auc(y, p) if 0 < y.sum() < y.size else math.nan

    def job_scores(self, comm: Comm) -> tuple[float, float]:
        """The progressive AUC and mean log-loss over every rank's samples (collective)."""
        parts = comm.all_gather_object(self.arrays())
        y = np.concatenate([p[0] for p in parts])
        logits = np.concatenate([p[1] for p in parts])
        return auc(y, logits), _logloss(y, 1 / (1 + np.exp(-logits.astype(np.float64))))


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
    y, p = _gathered(comm, labels, scores)
    return auc(y, p), _logloss(y, p)


def score_batches(trainer: Trainer, batches: list[ClickBatch], comm: Comm, schema: Schema
                  ) -> tuple[float, float, int]:
    """AUC, mean log-loss and count of records each rank holds in ``batches`` (its share of a
    hold-out; shares may differ), with the model as it is now (collective: a rank with fewer
    records scores empty chunks, so that every rank calls the same collectives)."""
    mine = ClickBatch.concat(batches) if batches else None
    n = len(mine) if mine is not None else 0
    chunks = max(comm.all_gather_object(-(-n // _EVAL_CHUNK)))
    labels, scores = [], []
    for i in range(chunks):
        lo = i * _EVAL_CHUNK
        part = mine.take(slice(lo, lo + _EVAL_CHUNK)) if mine is not None else None
        if part is None:
            part = ClickBatch.empty(schema)
        labels.append(part.labels)
        scores.append(trainer.predict(part))
    y, p = _gathered(comm, labels, scores)
    if not y.size:
        return math.nan, math.nan, 0
    return auc(y, p), _logloss(y, p), int(y.size)


def _gathered(comm: Comm, labels: list[np.ndarray], scores: list[np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's labels and scores, in rank order (collective)."""
    mine = (np.concatenate(labels) if labels else np.zeros(0),
            np.concatenate(scores) if scores else np.zeros(0))
    parts = comm.all_gather_object(mine)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _logloss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))) if y.size else math.nan
