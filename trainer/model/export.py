"""A model saved without its code: ``torch.export`` of the model on the contract's tensors.

A checkpoint of a user's model (``--model package.module:function``) carries the model's
program (:data:`EXPORTED`), so that ``hetgmp serve`` scores it where the user's package is not
installed. The program takes plain tensors (the pooled rows ``[B, F, D]``, or one ``[B, D_f]``
a field when their widths differ, the dense features,
and each sequence field's rows and lengths, in the spec's order), rebuilds the
:class:`~hetgmp.trainer.model.features.Features` the model reads, and calls it; the batch size is
dynamic. The parameters inside the program are the ones it was exported with: serve loads the
checkpoint's and the delta log's dense parameters into it by name (:func:`param_names`).

Models ``torch.export`` cannot trace (data-dependent Python control flow, calls it does not
support) are not exported: :class:`ExportError` says why, and serve imports them by path.
"""

from __future__ import annotations

import copy
import io

import torch
from torch import nn

from hetgmp.trainer.model.features import Features, Sequence
from hetgmp.trainer.model.spec import ModelSpec

__all__ = ["EXPORTED", "ExportError", "call_exported", "export_model", "load_exported",
           "param_names"]

#: The program's file in a checkpoint directory.
EXPORTED = "model.pt2"
# The wrapper's name for the model: its parameters are "model.<name>" in the program.
_PREFIX = "model."


class ExportError(RuntimeError):
    """The model could not be exported (the reason, one line)."""


class _OnTensors(nn.Module):
    """The model called on tensors: what ``torch.export`` traces."""

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        super().__init__()
        self.model = model
        self.pooled = spec.pooled
        self.sequences = tuple(name for name, _ in spec.sequences)

    def forward(self, pooled_rows: torch.Tensor | tuple[torch.Tensor, ...], dense: torch.Tensor,
                seq_rows: tuple[torch.Tensor, ...],
                seq_lengths: tuple[torch.Tensor, ...]) -> torch.Tensor:
        sequences = {name: Sequence(rows, lengths)
                     for name, rows, lengths in zip(self.sequences, seq_rows, seq_lengths)}
        return self.model(Features(self.pooled, pooled_rows, dense, sequences))


def _arguments(features: Features, spec: ModelSpec) -> tuple:
    seqs = [features.sequences[name] for name, _ in spec.sequences]
    return (features.pooled_rows, features.dense, tuple(s.rows for s in seqs),
            tuple(s.lengths for s in seqs))


def param_names(model: nn.Module) -> list[str]:
    """The trainable parameters' names in the order of the flat dense buffer
    (:class:`~hetgmp.trainer.model.dense.FlatParameters`)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def export_model(model: nn.Module, spec: ModelSpec) -> bytes:
    """``model`` (a float32 copy, in eval mode) as a saved ``torch.export`` program.

    Raises:
        ExportError: ``torch.export`` could not trace it (the reason in one line).
    """
    copied = copy.deepcopy(model).float().eval()
    example = _arguments(spec.example(3, torch.float32), spec)
    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    pooled = example[0]
    dims = (tuple({0: batch} for _ in pooled) if isinstance(pooled, tuple) else {0: batch},
            {0: batch}, tuple({0: batch} for _ in example[2]),
            tuple({0: batch} for _ in example[3]))
    try:
        program = torch.export.export(_OnTensors(copied, spec), example, dynamic_shapes=dims,
                                      strict=False)
        out = io.BytesIO()
        torch.export.save(program, out)
    except Exception as exc:  # whatever torch.export refuses, said in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExportError(f"{type(exc).__name__}: {first[:300]}") from None
    return out.getvalue()


def load_exported(data: bytes, names: list[str]) -> tuple[nn.Module, list[torch.nn.Parameter]]:
    """The program of :func:`export_model` as a module, and its trainable parameters in the
    order of ``names`` (:func:`param_names` of the model it was exported from).

    Raises:
        ExportError: ``data`` is not such a program, or lacks one of ``names``.
    """
    try:
        module = torch.export.load(io.BytesIO(data)).module()
    except Exception as exc:
        raise ExportError(f"not a saved torch.export program: {type(exc).__name__}: "
                          f"{str(exc).strip()[:200]}") from None
    held = dict(module.named_parameters())
    missing = [n for n in names if _PREFIX + n not in held]
    if missing:
        raise ExportError(f"the program has no parameter {missing[0]!r}")
    return module, [held[_PREFIX + n] for n in names]


def call_exported(module: nn.Module, features: Features, spec: ModelSpec) -> torch.Tensor:
    """The logits of the program of :func:`load_exported` on ``features``."""
    return module(*_arguments(features, spec))
