"""DLRM (Naumov et al. 2019), the architecture of MLPerf's recommendation benchmark.

A bottom MLP maps the dense features to one vector of the embedding's width; the dot products
of every pair among that vector and the F pooled rows are the interactions; a top MLP reads
them beside the bottom vector.
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model.features import Features
from hetgmp.trainer.model.spec import ModelSpec
from hetgmp.trainer.model.zoo.layers import body, mlp

__all__ = ["DLRM", "build"]


class DLRM(nn.Module):
    """DLRM on every pooled field and the dense features."""

    def __init__(self, embed_dim: int, n_fields: int, n_dense: int, bottom: tuple[int, ...],
                 hidden: tuple[int, ...]) -> None:
        super().__init__()
        stack, width = body(n_dense, bottom)
        self.bottom = nn.Sequential(*stack, nn.Linear(width, embed_dim), nn.ReLU())
        self.n_vectors = n_fields + 1
        pairs = self.n_vectors * (self.n_vectors - 1) // 2
        self.top = mlp(embed_dim + pairs, hidden)

    def forward(self, features: Features) -> torch.Tensor:
        """Logits ``[B]``."""
        emb = features.stacked()
        z = self.bottom(features.dense)
        vectors = torch.cat([z.unsqueeze(1), emb], dim=1)  # [B, F + 1, D]
        dots = vectors @ vectors.transpose(1, 2)
        i, j = torch.triu_indices(self.n_vectors, self.n_vectors, 1, device=emb.device)
        return self.top(torch.cat([z, dots[:, i, j]], dim=1)).squeeze(1)


def build(spec: ModelSpec) -> nn.Module:
    """``--model dlrm``."""
    spec.require_pooled_only("dlrm")
    spec.require_one_task("dlrm")
    c = spec.config
    return DLRM(spec.one_width("dlrm"), len(spec.pooled), spec.n_dense, c.bottom, c.hidden)
