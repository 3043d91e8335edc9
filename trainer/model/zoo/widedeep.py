"""Wide&Deep (Cheng et al. 2016): a linear model plus an MLP over the embeddings.

A row is ``[w, v_1..v_D]``: ``w`` the id's wide (first-order) weight, ``v`` its vector
(``ModelConfig.first_order``): one lookup, one exchange and one optimizer per id.
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model.features import Features
from hetgmp.trainer.model.spec import ModelSpec
from hetgmp.trainer.model.zoo.layers import mlp

__all__ = ["WideDeep", "build"]


class WideDeep(nn.Module):
    """Wide&Deep on every pooled field (rows ``[B, F, 1 + D]``) and the dense features."""

    def __init__(self, embed_dim: int, n_fields: int, n_dense: int,
                 hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.wide_dense = nn.Linear(n_dense, 1)
        self.deep = mlp(n_fields * embed_dim + n_dense, hidden)

    def forward(self, features: Features) -> torch.Tensor:
        """Logits ``[B]``."""
        emb, dense = features.stacked(), features.dense
        wide = emb[..., 0].sum(dim=1) + self.wide_dense(dense).squeeze(1)
        deep = self.deep(torch.cat([emb[..., 1:].flatten(1), dense], dim=1)).squeeze(1)
        return wide + deep


def build(spec: ModelSpec) -> nn.Module:
    """``--model widedeep``."""
    spec.require_pooled_only("widedeep")
    spec.require_one_task("widedeep")
    spec.require_first_order("widedeep")
    return WideDeep(spec.one_width("widedeep") - 1, len(spec.pooled), spec.n_dense,
                    spec.config.hidden)
