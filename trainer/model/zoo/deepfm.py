"""DeepFM (Guo et al. 2017): first-order terms, pairwise FM interactions and an MLP.

A row is ``[w, v_1..v_D]``: ``w`` the id's first-order weight, ``v`` its vector
(``ModelConfig.first_order``).
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model.features import Features
from hetgmp.trainer.model.spec import ModelSpec
from hetgmp.trainer.model.zoo.layers import mlp

__all__ = ["DeepFM", "build"]


class DeepFM(nn.Module):
    """DeepFM on every pooled field (rows ``[B, F, 1 + D]``) and the dense features."""

    def __init__(self, embed_dim: int, n_fields: int, n_dense: int,
                 hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.linear_dense = nn.Linear(n_dense, 1)
        self.deep = mlp(n_fields * embed_dim + n_dense, hidden)

    def forward(self, features: Features) -> torch.Tensor:
        """Logits ``[B]``."""
        emb, dense = features.stacked(), features.dense
        vec = emb[..., 1:]
        first = emb[..., 0].sum(dim=1) + self.linear_dense(dense).squeeze(1)
        # sum_{i<j} <v_i, v_j> = ((sum v)^2 - sum v^2) / 2, in O(F D) rather than O(F^2 D).
        fm = 0.5 * (vec.sum(dim=1).pow(2) - vec.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.deep(torch.cat([vec.flatten(1), dense], dim=1)).squeeze(1)
        return first + fm + deep


def build(spec: ModelSpec) -> nn.Module:
    """``--model deepfm``."""
    spec.require_pooled_only("deepfm")
    spec.require_one_task("deepfm")
    spec.require_first_order("deepfm")
    return DeepFM(spec.one_width("deepfm") - 1, len(spec.pooled), spec.n_dense,
                  spec.config.hidden)
