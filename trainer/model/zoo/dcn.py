"""DCN (Wang et al. 2017) and DCN-v2 (Wang et al. 2021): a cross tower beside an MLP over
``x0 = [rows, dense]``, both into one linear head; they differ in their cross layer."""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model.features import Features
from hetgmp.trainer.model.spec import ModelSpec
from hetgmp.trainer.model.zoo.layers import body

__all__ = ["DCN", "DCNv2", "build_dcn", "build_dcnv2"]


class _CrossAndDeep(nn.Module):
    """The tower and the head; :meth:`cross` is the layer."""

    cross_b: nn.Parameter  # [layers, width]: each cross layer's bias

    def _deep_and_head(self, width: int, hidden: tuple[int, ...]) -> None:
        """The MLP and the head, registered after the cross layers' parameters."""
        self.deep_body, deep_width = body(width, hidden)
        self.head = nn.Linear(width + (deep_width if hidden else 0), 1)

    def cross(self, x0: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Cross layer ``layer`` on ``x`` (its input ``x_l``), with ``x0`` the tower's input."""
        raise NotImplementedError

    def forward(self, features: Features) -> torch.Tensor:
        """Logits ``[B]`` of every pooled field's row and the dense features."""
        x0 = torch.cat([features.concat(), features.dense], dim=1)
        x = x0
        for layer in range(self.cross_b.shape[0]):
            x = self.cross(x0, x, layer)
        parts = [x, self.deep_body(x0)] if len(self.deep_body) else [x]
        return self.head(torch.cat(parts, dim=1)).squeeze(1)


class DCN(_CrossAndDeep):
    """Deep & Cross Network: ``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l`` (one vector a layer,
    the original DCN; DCN-v2's full matrices would put ~(F D)^2 parameters into every dense
    all-reduce)."""

    def __init__(self, width: int, layers: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.cross_w = nn.Parameter(torch.randn(layers, width) / width**0.5)
        self.cross_b = nn.Parameter(torch.zeros(layers, width))
        self._deep_and_head(width, hidden)

    def cross(self, x0: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        return x0 * (x @ self.cross_w[layer]).unsqueeze(1) + self.cross_b[layer] + x


class DCNv2(_CrossAndDeep):
    """DCN-v2, low-rank cross layers beside an MLP (the parallel form):
    ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` with ``V_l`` ``[rank, width]`` and ``U_l``
    ``[width, rank]``: ``2 width rank`` parameters a layer instead of the full ``width^2``."""

    def __init__(self, width: int, layers: int, rank: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.cross_v = nn.Parameter(torch.randn(layers, width, rank) / width**0.5)
        self.cross_u = nn.Parameter(torch.randn(layers, rank, width) / rank**0.5)
        self.cross_b = nn.Parameter(torch.zeros(layers, width))
        self._deep_and_head(width, hidden)

    def cross(self, x0: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        return x0 * ((x @ self.cross_v[layer]) @ self.cross_u[layer] + self.cross_b[layer]) + x


def _width(spec: ModelSpec) -> int:
    return spec.pooled_width + spec.n_dense


def build_dcn(spec: ModelSpec) -> nn.Module:
    """``--model dcn``."""
    spec.require_pooled_only("dcn")
    spec.require_one_task("dcn")
    return DCN(_width(spec), spec.config.cross_layers, spec.config.hidden)


def build_dcnv2(spec: ModelSpec) -> nn.Module:
    """``--model dcnv2``."""
    spec.require_pooled_only("dcnv2")
    spec.require_one_task("dcnv2")
    c = spec.config
    return DCNv2(_width(spec), c.cross_layers, c.cross_rank, c.hidden)
