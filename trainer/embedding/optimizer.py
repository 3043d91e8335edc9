"""Initial row values and the row optimizer, shared by owners' stores and replica copies.

A row's initial value is a pure function of ``(seed, id)``, so any rank that becomes a row's
owner creates the same row, and a row that was evicted comes back as a fresh one.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime import fmix64
from trainer.embedding.config import StoreConfig

__all__ = ["RowOptimizer", "column_keys", "initial_rows", "seed_key"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SEED_SALT = np.uint64(0xD6E8FEB86659FD93)


def initial_rows(ids: np.ndarray, dim: int, seed: int, scale: float) -> np.ndarray:
    """Initial values of rows: uniform in ``[-scale, scale)``, a pure function of (seed, id).

    Each element takes 53 bits of ``fmix64(fmix64(id ^ key(seed)) + column * golden)``, computed
    in float64, so every rank, process and run gets bit-identical rows.

    Args:
        ids: int64 ids ``[n]``.
        dim: Row width.
        seed: Seed of the table.
        scale: Half-width of the interval.

    Returns:
        float64 ``[n, dim]``.
    """
    base = fmix64(np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64) ^ seed_key(seed))
    with np.errstate(over="ignore"):
        bits = fmix64(base[:, None] + column_keys(dim)[None, :])
    unit = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return (2.0 * unit - 1.0) * scale


def seed_key(seed: int) -> np.uint64:
    """The 64-bit key a table's seed mixes into every id (``initial_rows``)."""
    return np.uint64(fmix64(np.array([seed], dtype=np.int64).view(np.uint64) ^ _SEED_SALT)[0])


def column_keys(dim: int) -> np.ndarray:
    """What each column adds to an id's mixed key before the second mix: uint64 ``[dim]``."""
    with np.errstate(over="ignore"):
        return np.arange(1, dim + 1, dtype=np.uint64) * _GOLDEN


class RowOptimizer:
    """SGD or row-wise Adagrad on gathered rows (one accumulator per row, as in FBGEMM/TorchRec).

    Row-wise Adagrad: ``acc += mean(g**2)``; ``row -= lr * g / (sqrt(acc) + eps)``.
    """

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.state_width = config.state_width

    def initial_state(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Optimizer state of ``n`` new rows ``[n, state_width]``."""
        return torch.full((n, self.state_width), self.config.adagrad_init, dtype=dtype,
                          device=device)

    def increments(self, grads: torch.Tensor) -> torch.Tensor:
        """State increments ``[n, state_width]`` one step with ``grads`` makes."""
        if self.state_width == 0:
            return grads[:, :0]
        return grads.pow(2).mean(dim=1, keepdim=True)

    def step(
        self,
        values: torch.Tensor,
        state: torch.Tensor,
        index: torch.Tensor,
        grads: torch.Tensor,
        increments: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Update rows ``index`` of ``values`` and ``state`` in place; return the value change.

        The rows are updated where they lie: ``index_add_`` of the state increments and of the
        value change, and one gather of the updated state (Adagrad). These are the additions a
        gather, an update of the gathered rows and a scatter back would make, so the rows come
        out bit for bit the same, at about half the cost: 2.4k rows of 64 (a replica table's
        step here) took 0.61 ms against 1.15 ms.

        Args:
            values: Rows ``[N, dim]`` (a whole table).
            state: Their optimizer state ``[N, state_width]``.
            index: int64 ``[n]`` distinct rows to update.
            grads: Gradients ``[n, dim]`` of those rows.
            increments: State increments to use instead of those of ``grads`` (a gradient that
                sums ``p`` updates made elsewhere grows Adagrad's accumulator as those ``p``
                updates did, not as one update with the sum would).
        """
        c = self.config
        if c.optimizer == "sgd":
            delta = grads * (-c.lr)
        else:
            state.index_add_(0, index, self.increments(grads) if increments is None else increments)
            delta = grads * (-c.lr) / (state.index_select(0, index).sqrt() + c.adagrad_eps)
        values.index_add_(0, index, delta)
        return delta
