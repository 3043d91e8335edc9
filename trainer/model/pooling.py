"""Bags of rows pooled into one vector per (sample, field), as TorchRec's EmbeddingBagCollection.

A batch with multi-valued fields carries its ids jagged: ``lengths [B, S]`` values per sample and
field, in sample-major order (KeyedJaggedTensor's layout, ordered by sample). The row exchange
hands the batch its distinct rows ``[U, R]`` and, per value, the index of its row (``inverse``);
:func:`pool_bags` makes the ``[B, S, R]`` tensor the models take with one
``torch.nn.functional.embedding_bag`` over them: the fused kernel (FBGEMM's on CPU) reads each
row where it lies, and its backward sums each distinct row's gradient straight into a ``[U, R]``
tensor. Nothing of size ``[nnz, R]`` is made (a batch of MLPerf's bags holds 214 values a
sample: 450 MB of rows at 8,192 samples of 64 floats, gathered, weighted and scattered back
by the index-add pooling this replaced, 4-8x slower at the same rows). A field of one value a
record is a bag of one: pooling leaves its row as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from hetgmp.trainer.model.config import ModelConfig
from hetgmp.trainer.model.features import Features, Sequence
from hetgmp.trainer.model.widths import Widths

__all__ = ["Bags", "FieldReader", "batch_features", "pool_bags"]


@dataclass(frozen=True)
class Bags:
    """How a log's sparse fields make what the model reads.

    Attributes:
        mean: Per sparse field, whether its values are averaged (else summed); empty: all sum.
        jagged: Whether a record may carry other than one value a field (lists or weights):
            batches then travel with their lengths.
        weighted: Whether some field carries per-value weights.
        names: The sparse fields' names (empty: ``f0, f1, ...``).
        sequence: Per sparse field, whether it stays a sequence (``pooling = "none"``) instead
            of being pooled; empty: none does.
        max_len: Per sparse field, its most values a record (a sequence's length ``L``).
        tables: Per sparse field, the table it looks up.
        labels: The schema's labels, one logit column of the model each (empty: one).
        dims: Per sparse field, its table's row width (0: ``--embed-dim``); empty: every
            field ``--embed-dim``.
        first_order: Per sparse field, whether its table's rows carry a first-order weight
            (None: as the model wants, :attr:`ModelConfig.first_order`); empty: all None.
    """

    mean: tuple[bool, ...] = ()
    jagged: bool = False
    weighted: bool = False
    names: tuple[str, ...] = ()
    sequence: tuple[bool, ...] = ()
    max_len: tuple[int, ...] = ()
    tables: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    dims: tuple[int, ...] = ()
    first_order: tuple[bool | None, ...] = ()

    @classmethod
    def of(cls, schema: Any) -> Bags:
        """The bags of a :class:`hetgmp.streaming.Schema` (its sparse fields' settings)."""
        fields = schema.sparse_fields
        return cls(mean=tuple(f.pooling == "mean" for f in fields),
                   jagged=bool(schema.multi_valued),
                   weighted=any(f.weighted for f in fields),
                   names=tuple(f.name for f in fields),
                   sequence=tuple(f.pooling == "none" for f in fields),
                   max_len=tuple(f.max_len for f in fields),
                   tables=tuple(f.table for f in fields),
                   labels=tuple(schema.labels),
                   dims=tuple(d for d, _ in schema.table_settings()),
                   first_order=tuple(f for _, f in schema.table_settings()))

    def widths(self, config: ModelConfig, n_fields: int) -> Widths:
        """Each field's row width and first-order weight: ``--table-dims``'s width for its
        table, else the schema's, else ``--embed-dim``; the schema's first-order setting,
        else what the model wants.

        Raises:
            ValueError: ``--table-dims`` names a table no field looks up.
        """
        tables = self.tables or self.field_names(n_fields)
        given = config.dims_of_tables()
        unknown = sorted(set(given) - set(tables))
        if unknown:
            shown = ", ".join(list(dict.fromkeys(tables))[:8])
            raise ValueError(f"--table-dims names {unknown[0]!r}, not a table of the schema "
                             f"(its tables: {shown}{', ...' if len(set(tables)) > 8 else ''})")
        dims = tuple(given.get(t) or (self.dims[i] if self.dims else 0) or config.embed_dim
                     for i, t in enumerate(tables))
        first = tuple(config.first_order if not self.first_order or self.first_order[i] is None
                      else bool(self.first_order[i]) for i in range(n_fields))
        return Widths(dims, first)

    def columns(self, widths: Widths, n_fields: int) -> Bags:
        """The bags of ``widths``'s expanded batches: one a block of each field's rows,
        named ``<field>#<block>`` (these bags when every row is one block)."""
        if widths.one_block:
            return self
        of = widths.column_field.tolist()
        names = self.field_names(n_fields)

        def each(values: tuple) -> tuple:
            return tuple(values[f] for f in of) if values else ()

        return Bags(mean=each(self.mean), jagged=self.jagged, weighted=self.weighted,
                    names=tuple(f"{names[f]}#{j}" for f, j in zip(of, widths.column_block)),
                    sequence=each(self.sequence), max_len=each(self.max_len),
                    tables=each(self.tables), labels=self.labels)

    def field_names(self, n_fields: int) -> tuple[str, ...]:
        """The sparse fields' names (``f0, f1, ...`` when the bags carry none)."""
        return self.names or tuple(f"f{i}" for i in range(n_fields))

    @property
    def tasks(self) -> int:
        """Logit columns the model returns: one a label."""
        return max(1, len(self.labels))

    @property
    def sequences(self) -> tuple[int, ...]:
        """Indices of the fields kept as sequences."""
        return tuple(i for i, s in enumerate(self.sequence) if s)


class _BagSum(torch.autograd.Function):
    """Bags summed by ``embedding_bag``, and the rows' gradient by ``embedding_bag`` too.

    The gradient of row ``u`` is the sum, over the values that read it, of the value's weight
    times its bag's gradient: a bag sum of the transposed problem, whose bags are the rows (the
    values sorted by row) and whose table is the output's gradient. That is the forward kernel
    again, where autograd's own backward of ``embedding_bag`` (CPU) took 5x as long on a batch
    of MLPerf's bags (0.42 s against 0.08 s, the sort included, 1.7M values, 200k rows).
    """

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, index: torch.Tensor, offsets: torch.Tensor,
                bag: torch.Tensor, weights: torch.Tensor | None,
                by_row: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        ctx.save_for_backward(index, bag, weights)
        ctx.by_row, ctx.n_rows = by_row, rows.shape[0]
        return F.embedding_bag(index, rows, offsets, mode="sum", per_sample_weights=weights,
                               include_last_offset=True)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        index, bag, weights = ctx.saved_tensors
        if ctx.by_row is not None:
            order, rank = ctx.by_row
        else:
            rank, order = torch.sort(index)
        counts = torch.zeros(ctx.n_rows, dtype=torch.int64, device=grad.device)
        counts.scatter_add_(0, rank, torch.ones_like(rank))
        row_offsets = torch.zeros(ctx.n_rows + 1, dtype=torch.int64, device=grad.device)
        torch.cumsum(counts, 0, out=row_offsets[1:])
        per_value = None if weights is None else weights.index_select(0, order)
        rows_grad = F.embedding_bag(bag.index_select(0, order), grad.contiguous(), row_offsets,
                                    mode="sum", per_sample_weights=per_value,
                                    include_last_offset=True)
        return rows_grad, None, None, None, None, None


def pool_bags(rows: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None,
              mean: torch.Tensor | None = None, index: torch.Tensor | None = None, *,
              by_row: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Each (sample, field)'s rows summed, or averaged where ``mean`` says.

    Args:
        rows: The rows the bags read: ``[nnz, R]`` in bag order, or with ``index`` any
            ``[U, R]`` (a batch's distinct rows).
        lengths: integer ``[B, S]``, rows in each bag (0: an empty bag pools to zeros).
        weights: ``[nnz]`` per-value weights (weighted fields pool by sum, as EmbeddingBag's
            ``per_sample_weights``; data, not differentiated), or None.
        mean: bool ``[S]``, fields pooled by mean (the sum over the bag's length, its weights
            aside); None: every field by sum.
        index: int64 ``[nnz]``, the row of each value, sample-major then field; None: value
            ``k`` is ``rows[k]``.
        by_row: ``index`` sorted, as ``(order, sorted index)``, if the caller has it (the
            deduplication's ``Unique.order`` and ``Unique.rank``): the backward sorts
            otherwise.

    Returns:
        ``[B, S, R]`` in the rows' dtype, differentiable in ``rows``.
    """
    batch, fields = lengths.shape
    device, nnz = rows.device, int(rows.shape[0] if index is None else index.shape[0])
    flat = lengths.reshape(-1).to(device=device, dtype=torch.int64)
    offsets = torch.zeros(flat.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(flat, 0, out=offsets[1:])
    # Each value's bag (output_size: no read back of the lengths' sum, a wait on CUDA).
    bag = torch.repeat_interleave(torch.arange(flat.numel(), device=device), flat,
                                  output_size=nnz)
    if index is None:
        index = torch.arange(nnz, device=device)
    per_value = None if weights is None else weights.to(device=device, dtype=rows.dtype)
    if mean is not None:
        # A mean is a sum of each value over its bag's length: the scale rides on the values'
        # weights ([nnz]), not on the output ([B * S, R], 8x as many numbers on MLPerf's bags).
        scale = torch.where(mean.to(device).unsqueeze(0),
                            1.0 / flat.reshape(batch, fields).clamp(min=1).to(rows.dtype),
                            1.0).reshape(-1).index_select(0, bag)
        per_value = scale if per_value is None else per_value * scale
    out = _BagSum.apply(rows, index.to(device), offsets, bag, per_value, by_row)
    return out.reshape(batch, fields, rows.shape[1])


def batch_features(rows: torch.Tensor, lengths: torch.Tensor, dense: torch.Tensor, bags: Bags,
                   *, weights: torch.Tensor | None = None, mean: torch.Tensor | None = None,
                   index: torch.Tensor | None = None,
                   by_row: tuple[torch.Tensor, torch.Tensor] | None = None,
                   one_value: bool = False) -> Features:
    """What the model reads (:class:`~hetgmp.trainer.model.features.Features`) from a batch's
    looked-up rows: each pooled field's bag pooled, each sequence field's values as rows
    ``[B, L, R]`` (``L`` its ``max_len``, zeros past each record's length).

    Args:
        rows: As :func:`pool_bags` takes them: ``[nnz, R]`` in value order, or with ``index``
            the batch's distinct rows.
        lengths: integer ``[B, S]`` values of each (record, field).
        dense: ``[B, n_dense]``.
        bags: The fields' settings (names, sequences, ``max_len``).
        weights, mean, index, by_row: As :func:`pool_bags` takes them.
        one_value: Every (record, field) holds exactly one unweighted value: a field's row is
            its value's, no bag to pool.
    """
    batch, fields = lengths.shape
    names = bags.field_names(fields)
    sequences = bags.sequences
    if one_value and not sequences:
        picked = rows if index is None else rows.index_select(0, index)
        return Features(names, picked.view(batch, fields, rows.shape[1]), dense)
    pooled = pool_bags(rows, lengths, weights, mean, index, by_row=by_row)
    if not sequences:
        return Features(names, pooled, dense)
    keep = [f for f in range(fields) if f not in sequences]
    device = rows.device
    flat = lengths.reshape(-1).to(device=device, dtype=torch.int64)
    starts = (torch.cumsum(flat, 0) - flat).reshape(batch, fields)
    nnz = int(rows.shape[0] if index is None else index.shape[0])
    out: dict[str, Sequence] = {}
    for f in sequences:
        length = bags.max_len[f]
        lens = flat.reshape(batch, fields)[:, f].clamp(max=length)
        steps = torch.arange(length, device=device)
        valid = steps.unsqueeze(0) < lens.unsqueeze(1)
        position = torch.where(valid, starts[:, f:f + 1] + steps, 0).clamp(max=max(nnz - 1, 0))
        which = position if index is None else index[position]
        if nnz == 0:
            seq = rows.new_zeros(batch, length, rows.shape[1])
        else:
            seq = rows.index_select(0, which.reshape(-1)).view(batch, length, rows.shape[1])
            seq = seq * valid.unsqueeze(-1).to(rows.dtype)
        out[names[f]] = Sequence(seq, lens)
    stacked = pooled.index_select(1, torch.tensor(keep, device=device))
    return Features(tuple(names[f] for f in keep), stacked, dense, out)


@dataclass(frozen=True, eq=False)
class FieldReader:
    """What the model reads from a batch's looked-up rows, for the trainer and serve alike:
    the rows' widths, and the bags of the expanded batch's columns (a column of ids a block of
    each field's rows), pooled column by column and joined per field.

    Attributes:
        widths: Each field's row width and the blocks it makes.
        columns: The bags of the columns (the fields' bags when every row is one block).
        names: The fields' names.
        sequence: Per field, whether it stays a sequence.
        mean: bool ``[C]``: the columns pooled by mean, on the rows' device (None: all sum).
    """

    widths: Widths
    columns: Bags
    names: tuple[str, ...]
    sequence: tuple[bool, ...]
    mean: torch.Tensor | None

    @classmethod
    def of(cls, bags: Bags, config: ModelConfig, n_fields: int,
           device: torch.device | None = None) -> FieldReader:
        """The reader of ``n_fields`` fields set up as ``bags`` say, rows as ``config`` sizes
        them (:meth:`Bags.widths`)."""
        widths = bags.widths(config, n_fields)
        columns = bags.columns(widths, n_fields)
        mean = torch.tensor(columns.mean, device=device) if any(columns.mean) else None
        return cls(widths, columns, bags.field_names(n_fields),
                   bags.sequence or (False,) * n_fields, mean)

    def features(self, rows: torch.Tensor, lengths: torch.Tensor, dense: torch.Tensor, *,
                 weights: torch.Tensor | None = None, index: torch.Tensor | None = None,
                 by_row: tuple[torch.Tensor, torch.Tensor] | None = None,
                 one_value: bool = False) -> Features:
        """The fields' features of an expanded batch (``lengths`` ``[B, C]``; the other
        arguments as :func:`batch_features` takes them)."""
        columns = batch_features(rows, lengths, dense, self.columns, weights=weights,
                                 mean=self.mean, index=index, by_row=by_row,
                                 one_value=one_value)
        return self.widths.assemble(columns, self.names, self.sequence)
