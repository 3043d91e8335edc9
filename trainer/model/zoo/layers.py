"""Layers the built-in models share."""

from __future__ import annotations

from torch import nn

__all__ = ["body", "mlp"]


def body(width_in: int, hidden: tuple[int, ...]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU layers of ``hidden`` sizes, and the width they end in."""
    layers: list[nn.Module] = []
    for size in hidden:
        layers += [nn.Linear(width_in, size), nn.ReLU()]
        width_in = size
    return nn.Sequential(*layers), width_in


def mlp(width_in: int, hidden: tuple[int, ...], out: int = 1) -> nn.Sequential:
    """The ``hidden`` layers, then ``out`` logits."""
    stack, width = body(width_in, hidden)
    return nn.Sequential(*stack, nn.Linear(width, out))
