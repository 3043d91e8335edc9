"""Bags of rows pooled into one vector per (sample, field), as TorchRec's EmbeddingBagCollection.

A batch with multi-valued fields carries its ids jagged: ``lengths [B, S]`` values per sample and
field, in sample-major order (KeyedJaggedTensor's layout, ordered by sample). After the row
exchange the looked-up rows come in that same order, ``[nnz, R]``; :func:`pool_bags` makes the
``[B, S, R]`` tensor today's models take, in one ``index_add_`` over the bag index. A field of
one value a record is a bag of one: pooling leaves its row as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Bags", "pool_bags"]


@dataclass(frozen=True)
class Bags:
    """How a log's sparse fields make one vector each.

    Attributes:
        mean: Per sparse field, whether its values are averaged (else summed); empty: all sum.
        jagged: Whether a record may carry other than one value a field (lists or weights):
            batches then travel with their lengths.
        weighted: Whether some field carries per-value weights.
    """

    mean: tuple[bool, ...] = ()
    jagged: bool = False
    weighted: bool = False

    @classmethod
    def of(cls, schema: Any) -> Bags:
        """The bags of a :class:`streaming.Schema` (its sparse fields' settings)."""
        fields = schema.sparse_fields
        return cls(mean=tuple(f.pooling == "mean" for f in fields),
                   jagged=bool(schema.multi_valued),
                   weighted=any(f.weighted for f in fields))


def pool_bags(rows: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None,
              mean: torch.Tensor | None = None) -> torch.Tensor:
    """Each (sample, field)'s rows summed, or averaged where ``mean`` says.

    Args:
        rows: ``[nnz, R]``, the bags' rows one after the other (sample-major, then field).
        lengths: integer ``[B, S]``, rows in each bag (0: an empty bag pools to zeros).
        weights: ``[nnz]`` per-row weights (weighted fields pool by sum, as EmbeddingBag's
            ``per_sample_weights``), or None.
        mean: bool ``[S]``, fields pooled by mean; None: every field by sum.

    Returns:
        ``[B, S, R]`` in the rows' dtype, differentiable in ``rows`` (and ``weights``).
    """
    batch, fields = lengths.shape
    bags = torch.arange(batch * fields, device=rows.device)
    # output_size: no read back of the lengths' sum (a wait on CUDA).
    bag_of_row = torch.repeat_interleave(bags, lengths.reshape(-1).to(rows.device),
                                         output_size=rows.shape[0])
    values = rows if weights is None else rows * weights.to(rows.dtype).unsqueeze(1)
    out = rows.new_zeros(batch * fields, rows.shape[1]).index_add(0, bag_of_row, values)
    if mean is not None:
        counts = lengths.to(device=rows.device, dtype=rows.dtype).clamp(min=1)
        scale = torch.where(mean.to(rows.device).unsqueeze(0), 1.0 / counts,
                            torch.ones_like(counts))
        out = out * scale.reshape(-1, 1)
    return out.reshape(batch, fields, rows.shape[1])
