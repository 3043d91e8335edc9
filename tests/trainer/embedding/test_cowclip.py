"""CowClip in the row optimizer, one piece at a time: the clip against the paper's formula written
out one id at a time, what a replica's accumulated push means to the owner's clip (s > 0), the
count column of a copy's pushes, and the batch scaling rule (``trainer.step.scaled``).

That s = 0 training with the clip on N ranks equals one process is
``tests/trainer/dist/test_cowclip_threads.py``'s."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.embedding.optimizer import RowOptimizer
from hetgmp.trainer.embedding.replicas import ReplicaTable
from hetgmp.trainer.model import DenseOptimizer
from hetgmp.trainer.step import TrainConfig, scaled

F64 = torch.float64


def _reference(rows: np.ndarray, acc: np.ndarray, index: list[int], grads: np.ndarray,
               counts: list[float], c: StoreConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """The paper's clip and the row optimizer, one id at a time in plain float64 arithmetic:
    the rows and accumulators after the step, and how many gradients were clipped."""
    rows, acc, clipped = rows.copy(), acc.copy(), 0
    for k, i in enumerate(index):
        g = [float(x) for x in grads[k]]
        w_norm = math.sqrt(sum(float(x) ** 2 for x in rows[i]))
        g_norm = math.sqrt(sum(x * x for x in g))
        threshold = counts[k] * max(c.clip_ratio * w_norm, c.clip_min)
        if g_norm > threshold:
            g = [x * threshold / g_norm for x in g]
            clipped += 1
        if c.optimizer == "sgd":
            rows[i] = [w - c.lr * x for w, x in zip(rows[i], g)]
        else:
            acc[i, 0] += sum(x * x for x in g) / len(g)
            rows[i] = [w - c.lr * x / (math.sqrt(acc[i, 0]) + c.adagrad_eps)
                       for w, x in zip(rows[i], g)]
    return rows, acc, clipped


@pytest.mark.parametrize("kind", ["adagrad", "sgd"])
def test_the_clip_is_the_papers_formula_written_out_one_id_at_a_time(kind: str) -> None:
    rng = np.random.default_rng(1)
    c = StoreConfig(optimizer=kind, lr=0.3, clip="cowclip", clip_ratio=0.5, clip_min=0.05,  # type: ignore[arg-type]
                    adagrad_init=0.1)
    opt = RowOptimizer(c)
    n, dim = 16, 5
    rows = rng.normal(0.0, 0.2, (n, dim))
    rows[3] = 1e-4  # a row near zero: the lower bound zeta sets its threshold
    acc = np.full((n, 1), 0.1)
    index = [9, 3, 0, 14, 5, 7, 11, 2]
    counts = [1.0, 2.0, 7.0, 1.0, 30.0, 3.0, 1.0, 4.0]  # ids that occur many times in a batch
    grads = rng.normal(0.0, 0.3, (len(index), dim)) * rng.choice([0.01, 1.0, 10.0], len(index))[:,
                                                                                             None]
    grads[6] = 0.0  # a zero gradient stays zero (no division by its norm)
    want_rows, want_acc, clipped = _reference(rows, acc, index, grads, counts, c)
    assert 2 <= clipped <= len(index) - 2  # both sides of the threshold are exercised

    values, state = torch.tensor(rows), torch.tensor(acc if kind == "adagrad" else acc[:, :0])
    with_counts = torch.cat([torch.tensor(grads), torch.tensor(counts, dtype=F64)[:, None]], 1)
    opt.step(values, state, torch.tensor(index), with_counts)
    np.testing.assert_allclose(values.numpy(), want_rows, rtol=1e-12, atol=1e-15)
    if kind == "adagrad":
        np.testing.assert_allclose(state.numpy(), want_acc, rtol=1e-12)
        # Increments handed in (a push's) are scaled by the factor squared, as the gradient is.
        values2, state2 = torch.tensor(rows), torch.tensor(acc)
        raw = opt.increments(with_counts)
        np.testing.assert_allclose(raw.numpy()[:, 0], (grads ** 2).mean(axis=1), rtol=1e-14)
        opt.step(values2, state2, torch.tensor(index), with_counts, raw)
        assert torch.equal(values2, values) and torch.equal(state2, state)


def test_a_push_that_no_single_update_would_have_clipped_passes_whole() -> None:
    # s > 0: a copy pushes the sum of its p updates' gradients and counts; the owner clips the
    # sum against (sum of counts) x max(r |w|, zeta). When every update was within its own
    # bound at the owner's norm, so is the sum (triangle inequality): the owner applies what
    # the copy applied, exactly as without a clip.
    rng = np.random.default_rng(2)
    c = StoreConfig(optimizer="adagrad", lr=0.1, clip="cowclip", clip_ratio=0.5, clip_min=0.01)
    off = RowOptimizer(replace(c, clip="none"))
    w = torch.tensor(rng.normal(0, 0.3, (1, 4)))
    bound = max(0.5 * float(w.norm()), 0.01)
    counts = [2.0, 1.0, 5.0]
    steps = [torch.tensor(rng.normal(0, 1, (1, 4))) for _ in counts]
    steps = [g / g.norm() * 0.9 * bound * n for g, n in zip(steps, counts)]  # each within
    summed = torch.stack(steps).sum(0)
    inc = torch.stack([off.increments(g) for g in steps]).sum(0)
    pushed = torch.cat([summed, torch.tensor([[sum(counts)]], dtype=F64)], 1)
    a_rows, a_state = w.clone(), torch.zeros(1, 1, dtype=F64)
    RowOptimizer(c).step(a_rows, a_state, torch.tensor([0]), pushed, inc)
    b_rows, b_state = w.clone(), torch.zeros(1, 1, dtype=F64)
    off.step(b_rows, b_state, torch.tensor([0]), summed, inc)
    assert torch.equal(a_rows, b_rows) and torch.equal(a_state, b_state)
    # One update far past its bound: the sum is clipped once, onto the budget of its counts.
    steps[1] = steps[1] * 100
    summed = torch.stack(steps).sum(0)
    sgd = RowOptimizer(replace(c, optimizer="sgd"))
    rows = w.clone()
    pushed = torch.cat([summed, torch.tensor([[sum(counts)]], dtype=F64)], 1)
    delta = sgd.step(rows, torch.zeros(1, 0, dtype=F64), torch.tensor([0]), pushed)
    assert float(delta.norm()) == pytest.approx(0.1 * sum(counts) * bound, rel=1e-12)
    cos = float((delta * -summed).sum() / (delta.norm() * summed.norm()))
    assert cos == pytest.approx(1.0, abs=1e-12)  # the sum's direction, shortened


def test_a_copy_clips_its_own_update_and_pushes_its_summed_counts() -> None:
    c = StoreConfig(optimizer="adagrad", lr=0.1, clip="cowclip", clip_ratio=0.1, clip_min=0.0)
    opt = RowOptimizer(c)
    table = ReplicaTable(np.array([7], dtype=np.int64), 2, opt, dtype=F64)
    slot = table.slots(np.array([7], dtype=np.int64))
    start = torch.tensor([[0.6, 0.8]], dtype=F64)  # norm 1: the threshold is 0.1 x count
    table.refresh(slot, start, torch.zeros(1, 1, dtype=F64))
    alone_rows, alone_state = start.clone(), torch.zeros(1, 1, dtype=F64)
    for grad, count in (([3.0, 0.0], 2.0), ([0.0, 0.05], 1.0), ([0.0, -4.0], 3.0)):
        g = torch.tensor([[*grad, count]], dtype=F64)
        table.update(slot, g)
        opt.step(alone_rows, alone_state, torch.tensor([0]), g)  # an owner's step alike
    assert torch.equal(table.read(slot), alone_rows)  # its own view: the owner's rule
    push, updates = table.take_push(slot)
    # Raw gradients, their counts (2 + 1 + 3) and the raw increments: the owner clips the sum.
    assert updates.tolist() == [3]
    np.testing.assert_allclose(push.numpy(), [[3.0, -3.95, 6.0, 4.5 + 0.00125 + 8.0]])


def test_increments_and_steps_without_the_clip_take_rows_as_they_are() -> None:
    opt = RowOptimizer(StoreConfig(optimizer="adagrad", lr=0.1))
    assert opt.count_width == 0
    g = torch.tensor([[1.0, 3.0]], dtype=F64)
    assert opt.increments(g).tolist() == [[5.0]]
    with_l2 = RowOptimizer(StoreConfig(l2=0.5)).gradients(
        g, torch.tensor([[2.0, 4.0]], dtype=F64), torch.tensor([3]), 6)
    assert with_l2.tolist() == [[1.5, 4.0]]  # + lambda x count / batch x row
    clipping = RowOptimizer(StoreConfig(clip="cowclip"))
    assert clipping.gradients(g, g, torch.tensor([4]), 8).tolist() == [[1.0, 3.0, 4.0]]


# -- the batch scaling rule -------------------------------------------------------------------


def test_cowclip_scales_l2_linearly_and_the_dense_rate_by_the_root() -> None:
    store = StoreConfig(lr=0.02, l2=1e-4)
    train = TrainConfig(global_batch=65_536, base_batch=1024, dense_lr=1e-3,
                        batch_scaling="cowclip", scaling_warmup=500_000)
    s = scaled(train, store)
    assert s.k == 64 and s.store.lr == 0.02 and s.store.l2 == pytest.approx(64e-4)
    assert s.train.dense_lr == pytest.approx(8e-3) and s.store.clip == "cowclip"
    assert s.warmup_steps == 8  # ceil(500,000 / 65,536)
    assert s.row_lr_factor(0) == 1.0  # the embedding rate is not warmed up
    record = s.record()
    assert record["rule"] == "cowclip" and record["given"]["dense_lr"] == 1e-3
    assert "embedding L2 0.0001 -> 0.0064" in s.describe()
    # An explicit --store-clip none keeps the clip off under the rule.
    assert scaled(train, replace(store, clip="none")).store.clip == "none"


@pytest.mark.parametrize(("rule", "factor"), [("sqrt", 8.0), ("linear", 64.0)])
def test_the_vision_rules_scale_every_rate_and_warm_both_up(rule: str, factor: float) -> None:
    train = TrainConfig(global_batch=65_536, batch_scaling=rule,  # type: ignore[arg-type]
                        scaling_warmup=4 * 65_536)
    s = scaled(train, StoreConfig(lr=0.02, l2=1e-4))
    assert s.store.lr == pytest.approx(0.02 * factor)
    assert s.train.dense_lr == pytest.approx(1e-3 * factor)
    assert s.store.l2 == 1e-4 and s.store.clip == "none" and s.warmup_steps == 4
    assert [s.row_lr_factor(t) for t in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("rule", ["none", "cowclip", "sqrt", "linear"])
def test_at_the_base_batch_every_rule_keeps_the_given_values(rule: str) -> None:
    store = StoreConfig(lr=0.03, l2=2e-4)
    s = scaled(TrainConfig(global_batch=1024, batch_scaling=rule), store)  # type: ignore[arg-type]
    assert (s.store.lr, s.store.l2, s.train.dense_lr, s.warmup_steps) == (0.03, 2e-4, 1e-3, 0)
    assert s.store.clips == (rule == "cowclip")
    # none: as given ("auto" settled to no clip).
    assert scaled(TrainConfig(global_batch=8192), store).store == replace(store, clip="none")


def test_the_dense_rate_rises_linearly_over_the_warmup() -> None:
    params = torch.zeros(3, dtype=F64)
    opt = DenseOptimizer("sgd", 0.4, params, warmup_steps=4)
    rates = []
    for _ in range(6):
        opt.step(params, torch.ones(3, dtype=F64))
        rates.append(opt.lr)
    assert rates == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert float(params[0]) == pytest.approx(-(0.1 + 0.2 + 0.3 + 0.4 * 3))
