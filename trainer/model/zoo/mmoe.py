"""MMoE, the Multi-gate Mixture-of-Experts (Ma et al., KDD 2018): several tasks (a click and a
conversion) learned from one input by shared experts, each task mixing them by its own gate.

Every pooled field's row and the dense features make the input ``x``; each expert is an MLP of
``--hidden`` sizes on ``x``; task ``t``'s gate is ``softmax(W_t x)`` over the experts, and its
tower a linear logit on the gated sum of their outputs. One logit column a label of the schema
(``label = ["click", "conversion"]``); with one label it is a mixture of experts with one gate.
"""

from __future__ import annotations

import torch
from torch import nn

from hetgmp.trainer.model.features import Features
from hetgmp.trainer.model.spec import ModelSpec
from hetgmp.trainer.model.zoo.layers import body

__all__ = ["MMoE", "build"]

# Experts shared by the tasks (the paper's synthetic study uses 8 on two tasks; 4 keep a CPU
# step close to a single MLP's cost at the default --hidden).
_EXPERTS = 4


class MMoE(nn.Module):
    """MMoE over ``width_in`` input features.

    Args:
        width_in: Pooled fields times the row width, plus the dense features.
        hidden: Each expert's hidden layers.
        tasks: Logit columns (one a label).
        experts: Experts shared by the tasks.
    """

    def __init__(self, width_in: int, hidden: tuple[int, ...], tasks: int,
                 experts: int = _EXPERTS) -> None:
        super().__init__()
        made = [body(width_in, hidden) for _ in range(experts)]
        self.experts = nn.ModuleList(m for m, _ in made)
        width = made[0][1]
        self.gates = nn.ModuleList(nn.Linear(width_in, experts) for _ in range(tasks))
        self.towers = nn.ModuleList(nn.Linear(width, 1) for _ in range(tasks))

    def forward(self, features: Features) -> torch.Tensor:
        """Logits ``[B, T]``."""
        x = torch.cat([features.concat(), features.dense], dim=1)
        out = torch.stack([e(x) for e in self.experts], dim=1)  # [B, E, H]
        logits = []
        for gate, tower in zip(self.gates, self.towers):
            mix = torch.softmax(gate(x), dim=1).unsqueeze(-1)  # [B, E, 1]
            logits.append(tower((mix * out).sum(dim=1)))
        return torch.cat(logits, dim=1)


def build(spec: ModelSpec) -> nn.Module:
    """``--model mmoe``: one tower a label of the schema."""
    spec.require_pooled_only("mmoe")
    width_in = spec.pooled_width + spec.n_dense
    return MMoE(width_in, spec.config.hidden, spec.tasks)
