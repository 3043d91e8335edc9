"""Pooled bags equal torch.nn.EmbeddingBag (sum, mean, weighted sum) on the same rows, values and
gradients, empty bags and bags of one included."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetgmp.trainer.model.pooling import pool_bags

V, R = 50, 6


def _case(seed: int, batch: int = 9, fields: int = 4, max_len: int = 5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (batch, fields), generator=g)
    lengths[0, 0], lengths[1, :] = 0, 1  # an empty bag; a sample of one-value fields
    ids = torch.randint(0, V, (int(lengths.sum()),), generator=g)
    weights = torch.rand(ids.shape[0], generator=g, dtype=torch.float64)
    table = torch.randn(V, R, generator=g, dtype=torch.float64)
    return lengths, ids, weights, table


def _bags(table: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor, field: int,
          mode: str, weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """EmbeddingBag's pooling of one field's bags, and the gradient of its table."""
    batch, fields = lengths.shape
    # The field's ids in bag order: pick them out of the sample-major layout.
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.reshape(-1).cumsum(0)[:-1]])
    pick = torch.cat([torch.arange(int(starts[b * fields + field]),
                                   int(starts[b * fields + field] + lengths[b, field]))
                      for b in range(batch)])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[:, field].cumsum(0)[:-1]])
    bag = nn.EmbeddingBag(V, R, mode=mode, dtype=torch.float64)
    with torch.no_grad():
        bag.weight.copy_(table)
    out = bag(ids[pick], offsets, per_sample_weights=None if weights is None else weights[pick])
    return out, bag.weight


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", ["sum", "mean", "weighted sum", "mixed", "weighted mixed"])
@pytest.mark.parametrize("rows", ["gathered", "distinct", "distinct, sorted by the caller"])
def test_pooling_equals_embedding_bag_in_values_and_gradients(seed: int, kind: str,
                                                              rows: str) -> None:
    # The rows as the trainer had them before (each value's row gathered, [nnz, R]) and as
    # it hands them now: the table's rows once each, with the index of each value's row (and
    # the deduplication's sort of it, which the backward reads).
    lengths, ids, weights, table = _case(seed)
    fields = lengths.shape[1]
    modes = {"sum": ["sum"] * fields, "mean": ["mean"] * fields,
             "weighted sum": ["sum"] * fields, "mixed": ["sum", "mean", "mean", "sum"],
             "weighted mixed": ["sum", "mean", "mean", "sum"]}[kind]
    w = weights if kind.startswith("weighted") else None
    leaf = table.clone().requires_grad_(True)
    mean = torch.tensor([m == "mean" for m in modes])
    if rows == "gathered":
        got = pool_bags(leaf[ids], lengths, w, mean)
    else:
        rank, order = torch.sort(ids, stable=True)
        by_row = (order, rank) if rows.endswith("caller") else None
        got = pool_bags(leaf, lengths, w, mean, ids, by_row=by_row)
    probe = torch.randn(got.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (got * probe).sum().backward()
    grad = torch.zeros_like(table)
    for f, mode in enumerate(modes):
        # EmbeddingBag's mean ignores weights: a weighted mean is the weighted sum over the
        # bag's length, as pool_bags documents.
        want, weight = _bags(table, ids, lengths, f, "sum" if w is not None else mode, w)
        if w is not None and mode == "mean":
            want = want / lengths[:, f].clamp(min=1).unsqueeze(1)
        assert torch.allclose(got[:, f].detach(), want, rtol=1e-12, atol=1e-12), (f, mode)
        (want * probe[:, f]).sum().backward()
        grad += weight.grad
    assert torch.allclose(leaf.grad, grad, rtol=1e-12, atol=1e-12)
    assert torch.equal(got[0, 0].detach(), torch.zeros(R, dtype=torch.float64))  # empty bag


def test_bags_of_one_leave_each_row_as_it_is() -> None:
    rows = torch.randn(12, R, dtype=torch.float64)
    lengths = torch.ones(4, 3, dtype=torch.long)
    for mean in (None, torch.tensor([True, False, True])):
        assert torch.equal(pool_bags(rows, lengths, mean=mean), rows.reshape(4, 3, R))
