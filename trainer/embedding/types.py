"""Values of the embedding path: what a read gives the step (:class:`Read`), what a store's
padded lookup answers (:class:`PaddedLookup`), finds (:class:`Found`) and has done
(:class:`StoreStats`), and the audit log of the staleness protocol (:class:`Audit`). The
contract between a step and the path is :class:`hetgmp.trainer.embedding.path.EmbeddingPath`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["Audit", "Found", "PaddedLookup", "Read", "StoreStats"]


@dataclass
class StoreStats:
    """What the store has done since it was created."""

    created: int = 0
    evicted: int = 0
    # Lookups of ids without a row, per lookup call: an id its owner reads and another rank
    # fetches in the same step counts twice (once with the device exchange, which looks both
    # up in one call).
    not_admitted_reads: int = 0
    dropped_updates: int = 0
    # Distinct ids looked up (a lookup call's ids; the hit rate's denominator).
    looked_up: int = 0
    # The disk tier: rows written to it past the cap, and rows read back into memory.
    spilled: int = 0
    restored: int = 0
    # Spilled rows read ahead of their step (prefetch), and of the rows read back those the
    # prefetch had read.
    prefetched: int = 0
    read_ahead: int = 0


class PaddedLookup(NamedTuple):
    """What :meth:`EmbeddingStore.lookup_padded` answers.

    Attributes:
        ids: The distinct ids, ``ids[:count]`` of the padded array (pass this tensor to
            :meth:`EmbeddingStore.apply`: it reuses the lookup's slots).
        values: Their rows.
        state: Their optimizer state (None unless asked for).
        extra: The caller's extra values, read back with the counts.
    """

    ids: torch.Tensor
    values: torch.Tensor
    state: torch.Tensor | None
    extra: list[float]


@dataclass
class Audit:
    """Logs for checking the staleness bound independently of the owners' lag counts.

    Attributes:
        applied: int64 ``[k, 5]`` chunks ``(step, id, source rank, updates, after reads)``:
            every update an owner applied to a replicated row; ``after reads`` is 1 for the
            step's write and 0 for a flush between steps (which comes before ``step``'s reads).
        reads: int64 ``[k, 3]`` chunks ``(step, id, refreshed)``: every replica read.
    """

    applied: list[np.ndarray]
    reads: list[np.ndarray]


@dataclass
class Read:
    """What a read gives the step (an implementation adds what its write needs).

    Attributes:
        values: ``[n, row_dim]`` the row of each distinct id, as read.
        extra: The caller's extra values, read back with the read's first wait.
        step: The step.
    """

    values: torch.Tensor
    extra: list[float]
    step: int


class Found(NamedTuple):
    """What ``EmbeddingStore._find_rows`` found, for a lookup that waits for nothing.

    Attributes:
        slots: Row slot of each id, -1 for an id without a row.
        candidates: Admission-candidate slot of each id, -1 where none (None: admission off).
        counts: int64 ``[3]`` on the device: of the valid ids, those without a row, those of
            them not yet candidates, those of them admitted now (the last two 0 when
            admission is off).
    """

    slots: torch.Tensor
    candidates: torch.Tensor | None
    counts: torch.Tensor

    def head(self, n: int) -> Found:
        """The same for the first ``n`` ids (the valid ones of a padded batch)."""
        cand = None if self.candidates is None else self.candidates[:n]
        return Found(self.slots[:n], cand, self.counts)
