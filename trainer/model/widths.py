"""Tables of several widths in one row store: a table's row is cut in blocks of one width.

The schema gives each table its width (``dim``, default ``--embed-dim``) and says whether its
rows carry a first-order weight (``first_order``). Everything that moves rows (the store, the
exchange, replicas, migrations, checkpoints, the delta log, serve's table) moves ``[n, R]``
blocks of one width ``R``; a table of width ``D`` keeps each row as ``D / u`` blocks, ``u`` the
greatest common divisor of the tables' widths (``R = u``, or ``u + 1`` when some table has
first-order weights: column 0 of a block holds the weight, used in a row's first block of such
a table, left at its initial value elsewhere). It is TorchRec's column-wise sharding turned
around: there a table's columns are cut in shards to spread one table over devices; here they
are cut in blocks so that tables of several widths share one store without padding, and each
block is placed by the access graph like any row (a row's blocks are read by the same samples,
so the partitioner finds them together).

Block ``j > 0`` of a value has its own id, ``fmix64(id ^ j * GOLDEN)`` on 63 bits (block 0 is the
value's id): a batch is *expanded* (:meth:`Widths.expand`) so that a field of ``k`` blocks
becomes ``k`` columns of ids with the field's lengths and weights, and after its rows are looked
up and pooled column by column, the columns are put back together (:meth:`Widths.assemble`).
Pooling is linear in each column, so pooling the blocks and joining them is pooling the row.
When every table has one block (one width for all, the default) a batch is not touched and the
features are what they were before tables had widths.

Costs of the cut, against rows of their own width: an id, a version and an index entry a block
rather than a row; a row-wise optimizer state (``rowwise_adagrad``) a block; and ``k`` ids a
value in the exchange, the graph and the deduplication. With ``u`` of 16 floats a block carries
64 bytes of values for its 8-byte id.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from hetgmp.runtime import fmix64
from hetgmp.streaming import ClickBatch
from hetgmp.trainer.model.features import Features, Sequence

__all__ = ["Widths", "block_ids"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ID_MASK = np.uint64((1 << 63) - 1)


def block_ids(ids: np.ndarray, block: np.ndarray | int) -> np.ndarray:
    """The ids of block ``block`` (>= 1) of the rows of ``ids`` (int64, non-negative)."""
    with np.errstate(over="ignore"):
        salt = np.asarray(block, dtype=np.uint64) * _GOLDEN
        mixed = fmix64(ids.astype(np.uint64) ^ salt, inplace=True)
    return (mixed & _ID_MASK).view(np.int64)


@dataclass(frozen=True)
class Widths:
    """Each sparse field's row width and first-order weight, and the blocks they make.

    Attributes:
        dims: Per sparse field, its table's vector width ``D``.
        first_order: Per sparse field, whether its table's rows carry a first-order weight
            (the field's row is then ``[w, v_1..v_D]``, ``D + 1`` wide).
    """

    dims: tuple[int, ...]
    first_order: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.dims) != len(self.first_order) or not self.dims:
            raise ValueError("widths need one dim and one first_order a field")
        if any(d < 1 for d in self.dims):
            raise ValueError(f"row widths must be positive, got {self.dims}")

    @classmethod
    def uniform(cls, fields: int, dim: int, first_order: bool) -> Widths:
        """Every field ``dim`` wide, with first-order weights or without."""
        return cls((dim,) * fields, (first_order,) * fields)

    @cached_property
    def unit(self) -> int:
        """Vector columns of a block: the greatest common divisor of the widths."""
        return math.gcd(*self.dims)

    @cached_property
    def row_dim(self) -> int:
        """Width of a stored block: ``unit``, and a first-order column if some table has one."""
        return self.unit + (1 if any(self.first_order) else 0)

    @cached_property
    def blocks(self) -> tuple[int, ...]:
        """Blocks of each field's row."""
        return tuple(d // self.unit for d in self.dims)

    @cached_property
    def columns(self) -> int:
        """Id columns of an expanded batch: one a block of each field."""
        return sum(self.blocks)

    @cached_property
    def column_field(self) -> np.ndarray:
        """The field of each column."""
        return np.repeat(np.arange(len(self.dims)), self.blocks)

    @cached_property
    def column_block(self) -> np.ndarray:
        """The block (0, 1, ...) of its field's row that each column holds."""
        return np.concatenate([np.arange(k) for k in self.blocks]).astype(np.int64)

    @property
    def one_block(self) -> bool:
        """Every row is one block: batches are not expanded."""
        return self.columns == len(self.dims)

    @property
    def as_stored(self) -> bool:
        """The model reads blocks as stored: one block a row, and the first-order column
        either in every table or in none."""
        return self.one_block and len(set(self.first_order)) == 1

    def width(self, field: int) -> int:
        """Width of field ``field``'s row as the model reads it."""
        return self.dims[field] + (1 if self.first_order[field] else 0)

    def record(self) -> dict[str, list]:
        """What a checkpoint records of the widths (for serve and resumes)."""
        return {"dims": list(self.dims), "first_order": list(self.first_order)}

    # -- batches ---------------------------------------------------------------------------

    def expand(self, batch: ClickBatch) -> ClickBatch:
        """``batch`` with a column of ids for each block of each field's rows (the batch
        itself when every row is one block).

        Raises:
            ValueError: ``batch`` has not one column a field.
        """
        if batch.fields != len(self.dims):
            raise ValueError(f"records of {batch.fields} sparse fields; the widths are of "
                             f"{len(self.dims)}")
        if self.one_block:
            return batch
        n = len(batch)
        lengths = np.ascontiguousarray(batch.lengths, dtype=np.int64)
        flat = lengths.reshape(-1)
        starts = (np.cumsum(flat) - flat).reshape(lengths.shape)
        out_lengths = lengths[:, self.column_field]
        out_flat = out_lengths.reshape(-1)
        total = int(out_flat.sum())
        out_starts = np.cumsum(out_flat) - out_flat
        source = np.repeat(starts[:, self.column_field].reshape(-1) - out_starts, out_flat)
        source += np.arange(total, dtype=np.int64)
        block = np.repeat(np.tile(self.column_block, n), out_flat)
        values = batch.values[source]
        later = np.flatnonzero(block)
        values[later] = block_ids(values[later], block[later])
        weights = None if batch.weights is None else batch.weights[source]
        return dataclasses.replace(batch, values=values, lengths=out_lengths.astype(np.int32),
                                   weights=weights)

    # -- features --------------------------------------------------------------------------

    def assemble(self, columns: Features, names: tuple[str, ...],
                 sequence: tuple[bool, ...]) -> Features:
        """The fields' features from the columns' (``names`` and ``sequence``: the fields').

        ``columns`` holds a pooled row ``[B, C, R]`` a pooled column and a ``[B, L, R]``
        sequence a sequence column, named ``<field>#<block>``; a field's row is its blocks'
        vector columns side by side, after its first block's first-order weight if it has one.
        """
        if self.as_stored:
            return columns
        pooled_rows = columns.pooled_rows
        assert isinstance(pooled_rows, torch.Tensor)
        rows: list[torch.Tensor] = []
        sequences: dict[str, Sequence] = {}
        position = 0
        for f, name in enumerate(names):
            k = self.blocks[f]
            if sequence[f]:
                parts = [columns.sequences[f"{name}#{j}"] for j in range(k)]
                sequences[name] = Sequence(self._join([p.rows for p in parts], f),
                                           parts[0].lengths)
                continue
            if self.row_dim == self.unit:  # no first-order column: the blocks lie side by side
                rows.append(pooled_rows[:, position:position + k].flatten(1))
            else:
                rows.append(self._join([pooled_rows[:, position + j] for j in range(k)], f))
            position += k
        widths = {r.shape[-1] for r in rows}
        pooled: torch.Tensor | tuple[torch.Tensor, ...]
        if len(widths) <= 1:
            batch = columns.batch_size
            pooled = torch.stack(rows, 1) if rows else pooled_rows.new_zeros(batch, 0,
                                                                              self.row_dim)
        else:
            pooled = tuple(rows)
        kept = tuple(n for n, s in zip(names, sequence) if not s)
        return Features(kept, pooled, columns.dense, sequences)

    def _join(self, blocks: list[torch.Tensor], field: int) -> torch.Tensor:
        """Field ``field``'s row from its blocks (last dimension ``R`` each)."""
        if self.row_dim == self.unit:
            return blocks[0] if len(blocks) == 1 else torch.cat(blocks, -1)
        vectors = [b[..., 1:] for b in blocks]
        if self.first_order[field]:
            vectors.insert(0, blocks[0][..., :1])
        return vectors[0] if len(vectors) == 1 else torch.cat(vectors, -1)
