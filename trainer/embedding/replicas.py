"""Local copies of rows owned elsewhere, under HET's bounded-staleness protocol (per row).

A copy carries what the protocol needs:

* ``stale``: the copy must be replaced by the owner's row at its next read, because it has
  none yet, because the owner said so, or because its row changed owner (the new owner has no
  count of its lag). The owner keeps each copy's lag (updates applied at the owner that the
  copy has not got, see :class:`hetgmp.trainer.embedding.exchange.RowExchange`) and tells the
  rank when a copy's lag passes ``s``; a copy, once stale, stays so until it is refreshed.
* ``filled``: the copy has held a value since it was created (evaluation reads the owner's row
  for the others).
* pending updates: the rank applies its own gradients to the copy at once (it reads its own
  writes) with its copy of the optimizer state, and accumulates the gradients
  (``pending_grad``; with CowClip its last column sums their occurrences, the counts the
  owner's clip of the push needs), the optimizer-state increments they made
  (``pending_state``, Adagrad's ``mean(g**2)`` per update, before a clip) and their count
  (``pending``). The copy's own update is clipped with its norm and its local count.
  ``base`` is the copy's value without them (the owner's row at the last refresh, plus the
  updates pushed since): the value change they made is ``values - base``, so an update adds
  to ``values`` only. (Summing the changes in a table of their own cost one more scatter of
  every update; ``base`` changes only at pushes and refreshes, a small share of the updates.)

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

from hetgmp.partitioner import find_sorted
from hetgmp.trainer.embedding.optimizer import RowOptimizer

__all__ = ["ReplicaTable"]

Slots = torch.Tensor | np.ndarray


class ReplicaTable:
    """The replicas one rank holds (a fixed id set, from the placement), everything in tensors
    on the rank's device: a step reads and writes them without the host."""

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
        self.host_ids = np.unique(np.asarray(ids, dtype=np.int64))
        n = self.host_ids.size
        self.device = dev = torch.device(device)
        self.ids = torch.from_numpy(self.host_ids).to(dev)
        self.optimizer = optimizer
        zeros = lambda width: torch.zeros((n, width), dtype=dtype, device=dev)  # noqa: E731
        self.values = zeros(dim)
        self.state = zeros(optimizer.state_width)
        self.pending_grad = zeros(dim + optimizer.count_width)  # CowClip: and the counts
        self.pending_state = zeros(optimizer.state_width)
        self.base = zeros(dim)
        self.stale = torch.ones(n, dtype=torch.bool, device=dev)
        self.filled = torch.zeros(n, dtype=torch.bool, device=dev)
        self.pending = torch.zeros(n, dtype=torch.int64, device=dev)

    def __len__(self) -> int:
        return int(self.host_ids.size)

    def slots(self, ids: Slots) -> Slots:
        """Slot of each id (its position in the sorted ids), -1 for ids not replicated here;
        numpy for numpy ids (a binary search on the host copy of the ids), a tensor for a
        tensor (on the device, waiting for nothing)."""
        if isinstance(ids, np.ndarray):
            return find_sorted(self.host_ids, np.asarray(ids, dtype=np.int64))
        if self.ids.numel() == 0:
            return torch.full_like(ids, -1)
        pos = torch.searchsorted(self.ids, ids).clamp_(max=self.ids.numel() - 1)
        return torch.where(self.ids[pos] == ids, pos, -1)

    def _t(self, slots: Slots) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):
            return slots
        return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.device)

    def refresh(self, slots: Slots, values: torch.Tensor, state: torch.Tensor) -> None:
        """Replace copies with the owner's rows, keeping unpushed updates; they are fresh."""
        t = self._t(slots)
        if t.numel() == 0:
            return
        pending = self.values.index_select(0, t) - self.base.index_select(0, t)
        self.values.index_copy_(0, t, values + pending)
        self.base.index_copy_(0, t, values)
        self.state.index_copy_(0, t, state + self.pending_state.index_select(0, t))
        self.stale[t] = False
        self.filled[t] = True

    def read(self, slots: Slots) -> torch.Tensor:
        """Current values of the copies."""
        return self.values.index_select(0, self._t(slots))

    def update(self, slots: Slots, grads: torch.Tensor,
               increments: torch.Tensor | None = None) -> None:
        """Apply this rank's gradients to its copies and record them as pending.

        Args:
            slots: Distinct copies.
            grads: Their gradients.
            increments: ``optimizer.increments(grads)``, when the caller has them.
        """
        t = self._t(slots)
        if t.numel() == 0:
            return
        # index_add_ (slots are distinct) rather than advanced indexing: the same scatters at
        # about half the cost on CPU.
        if increments is None:
            increments = self.optimizer.increments(grads)
        self.optimizer.step(self.values, self.state, t, grads, increments)
        self.pending_grad.index_add_(0, t, grads)
        self.pending_state.index_add_(0, t, increments)
        self.pending.index_add_(0, t, torch.ones_like(t))

    def push_with(self, slots: Slots, grads: torch.Tensor,
                  increments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What :meth:`take_push` of ``slots`` will return once :meth:`update` has applied
        ``grads`` (and their ``increments``) to them, computed now, changing nothing: a push
        can then leave before the copies are updated."""
        t = self._t(slots)
        push = torch.cat([self.pending_grad.index_select(0, t) + grads,
                          self.pending_state.index_select(0, t) + increments], dim=1)
        return push, self.pending.index_select(0, t) + 1

    def take_push(self, slots: Slots) -> tuple[torch.Tensor, torch.Tensor]:
        """What the copies pushed now send: ``[k, dim + count_width + state_width]``
        (summed gradient, with CowClip summed counts, then summed state increments) and
        update counts; their pending is reset."""
        t = self._t(slots)
        push = torch.cat([self.pending_grad.index_select(0, t),
                          self.pending_state.index_select(0, t)], dim=1)
        counts = self.pending.index_select(0, t)
        self.clear_pending(t)
        return push, counts

    def clear_pending(self, slots: Slots) -> None:
        """Forget the pending updates of ``slots`` (they were pushed: the owner has them, so
        the copy's value without pending updates is its value)."""
        t = self._t(slots)
        self.pending.index_fill_(0, t, 0)
        for pending in (self.pending_grad, self.pending_state):
            pending.index_fill_(0, t, 0)
        self.base.index_copy_(0, t, self.values.index_select(0, t))

    def pending_slots(self) -> torch.Tensor:
        """Slots with updates not yet pushed (between steps: the count is read back)."""
        return torch.nonzero(self.pending > 0).reshape(-1)

    def keep(self, old: ReplicaTable) -> None:
        """Take over, for the ids both tables hold, ``old``'s copies: values, optimizer state,
        flags (every pending update must have been pushed)."""
        at_old = old.slots(self.host_ids)
        kept = np.flatnonzero(at_old >= 0)
        if not kept.size:
            return
        src, dst = self._t(at_old[kept]), self._t(kept)
        for name in ("values", "base", "state", "stale", "filled"):
            getattr(self, name)[dst] = getattr(old, name)[src]
