"""What a model receives: a batch's features after its rows were looked up and pooled.

The model contract (issue 56): a model is a plain ``torch.nn.Module`` whose ``forward`` takes one
:class:`Features` and returns logits, ``[B]`` for one label (or ``[B, T]``, one column per
task). Everything that placement, routing, replicas, staleness, migrations, checkpoints and the
delta log do happens before: the rows reach the model as tensors that carry their gradient
back to the store, as TorchRec's ``KeyedTensor`` and ``JaggedTensor`` reach a model from its
``EmbeddingBagCollection`` and ``EmbeddingCollection``.

* ``pooled(name)``: a field's bag pooled to one row ``[B, D]`` (sum, mean or weighted sum, as
  the schema says; ``D`` its table's width, one more with a first-order weight in front);
  ``stacked()`` is every pooled field at once, ``[B, F, D]``, in schema order, when every
  pooled field has one width (the built-in models take it, with no copy); ``concat()`` is them
  side by side, ``[B, sum of D]``, whatever their widths.
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
        pooled_rows: ``[B, F, D]``: one pooled row per pooled field; fields of several
            widths: one ``[B, D_f]`` tensor a field.
        dense: ``[B, n_dense]``.
        sequences: The sequence fields by name.
    """

    names: tuple[str, ...]
    pooled_rows: torch.Tensor | tuple[torch.Tensor, ...]
    dense: torch.Tensor
    sequences: Mapping[str, Sequence] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        """Records in the batch."""
        return int(self.dense.shape[0])

    def stacked(self) -> torch.Tensor:
        """Every pooled field's row, ``[B, F, D]`` in schema order.

        Raises:
            ValueError: The pooled fields have several widths (read ``pooled(name)`` or
                ``concat()``).
        """
        if isinstance(self.pooled_rows, torch.Tensor):
            return self.pooled_rows
        widths = ", ".join(f"{n} {r.shape[-1]}" for n, r in zip(self.names, self.pooled_rows))
        raise ValueError(f"the pooled fields have several widths ({widths}): read "
                         "features.pooled(name) or features.concat()")

    def concat(self) -> torch.Tensor:
        """Every pooled field's row side by side, ``[B, sum of widths]``, in schema order."""
        if isinstance(self.pooled_rows, torch.Tensor):
            return self.pooled_rows.flatten(1)
        return torch.cat(self.pooled_rows, 1)

    @property
    def widths(self) -> tuple[int, ...]:
        """Each pooled field's row width, in schema order."""
        if isinstance(self.pooled_rows, torch.Tensor):
            return (int(self.pooled_rows.shape[-1]),) * len(self.names)
        return tuple(int(r.shape[-1]) for r in self.pooled_rows)

    def pooled(self, name: str) -> torch.Tensor:
        """Field ``name``'s pooled row ``[B, D]``.

        Raises:
            KeyError: No pooled field has that name (the message lists those there are).
        """
        try:
            at = self.names.index(name)
        except ValueError:
            kind = "a sequence field (read features.sequences)" if name in self.sequences \
                else "no field of the schema"
            raise KeyError(f"{name!r} is {kind}; the pooled fields are "
                           f"{', '.join(self.names)}") from None
        if isinstance(self.pooled_rows, torch.Tensor):
            return self.pooled_rows[:, at]
        return self.pooled_rows[at]
