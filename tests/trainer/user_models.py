"""Models written as a user writes one, in a module of their own: the tests name them by
import path (``--model user_models:build``), as a user names ``mypkg.models:build``."""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model import Features, ModelSpec


class LastClicks(nn.Module):
    """The item's row against the mean and the most recent of the user's history rows, beside
    an MLP of every pooled field: reads pooled fields, a sequence and the dense features, and
    returns a logit a label of the schema (``[B, T]``)."""

    def __init__(self, spec: ModelSpec, hidden: int = 16) -> None:
        super().__init__()
        (self.history, _), = spec.sequences
        self.item = next(f for f in spec.pooled if spec.table_of(f) == spec.table_of(self.history))
        self.mix = nn.Linear(3, spec.tasks)
        self.deep = nn.Sequential(nn.Linear(spec.pooled_width + spec.n_dense, hidden),
                                  nn.ReLU(), nn.Linear(hidden, spec.tasks))

    def forward(self, features: Features) -> torch.Tensor:
        seq = features.sequences[self.history]
        item = features.pooled(self.item)
        mask = seq.mask().unsqueeze(-1).to(seq.rows.dtype)
        mean = (seq.rows * mask).sum(1) / seq.lengths.clamp(min=1).unsqueeze(1).to(item.dtype)
        last = seq.rows[:, 0]
        sims = torch.stack([(item * mean).sum(1), (item * last).sum(1),
                            seq.lengths.to(item.dtype)], dim=1)
        deep = self.deep(torch.cat([features.concat(), features.dense], dim=1))
        return self.mix(sims) + deep  # [B, T]: one column a task


def build(spec: ModelSpec) -> nn.Module:
    return LastClicks(spec)


def missing_field(spec: ModelSpec) -> nn.Module:
    """A model that reads a field no schema of the tests has."""

    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(spec.row_dim, 1)

        def forward(self, features: Features) -> torch.Tensor:
            return self.out(features.pooled("clicked_ad")).squeeze(1)

    return Reads()


def wrong_shape(spec: ModelSpec) -> nn.Module:
    """A model that returns a logit per field, not per record."""

    class PerField(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(spec.row_dim, 1)

        def forward(self, features: Features) -> torch.Tensor:
            return self.out(features.stacked()).squeeze(-1)  # [B, F]

    return PerField()
