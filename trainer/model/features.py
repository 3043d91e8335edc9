"""What a model receives: a batch's features after its rows were looked up and pooled.

The model contract (issue 56): a model is a plain ``torch.nn.Module`` whose ``forward`` takes one
:class:`Features` and returns logits, ``[B]`` for one label (or ``[B, T]``, one column per
task). Everything that placement, routing, replicas, staleness, migrations, checkpoints and the
delta log do happens before: the rows reach the model as tensors that carry their gradient
back to the store, as TorchRec's ``KeyedTensor`` and ``JaggedTensor`` reach a model from its
``EmbeddingBagCollection`` and ``EmbeddingCollection``.

* ``pooled(name)``: a field's bag pooled to one row ``[B, D]`` (sum, mean or weighted sum, as
  the schema says); ``stacked()`` is every pooled field at once, ``[B, F, D]``, in schema order
  (the built-in models take it, with no copy).
* ``sequences[name]``: a field the schema keeps as a sequence (``pooling = "none"``): its rows
  ``[B, L, D]``, zeros past each record's length, ``L`` the field's ``max_len``, and
  ``lengths`` ``[B]``; ``mask()`` is ``[B, L]`` (DIN's attention, a two-tower's history).
* ``dense``: the dense features ``[B, n_dense]`` after their transforms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

__all__ = ["Features", "Sequence"]


@dataclass(frozen=True)
class Sequence:
    """A sequence field's rows.

    Attributes:
        rows: ``[B, L, D]``, row ``l`` of record ``b`` its ``l``-th value's, zeros past
            ``lengths[b]``.
        lengths: int64 ``[B]``: values of each record (at most ``L``).
    """

    rows: torch.Tensor
    lengths: torch.Tensor

    def mask(self) -> torch.Tensor:
        """bool ``[B, L]``: which positions hold a value."""
        positions = torch.arange(self.rows.shape[1], device=self.rows.device)
        return positions.unsqueeze(0) < self.lengths.unsqueeze(1)


@dataclass(frozen=True)
class Features:
    """A batch's features as a model reads them (see the module docstring).

    Attributes:
        names: The pooled fields, in schema order (the columns of ``stacked()``).
        pooled_rows: ``[B, F, D]``: one pooled row per pooled field.
        dense: ``[B, n_dense]``.
        sequences: The sequence fields by name.
    """

    names: tuple[str, ...]
    pooled_rows: torch.Tensor
    dense: torch.Tensor
    sequences: Mapping[str, Sequence] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        """Records in the batch."""
        return int(self.dense.shape[0])

    def stacked(self) -> torch.Tensor:
        """Every pooled field's row, ``[B, F, D]`` in schema order."""
        return self.pooled_rows

    def pooled(self, name: str) -> torch.Tensor:
        """Field ``name``'s pooled row ``[B, D]``.

        Raises:
            KeyError: No pooled field has that name (the message lists those there are).
        """
        try:
            return self.pooled_rows[:, self.names.index(name)]
        except ValueError:
            kind = "a sequence field (read features.sequences)" if name in self.sequences \
                else "no field of the schema"
            raise KeyError(f"{name!r} is {kind}; the pooled fields are "
                           f"{', '.join(self.names)}") from None
