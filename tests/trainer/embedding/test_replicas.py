"""The replica copy's bookkeeping (HET's read and write rules act on these fields)."""

from __future__ import annotations

import numpy as np
import torch

from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.embedding.optimizer import RowOptimizer
from hetgmp.trainer.embedding.replicas import ReplicaTable


def _table() -> ReplicaTable:
    opt = RowOptimizer(StoreConfig(optimizer="adagrad", lr=0.1))
    return ReplicaTable(np.array([30, 10, 20], dtype=np.int64), 2, opt, dtype=torch.float64)


def test_copies_start_stale_and_refresh_sets_value_and_state() -> None:
    t = _table()
    slots = t.slots(np.array([10, 20, 99], dtype=np.int64))
    assert slots[2] == -1 and bool(t.stale.all())
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    t.refresh(slots[:2], rows, torch.ones(2, 1, dtype=torch.float64))
    assert torch.equal(t.read(slots[:2]), rows) and torch.equal(t.state[slots[:2]],
                                                                 torch.ones(2, 1, dtype=torch.float64))
    assert not t.stale[slots[:2]].any() and t.stale[t.slots(np.array([30]))[0]]
    # Tensor ids are looked up on the device, with the same answer.
    assert t.slots(torch.tensor([10, 20, 99])).tolist() == slots.tolist()


def test_local_updates_are_read_back_survive_a_refresh_and_push_once() -> None:
    t = _table()
    s = t.slots(np.array([10], dtype=np.int64))
    zero = torch.zeros(1, 2, dtype=torch.float64)
    t.refresh(s, zero, torch.zeros(1, 1, dtype=torch.float64))
    g = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    t.update(s, g)
    t.update(s, g)
    mine = t.read(s).clone()
    assert mine[0, 0] < 0 < mine[0, 1] and t.pending[s[0]] == 2  # reads its own writes
    # The owner moved on (someone else's update): the refresh keeps the unpushed changes.
    owner_row = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    t.refresh(s, owner_row, torch.full((1, 1), 0.25, dtype=torch.float64))
    assert torch.allclose(t.read(s), owner_row + mine)
    assert float(t.state[s[0], 0]) == 0.25 + 2.0  # owner's accumulator + two local mean(g^2)
    push, counts = t.take_push(s)
    assert counts.tolist() == [2] and t.pending[s[0]] == 0
    assert torch.equal(push, torch.tensor([[2.0, -2.0, 2.0]], dtype=torch.float64))
    assert t.pending_slots().numel() == 0


def test_a_push_computed_before_the_update_is_what_take_push_gives_after_it() -> None:
    # The row exchange sends pushes before it updates the copies (the update runs while they
    # travel): push_with must give the bits take_push gives once the update is applied, and
    # change nothing.
    gen = torch.Generator().manual_seed(3)
    before, after = _table(), _table()
    slots = np.array([0, 2], dtype=np.int64)
    for t in (before, after):
        t.update(slots, torch.randn(2, 2, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64))
    grads = torch.randn(2, 2, generator=gen, dtype=torch.float64)
    increments = before.optimizer.increments(grads)
    fields = ("values", "state", "pending_grad", "pending_state", "base")
    kept = {name: getattr(before, name).clone() for name in fields}
    pending = before.pending.clone()
    push, counts = before.push_with(slots, grads, increments)
    assert torch.equal(before.pending, pending)  # nothing changed yet
    assert all(torch.equal(getattr(before, name), kept[name]) for name in fields)
    after.update(slots, grads)
    expected, expected_counts = after.take_push(slots)
    assert torch.equal(push, expected) and torch.equal(counts, expected_counts)
    assert counts.tolist() == [2, 2]
    before.update(slots, grads, increments)
    before.clear_pending(slots)
    assert torch.equal(before.values, after.values) and torch.equal(before.state, after.state)
    assert not before.pending.any() and not after.pending.any()


def test_a_refresh_after_a_push_adds_nothing_and_one_before_adds_only_what_is_pending() -> None:
    t = _table()
    s = t.slots(np.array([20], dtype=np.int64))
    t.refresh(s, torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64))
    g = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    t.update(s, g)
    t.take_push(s)  # the owner has that update now
    after_push = t.read(s).clone()
    t.update(s, g)
    pending_change = t.read(s) - after_push
    owner = torch.tensor([[5.0, -5.0]], dtype=torch.float64)
    t.refresh(s, owner, torch.ones(1, 1, dtype=torch.float64))
    assert torch.allclose(t.read(s), owner + pending_change, rtol=0, atol=1e-12)
    t.take_push(s)
    t.refresh(s, owner, torch.ones(1, 1, dtype=torch.float64))
    assert torch.equal(t.read(s), owner)
