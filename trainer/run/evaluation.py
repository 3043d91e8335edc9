"""Scoring a model while and after it trains: held-out records and the progressive AUC.

Progressive validation scores each training sample before its update (the logits of the step
that trains on it), so the AUC of the most recent samples is a held-out figure that costs no
extra forward pass. :class:`Progressive` keeps a bounded window of them.

A schema of several labels scores each task apart (labels and scores ``[N, T]``): the
``*_tasks`` functions give one ``(AUC, log-loss)`` a task, the others the first task's.
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

__all__ = ["Progressive", "TaskScores", "score_batches", "score_batches_tasks", "score_heldout",
           "score_heldout_tasks", "task_scores"]

#: ``(AUC, mean log-loss)`` of each task, in the schema's label order.
TaskScores = list[tuple[float, float]]

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
        """This rank's progressive AUC of the first task (NaN without both classes)."""
        return self.local_task_aucs()[0]

    def local_task_aucs(self) -> list[float]:
        """This rank's progressive AUC of each task (NaN without both classes)."""
        y, p = self.arrays()
        y, p = _columns(y), _columns(p)
        return [auc(y[:, t], p[:, t]) if 0 < y[:, t].sum() < y.shape[0] else math.nan
                for t in range(y.shape[1])]

    def job_scores(self, comm: Comm) -> tuple[float, float]:
        """The progressive AUC and mean log-loss over every rank's samples (collective)."""
        return self.job_task_scores(comm)[0]

    def job_task_scores(self, comm: Comm) -> TaskScores:
        """:meth:`job_scores` of each task (collective)."""
        parts = comm.all_gather_object(self.arrays())
        y = _cat([p[0] for p in parts])
        logits = _cat([p[1] for p in parts])
        # Ranked by the logits (sigmoid ties logits past ~37 in float64).
        return task_scores(y, 1 / (1 + np.exp(-logits.astype(np.float64))), logits)


def score_heldout(trainer: Trainer, spec: SyntheticSpec, comm: Comm,
                  local_view: bool = False) -> tuple[float, float]:
    """AUC and mean log-loss of the held-out records, each rank scoring its share
    (collective)."""
    return score_heldout_tasks(trainer, spec, comm, local_view)[0]


def score_heldout_tasks(trainer: Trainer, spec: SyntheticSpec, comm: Comm,
                        local_view: bool = False) -> TaskScores:
    """:func:`score_heldout` of each task (collective)."""
    shard = SyntheticShard(spec, _EVAL_CHUNK, comm.rank, comm.world)
    labels, scores = [], []
    while not shard.exhausted:
        batch = shard.next_batch()
        labels.append(batch.labels)
        scores.append(trainer.predict(batch, local_view=local_view))
    y, p = _gathered(comm, labels, scores)
    return task_scores(y, p)


def score_batches(trainer: Trainer, batches: list[ClickBatch], comm: Comm, schema: Schema
                  ) -> tuple[float, float, int]:
    """AUC, mean log-loss and count of records each rank holds in ``batches`` (its share of a
    hold-out; shares may differ), with the model as it is now (collective: a rank with fewer
    records scores empty chunks, so that every rank calls the same collectives)."""
    scores, n = score_batches_tasks(trainer, batches, comm, schema)
    return scores[0][0], scores[0][1], n


def score_batches_tasks(trainer: Trainer, batches: list[ClickBatch], comm: Comm,
                        schema: Schema) -> tuple[TaskScores, int]:
    """:func:`score_batches` of each task, and the records scored (collective)."""
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
        return [(math.nan, math.nan)] * schema.tasks, 0
    return task_scores(y, p), int(y.shape[0])


def task_scores(y: np.ndarray, p: np.ndarray, ranked: np.ndarray | None = None) -> TaskScores:
    """``(AUC, mean log-loss)`` of each task from labels and probabilities (``[N]`` for one
    task, ``[N, T]`` for several); the AUC ranks ``ranked`` (the logits) when given."""
    y, p = _columns(y), _columns(p)
    r = p if ranked is None else _columns(ranked)
    return [(auc(y[:, t], r[:, t]), _logloss(y[:, t], p[:, t])) for t in range(y.shape[1])]


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    """Rows of ``parts`` in order; an empty part of another shape (a rank that kept nothing)
    left out."""
    full = [q for q in parts if q.shape[0]]
    return np.concatenate(full) if full else parts[0]


def _columns(a: np.ndarray) -> np.ndarray:
    """``[N]`` as ``[N, 1]``; ``[N, T]`` as it is."""
    return a if a.ndim == 2 else a[:, None]


def _gathered(comm: Comm, labels: list[np.ndarray], scores: list[np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Every rank's labels and scores, in rank order (collective)."""
    mine = (_cat(labels) if labels else np.zeros(0), _cat(scores) if scores else np.zeros(0))
    parts = comm.all_gather_object(mine)
    return _cat([p[0] for p in parts]), _cat([p[1] for p in parts])


def _logloss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))) if y.size else math.nan
