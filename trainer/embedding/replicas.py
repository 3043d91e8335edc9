"""Local copies of rows owned elsewhere, under HET's bounded-staleness protocol (per row).

A copy carries what the protocol needs:

* ``stale``: the copy must be replaced by the owner's row at its next read, because it has
  none yet, because the owner said so, or because its row changed owner (the new owner has no
  count of its lag). The owner keeps each copy's lag (updates applied at the owner that the
  copy has not got, see :class:`trainer.embedding.exchange.RowExchange`) and tells the rank when a copy's
  lag passes ``s``; a copy, once stale, stays so until it is refreshed.
* ``filled``: the copy has held a value since it was created (evaluation reads the owner's row
  for the others).
* pending updates: the rank applies its own gradients to the copy at once (it reads its own
  writes) with its copy of the optimizer state, and accumulates the gradients
  (``pending_grad``), the optimizer-state increments they made (``pending_state``, Adagrad's
  ``mean(g**2)`` per update) and their count (``pending``). ``base`` is the copy's value
  without them (the owner's row at the last refresh, plus the updates pushed since): the value
  change they made is ``values - base``, so an update adds to ``values`` only. (Summing the
  changes in a table of their own cost one more scatter of every update; ``base`` changes only
  at pushes and refreshes, a small share of the updates.)

Read rule: a copy is used while its lag is at most ``s``; otherwise the owner's row replaces it
(plus the pending changes: updates not yet pushed stay applied). Write rule: when more than
``s`` updates are pending, the summed gradient and the summed state increments go to the owner,
whose optimizer applies them (for SGD this is HET's "the owner adds deltas"); the copy's lag
does not grow by them, since the owner applies exactly those updates, which the copy already
has.

Why the state increments travel: one Adagrad step on the sum of ``p`` gradients would grow the
accumulator by ``mean((sum g)**2)``, up to ``p**2`` times what ``p`` steps add, and all but
freeze the row; with the increments the owner's accumulator grows as ``p`` steps would. (Adding
the replica's value changes instead would let two ranks each take full-size steps from their
own smaller accumulators: a larger effective learning rate on exactly the hottest rows.)
"""

from __future__ import annotations

import numpy as np
import torch

from partitioner import find_sorted
from trainer.embedding.optimizer import RowOptimizer

__all__ = ["ReplicaTable"]


class ReplicaTable:
    """The replicas one rank holds (a fixed id set, from the placement)."""

    def __init__(
        self,
        ids: np.ndarray,
        dim: int,
        optimizer: RowOptimizer,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        """Create empty copies (stale: filled at their first read) of ``ids``.

        Args:
            ids: Unique int64 ids replicated on this rank.
            dim: Row width.
            optimizer: The row optimizer (the owner's, applied locally for read-your-writes).
            dtype: Float type.
            device: Where copies live.
        """
        self.ids = np.unique(np.asarray(ids, dtype=np.int64))
        n = self.ids.size
        self.device = torch.device(device)
        self.optimizer = optimizer
        zeros = lambda width: torch.zeros((n, width), dtype=dtype, device=self.device)  # noqa: E731
        self.values = zeros(dim)
        self.state = zeros(optimizer.state_width)
        self.pending_grad = zeros(dim)
        self.pending_state = zeros(optimizer.state_width)
        self.base = zeros(dim)
        self.stale = np.ones(n, dtype=bool)
        self.filled = np.zeros(n, dtype=bool)
        self.pending = np.zeros(n, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.ids.size)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id (its position in the sorted ``ids``), -1 for ids not replicated here.

        A binary search: the set is small (a share of the hot rows, a few hundred kB that stay
        in cache) and the step's queries come sorted, which numpy's search exploits; measured
        at 0.19 ms against 0.67 ms for a hash probe, 6.4k queries into 6.2k copies.
        """
        return find_sorted(self.ids, np.asarray(ids, dtype=np.int64))

    def _t(self, slots: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)

    def refresh(self, slots: np.ndarray, values: torch.Tensor, state: torch.Tensor) -> None:
        """Replace copies with the owner's rows, keeping unpushed updates; they are fresh."""
        if slots.size == 0:
            return
        t = self._t(slots)
        pending = self.values.index_select(0, t) - self.base.index_select(0, t)
        self.values.index_copy_(0, t, values + pending)
        self.base.index_copy_(0, t, values)
        self.state.index_copy_(0, t, state + self.pending_state.index_select(0, t))
        self.stale[slots] = False
        self.filled[slots] = True

    def read(self, slots: np.ndarray) -> torch.Tensor:
        """Current values of the copies."""
        return self.values.index_select(0, self._t(slots))

    def update(self, slots: np.ndarray, grads: torch.Tensor,
               increments: torch.Tensor | None = None) -> None:
        """Apply this rank's gradients to its copies and record them as pending.

        Args:
            slots: Distinct copies.
            grads: Their gradients.
            increments: ``optimizer.increments(grads)``, when the caller has them.
        """
        if slots.size == 0:
            return
        t = self._t(slots)
        # index_add_ (slots are distinct) rather than advanced indexing: the same scatters at
        # about half the cost on CPU.
        if increments is None:
            increments = self.optimizer.increments(grads)
        self.optimizer.step(self.values, self.state, t, grads, increments)
        self.pending_grad.index_add_(0, t, grads)
        self.pending_state.index_add_(0, t, increments)
        self.pending[slots] += 1

    def push_with(self, slots: np.ndarray, grads: torch.Tensor,
                  increments: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        """What :meth:`take_push` of ``slots`` will return once :meth:`update` has applied
        ``grads`` (and their ``increments``) to them, computed now, changing nothing: a push
        can then leave before the copies are updated."""
        t = self._t(slots)
        push = torch.cat([self.pending_grad.index_select(0, t) + grads,
                          self.pending_state.index_select(0, t) + increments], dim=1)
        return push, self.pending[slots] + 1

    def take_push(self, slots: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """What the copies pushed now send: ``[k, dim + state_width]`` (summed gradient, then
        summed state increments) and update counts; their pending is reset."""
        t = self._t(slots)
        push = torch.cat([self.pending_grad.index_select(0, t),
                          self.pending_state.index_select(0, t)], dim=1)
        counts = self.pending[slots].copy()
        self.clear_pending(slots)
        return push, counts

    def clear_pending(self, slots: np.ndarray) -> None:
        """Forget the pending updates of ``slots`` (they were pushed: the owner has them, so
        the copy's value without pending updates is its value)."""
        t = self._t(slots)
        self.pending[slots] = 0
        for pending in (self.pending_grad, self.pending_state):
            pending.index_fill_(0, t, 0)
        self.base.index_copy_(0, t, self.values.index_select(0, t))

    def pending_slots(self) -> np.ndarray:
        """Slots with updates not yet pushed."""
        return np.flatnonzero(self.pending > 0)
