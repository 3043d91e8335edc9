"""DIN, the Deep Interest Network (Zhou et al., KDD 2018): a user's history attended by the
candidate item.

A sequence field (``pooling = "none"``: the items a user clicked) is read row by row; an
activation unit scores each history row ``h`` against the candidate's row ``c`` (a pooled field
that looks up the same table: the item being scored) from ``[h, c, h - c, h * c]``, and the
history is the sum of its rows weighted by those scores (the paper's sum pooling: no softmax,
so the weight of a user's interest keeps its intensity). An MLP reads the attended history
beside every pooled field and the dense features.

Schema: one sequence field and a pooled field of the same table (``--model din``); the first
such pair is used.
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model.features import Features
from hetgmp.trainer.model.spec import ModelError, ModelSpec
from hetgmp.trainer.model.zoo.layers import mlp

__all__ = ["DIN", "build"]

# The activation unit's hidden layers (the paper's 80 and 40).
_ATTENTION = (80, 40)


class DIN(nn.Module):
    """DIN over the sequence field ``history`` and the candidate field ``candidate``.

    Args:
        history: The sequence field's name.
        candidate: The pooled field of the same table.
        pooled_width: The pooled fields' widths summed (the candidate among them).
        dim: Width of the history's (and the candidate's) rows.
        n_dense: Dense features.
        hidden: The top MLP's hidden layers.
    """

    def __init__(self, history: str, candidate: str, pooled_width: int, dim: int, n_dense: int,
                 hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.history, self.candidate = history, candidate
        self.attention = mlp(4 * dim, _ATTENTION)
        self.top = mlp(pooled_width + dim + n_dense, hidden)

    def forward(self, features: Features) -> torch.Tensor:
        """Logits ``[B]``."""
        seq = features.sequences[self.history]
        c = features.pooled(self.candidate).unsqueeze(1).expand_as(seq.rows)  # [B, L, D]
        h = seq.rows
        scores = self.attention(torch.cat([h, c, h - c, h * c], dim=-1)).squeeze(-1)  # [B, L]
        scores = scores * seq.mask().to(scores.dtype)
        interest = (scores.unsqueeze(-1) * h).sum(dim=1)  # [B, D]
        x = torch.cat([features.concat(), interest, features.dense], dim=1)
        return self.top(x).squeeze(1)


def build(spec: ModelSpec) -> nn.Module:
    """``--model din``: the first sequence field, with a pooled field of its table as the
    candidate."""
    spec.require_one_task("din")
    for history, _ in spec.sequences:
        table = spec.table_of(history)
        candidates = [f for f in spec.pooled if spec.table_of(f) == table]
        if candidates:
            return DIN(history, candidates[0], spec.pooled_width, spec.width_of(history),
                       spec.n_dense, spec.config.hidden)
    raise ModelError("model 'din' needs a sequence field (pooling = \"none\") and a pooled "
                     "field of the same table, the candidate; this schema has "
                     + (f"sequences {', '.join(n for n, _ in spec.sequences)} and no pooled "
                        "field of their tables" if spec.sequences else "no sequence field"))
