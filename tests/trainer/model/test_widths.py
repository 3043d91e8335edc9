"""Tables of several widths (issue 56): rows cut in blocks of one width, a batch expanded to a
column of ids a block, pooled column by column and joined, give each field its table's row
pooled; the schema refuses a table of two widths; a model that needs one width says so."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch

from hetgmp.streaming import ClickBatch, Schema, SchemaError
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.types import DenseField, SparseField
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.model import (
    Bags,
    ModelConfig,
    ModelError,
    ModelSpec,
    Widths,
    batch_features,
    block_ids,
    build_model,
)
from hetgmp.trainer.online.checkpointer import check_compatible

# Four fields: a pooled one of width 8 with a first-order weight, a mean-pooled one of 16, a
# sequence of 16 (the same table), a pooled one of 4: blocks of 4, stored 5 wide.
NAMES = ("user", "item", "history", "city")
TABLES = ("user", "items", "items", "city")
TABLE = (0, 1, 1, 2)
DIMS = (8, 16, 16, 4)
FIRST = (True, False, False, False)
BAGS = Bags(mean=(False, True, False, False), jagged=True, weighted=True, names=NAMES,
            sequence=(False, False, True, False), max_len=(1, 3, 4, 2), tables=TABLES,
            dims=DIMS, first_order=FIRST)


def _batch(rng: np.random.Generator, n: int) -> ClickBatch:
    lengths = np.stack([np.ones(n), rng.integers(0, 4, n), rng.integers(0, 5, n),
                        rng.integers(0, 3, n)], axis=1).astype(np.int32)
    nnz = int(lengths.sum())
    # Few ids a table, so that values repeat; a table's ids apart from another's, as hashing
    # the table with the value makes them.
    table = np.repeat(np.tile([0, 1, 1, 2], n), lengths.ravel())
    values = (table * 1000 + rng.integers(0, 40, nnz)).astype(np.int64)
    minus = np.full(n, -1, np.int64)
    return ClickBatch(rng.integers(0, 2, n).astype(np.float32), np.zeros((n, 2), np.float32),
                      values, lengths, minus.astype(np.int32), minus, minus,
                      weights=rng.uniform(0.5, 2.0, nnz).astype(np.float32))


@pytest.mark.parametrize("first", [FIRST, (False,) * 4], ids=["a first-order weight", "none"])
def test_blocks_pooled_and_joined_are_each_fields_rows_pooled(first: tuple[bool, ...]) -> None:
    # Without a first-order column, a field's blocks are joined as a view of the pooled
    # columns; with one, cut and concatenated.
    rng = np.random.default_rng(3)
    bags = dataclasses.replace(BAGS, first_order=first)
    widths = bags.widths(ModelConfig(model="user_models:build"), 4)
    assert (widths.unit, widths.blocks) == (4, (2, 4, 4, 1))
    assert widths.row_dim == 4 + any(first)
    batch = _batch(rng, 50)
    # Each (field's table, value) has a row [w, v_1..v_D]; block j of it is stored under
    # block_ids(value, j) as [w if j == 0 else noise, v_(4j+1)..v_(4j+4)] (without the first
    # column when no table has a first-order weight).
    full = {(t, v): torch.randn(DIMS[f] + 1, dtype=torch.float64)
            for f, t in enumerate(TABLES) for v in range(TABLE[f] * 1000, TABLE[f] * 1000 + 40)}
    expanded = widths.expand(batch)
    assert expanded.fields == widths.columns == 11
    store: dict[int, torch.Tensor] = {}
    at = 0
    for b in range(len(batch)):
        for c in range(widths.columns):
            f, j = int(widths.column_field[c]), int(widths.column_block[c])
            for _ in range(int(expanded.lengths[b, c])):
                base = int(batch.values[_position(batch, b, f, at, expanded, c)])
                key = int(expanded.values[at])
                assert key == (base if j == 0 else int(block_ids(np.array([base]), j)[0]))
                row = full[(TABLES[f], base)]
                head = row[:1] if j == 0 else torch.randn(1, dtype=torch.float64)
                block = row[1 + 4 * j:5 + 4 * j]
                store.setdefault(key, torch.cat([head, block]) if any(first) else block)
                at += 1
    keys = np.unique(expanded.values)
    table = torch.stack([store[int(k)] for k in keys])
    index = torch.from_numpy(np.searchsorted(keys, expanded.values))
    columns = bags.columns(widths, 4)
    table.requires_grad_(True)
    got = widths.assemble(
        batch_features(table, torch.from_numpy(expanded.lengths), torch.zeros(50, 2),
                       columns, weights=torch.from_numpy(expanded.weights),
                       mean=torch.tensor(columns.mean), index=index),
        NAMES, BAGS.sequence)
    assert got.names == ("user", "item", "city") and got.widths == (8 + first[0], 16, 4)
    with pytest.raises(ValueError, match="several widths"):
        got.stacked()
    assert got.concat().shape == (50, 28 + first[0])
    # The reference: each field's full rows, pooled as the schema says.
    starts = np.concatenate([[0], np.cumsum(batch.lengths.ravel())])
    for b in range(len(batch)):
        for f, name in enumerate(NAMES):
            k = b * 4 + f
            vals, w = batch.values[starts[k]:starts[k + 1]], batch.weights[starts[k]:starts[k + 1]]
            rows = [full[(TABLES[f], int(v))] if first[f] else full[(TABLES[f], int(v))][1:]
                    for v in vals]
            if BAGS.sequence[f]:
                seq = got.sequences[name]
                assert int(seq.lengths[b]) == len(vals)
                for i, r in enumerate(rows):
                    assert torch.allclose(seq.rows[b, i].detach(), r)
                assert not seq.rows[b, len(vals):].any()
                continue
            want = sum((r * float(x) for r, x in zip(rows, w)),
                       torch.zeros(widths.width(f), dtype=torch.float64))
            if BAGS.mean[f]:
                want = want / max(len(vals), 1)
            assert torch.allclose(got.pooled(name)[b].detach(), want), (b, name)
    # Each block's gradient reaches the block's row: the loss sums the item field's columns
    # 5..8, all in the item's second block.
    got.pooled("item")[:, 4:8].sum().backward()
    assert table.grad is not None
    second = np.isin(keys, block_ids(batch.values[batch.values >= 1000], 1))
    assert table.grad[torch.from_numpy(~second)].abs().sum() == 0
    assert table.grad[torch.from_numpy(second)].abs().sum() > 0


def _position(batch: ClickBatch, b: int, f: int, at: int, expanded: ClickBatch, c: int) -> int:
    """Where in ``batch.values`` the value at ``expanded.values[at]`` (record ``b``, column
    ``c`` of field ``f``) came from."""
    flat = expanded.lengths.ravel().astype(np.int64)
    offset = at - int(flat[:b * expanded.fields + c].sum())
    return int(batch.lengths.ravel()[:b * batch.fields + f].sum()) + offset


def test_one_width_for_every_table_leaves_batches_and_features_as_they_were() -> None:
    widths = Widths.uniform(4, 16, True)
    batch = _batch(np.random.default_rng(1), 10)
    assert widths.one_block and widths.as_stored and widths.expand(batch) is batch
    assert widths.row_dim == 17 and Bags().columns(widths, 4) == Bags()


def test_a_table_given_two_widths_or_an_impossible_one_is_refused() -> None:
    with pytest.raises(SchemaError, match="table 'items' has dim 16 in field 'item' and 32"):
        parse_schema("sparse=item:table=items:dim=16,history:table=items:dim=32:max_len=5")
    with pytest.raises(SchemaError, match="dim must be from 1 to 4,096"):
        parse_schema("sparse=item:dim=100000")
    with pytest.raises(SchemaError, match="first_order"):
        Schema.of("label", [DenseField("d")], [SparseField("a", "t", first_order=True),
                                               SparseField("b", "t", first_order=False)])
    with pytest.raises(ValueError, match="--table-dims 'items=0'"):
        ModelConfig(table_dims="items=0")
    # A table's dim given by one field holds for every field of the table.
    schema = parse_schema("sparse=item:table=items:dim=32,history:table=items:max_len=5,user")
    bags = Bags.of(schema)
    assert bags.widths(ModelConfig(embed_dim=8), 3).dims == (32, 32, 8)
    assert bags.widths(ModelConfig(embed_dim=8, table_dims="user=16"), 3).dims == (32, 32, 16)
    assert bags.widths(ModelConfig(embed_dim=8, table_dims="items=4"), 3).dims == (4, 4, 8)
    with pytest.raises(ValueError, match="--table-dims names 'itemz', not a table of the "
                                         "schema \\(its tables: items, user\\)"):
        bags.widths(ModelConfig(table_dims="itemz=32"), 3)


def test_a_model_that_needs_one_width_or_first_order_weights_says_so_in_one_line() -> None:
    schema = parse_schema("sparse=item:dim=32,user,city")
    for model, said in (("deepfm", "needs one row width for every pooled field"),
                        ("dlrm", "needs one row width for every pooled field")):
        config = ModelConfig(model=model, embed_dim=8)
        spec = ModelSpec.of_bags(config, Bags.of(schema), 3, 0)
        with pytest.raises(ModelError, match=said) as exc:
            build_model(config, 3, 0, spec)
        assert "item 33" in str(exc.value) or "item 32" in str(exc.value)
    even = parse_schema("sparse=item,user,city:first_order=false")
    config = ModelConfig(model="widedeep", embed_dim=8)
    with pytest.raises(ModelError, match="first-order weight of every field; city: first_order = false"):
        build_model(config, 3, 0, ModelSpec.of_bags(config, Bags.of(even), 3, 0))
    # Models that read fields side by side take any widths: the first-order weight where a
    # table asks for one.
    config = ModelConfig(model="dcn", embed_dim=8, hidden=(4,))
    spec = ModelSpec.of_bags(config, Bags.of(parse_schema(
        "sparse=item:dim=32:first_order=true,user,city")), 3, 0)
    assert [spec.width_of(n) for n in spec.pooled] == [33, 8, 8] and spec.pooled_width == 49
    assert build_model(config, 3, 0, spec)(spec.example(2)).shape == (2,)


def test_a_resume_with_other_widths_is_refused() -> None:
    saved = {"model": "dcn", "row_dim": 8, "dims": [8, 16], "first_order": [False, False]}
    manifest = types.SimpleNamespace(topic=None, extra=saved, path="ckpt-9")
    check_compatible(manifest, dict(saved))
    for now in ({**saved, "dims": [16, 16]}, {k: v for k, v in saved.items()
                                              if k not in ("dims", "first_order")}):
        with pytest.raises(ckpt.CheckpointError, match="dims"):
            check_compatible(manifest, now)
