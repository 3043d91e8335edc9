"""The list shapes' ceilings, beside the train benchmark's runs (``hetgmp bench train --shape``).

* ``model_alone``: the same model trained on the same records in plain PyTorch, one process,
  one thread: every id renumbered into one ``torch.nn.EmbeddingBag`` table before the clock
  starts (a placed store looks ids up; this does not), sparse gradients, ``torch.optim.Adagrad``
  on the table and the trainer's dense optimizer (Adam) on the rest. No dedup, no exchange, no
  optimizer state per row kept apart: the ceiling a placed store can approach on one core.
* ``dense_only``: the model alone on inputs pooled before the clock (no embedding work at all:
  forward, backward to the dense parameters and to the pooled inputs, whose gradient any
  system that learns rows computes, and the dense optimizer): a bound nothing can pass.
* ``pooling``: the pooling alone on a step's rows, forward and backward, values pooled a second:
  :func:`hetgmp.trainer.model.pool_bags` (the fused bag kernel both ways, fed the deduplication's sort)
  against ``torch.nn.functional.embedding_bag`` with autograd's own backward, on the same
  distinct rows and index.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hetgmp.streaming import ClickBatch
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.embedding import StoreConfig, unique_padded
from hetgmp.trainer.model import Bags, Features, ModelConfig, build_model, pool_bags
from hetgmp.trainer.sources import SyntheticSpec, open_source
from hetgmp.trainer.step import TrainConfig

__all__ = ["LIST_SHAPES", "model_alone", "pooling"]

#: The shapes whose records carry lists (the ones these rows are for).
LIST_SHAPES = ("multi_hot", "user_history")


def _batches(syn: SyntheticConfig, start: int, records: int, batch: int) -> list[ClickBatch]:
    source = open_source(SyntheticSpec(syn, start, records), batch, 0, 1)
    out = []
    while not source.exhausted:
        b = source.next_batch()
        if len(b):
            out.append(b)
    return out


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    flat = torch.from_numpy(lengths.reshape(-1).astype(np.int64))
    out = torch.zeros(flat.numel() + 1, dtype=torch.int64)
    torch.cumsum(flat, 0, out=out[1:])
    return out


def model_alone(syn: SyntheticConfig, model: ModelConfig, store: StoreConfig,
                train: TrainConfig, start: int, records: int) -> list[dict[str, Any]]:
    """The ``model_alone`` and ``dense_only`` rows on records ``start ..`` (see the module)."""
    batches = _batches(syn, start, records, train.global_batch)
    schema = syn.schema
    bags = Bags.of(schema)
    mean = torch.tensor(bags.mean) if bags.mean else None
    # Renumbered before the clock: a table of exactly the ids the records use.
    ids, inverse = np.unique(np.concatenate([b.values for b in batches]), return_inverse=True)
    inputs, at = [], 0
    for b in batches:
        n = b.values.size
        weights = None if b.weights is None else torch.from_numpy(b.weights)
        inputs.append((torch.from_numpy(inverse[at:at + n].astype(np.int64)),
                       _offsets(b.lengths), weights, torch.from_numpy(b.dense),
                       torch.from_numpy(b.labels), b.lengths.shape))
        at += n
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # torch.optim.Adagrad on sparse gradients warns once that it skips their checks.
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    try:
        gen = torch.Generator().manual_seed(model.seed)
        table = torch.nn.EmbeddingBag(ids.size, model.row_dim, mode="sum", sparse=True,
                                      include_last_offset=True)
        with torch.no_grad():
            table.weight.normal_(0.0, store.init_scale, generator=gen)

        def pool(index: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None,
                 shape: tuple[int, ...]) -> torch.Tensor:
            pooled = table(index, offsets, per_sample_weights=weights).view(*shape, -1)
            if mean is None:
                return pooled
            counts = offsets.diff().reshape(shape).clamp(min=1)
            return pooled * torch.where(mean, 1.0 / counts, 1.0).unsqueeze(-1).to(pooled.dtype)

        out = []
        for config in ("model_alone", "dense_only"):
            net = build_model(model, len(schema.sparse), len(schema.dense))
            names = tuple(schema.sparse)
            dense_opt = torch.optim.Adam(net.parameters(), lr=train.dense_lr)
            sparse_opt = torch.optim.Adagrad(table.parameters(), lr=store.lr)
            if config == "dense_only":  # leaves that want a gradient, as rows do
                with torch.no_grad():
                    given = [pool(i, o, w, shape).requires_grad_(True)
                             for i, o, w, _, _, shape in inputs]
            began = time.perf_counter()
            for k, (index, offsets, weights, dense, labels, shape) in enumerate(inputs):
                pooled = given[k] if config == "dense_only" else \
                    pool(index, offsets, weights, shape)
                logits = net(Features(names, pooled, dense))
                loss = F.binary_cross_entropy_with_logits(logits, labels)
                sparse_opt.zero_grad()
                dense_opt.zero_grad()
                loss.backward()
                if config == "model_alone":
                    sparse_opt.step()
                dense_opt.step()
            seconds = time.perf_counter() - began
            samples = sum(int(i[4].numel()) for i in inputs)
            values = sum(int(i[0].numel()) for i in inputs)
            out.append({"config": config, "shape": syn.shape,
                        "samples_per_s": round(samples / seconds, 1),
                        "rows_per_s": round(values / seconds, 1), "seconds": round(seconds, 2),
                        "steps": len(inputs), "ids_per_sample": round(values / samples, 2)})
    finally:
        torch.set_num_threads(threads)
    return out


def pooling(syn: SyntheticConfig, model: ModelConfig, train: TrainConfig, start: int,
            steps: int = 4) -> dict[str, Any]:
    """The ``pooling`` row: values pooled a second, forward and backward, ours and
    ``F.embedding_bag``'s with autograd's backward, on ``steps`` batches' distinct rows."""
    batches = _batches(syn, start, steps * train.global_batch, train.global_batch)
    mean = Bags.of(syn.schema).mean
    mean_t = torch.tensor(mean) if mean else None
    seconds = {"ours": 0.0, "embedding_bag": 0.0}
    values = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for b in batches:
            ids = torch.from_numpy(b.values)
            u = unique_padded(ids)
            n = int(u.n)
            rows = torch.randn(n, model.row_dim)
            lengths = torch.from_numpy(b.lengths.astype(np.int64))
            weights = None if b.weights is None else torch.from_numpy(b.weights)
            probe = torch.randn(len(b), lengths.shape[1], model.row_dim)
            values += ids.numel()
            for name in seconds:
                leaf = rows.clone().requires_grad_(True)
                began = time.perf_counter()
                if name == "ours":
                    out = pool_bags(leaf, lengths, weights, mean_t, u.inverse,
                                    by_row=(u.order, u.rank))
                else:
                    bag = F.embedding_bag(u.inverse, leaf, _offsets(b.lengths), mode="sum",
                                          per_sample_weights=weights, include_last_offset=True)
                    out = bag.view(*lengths.shape, -1)
                    if mean_t is not None:
                        scale = torch.where(mean_t, 1.0 / lengths.clamp(min=1), 1.0)
                        out = out * scale.unsqueeze(-1)
                (out * probe).sum().backward()
                seconds[name] += time.perf_counter() - began
    finally:
        torch.set_num_threads(threads)
    ours, stock = (values / seconds[k] for k in ("ours", "embedding_bag"))
    return {"config": "pooling", "shape": syn.shape, "rows_per_s": round(ours, 1),
            "rows_per_s_embedding_bag": round(stock, 1),
            "speed_over_embedding_bag": round(ours / stock, 3), "values": values}
