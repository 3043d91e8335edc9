"""Dense (replicated) parameters as one flat buffer, and their optimizers on that buffer.

Every rank keeps a full copy of the dense parameters (the MLPs). Holding them as views into a
single flat tensor makes the step's gradient all-reduce one collective on one buffer and the
optimizer one vector operation, rather than a loop over parameter tensors. The optimizers are
written out here (Adam, Adagrad, SGD with torch's default hyper-parameters): ``torch.optim``
pulls in ``torch._dynamo`` on first use, which costs each spawned rank seconds of start-up.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

__all__ = ["FlatParameters", "DenseOptimizer"]


class FlatParameters:
    """A module's trainable parameters re-homed as views of one contiguous buffer."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter] | None = None) -> None:
        """``module``'s trainable parameters, or ``params`` in their order when given (a
        module whose own order differs: an exported program's)."""
        self.params = params if params is not None else \
            [p for p in module.parameters() if p.requires_grad]
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        pos = 0
        for p in self.params:
            n = p.numel()
            p.data = self.flat[pos:pos + n].view_as(p)
            pos += n

    @property
    def numel(self) -> int:
        """Number of dense parameter values."""
        return int(self.flat.numel())

    def flat_grads(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor]:
        """Per-parameter gradients flattened (zeros for parameters the loss did not reach)."""
        return [g.reshape(-1) if g is not None else torch.zeros_like(p).reshape(-1)
                for p, g in zip(self.params, grads)]


class DenseOptimizer:
    """Adam, Adagrad or SGD on a flat parameter buffer."""

    def __init__(
        self,
        kind: Literal["adam", "adagrad", "sgd"],
        lr: float,
        like: torch.Tensor,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float | None = None,
        warmup_steps: int = 0,
    ) -> None:
        """Create the optimizer state for a buffer shaped like ``like``.

        Args:
            kind: The algorithm.
            lr: Learning rate.
            like: The flat parameter buffer.
            betas: Adam's moment decay rates.
            eps: Denominator epsilon (torch's defaults: 1e-8 Adam, 1e-10 Adagrad).
            warmup_steps: The learning rate rises linearly over this many steps, ``lr * t / W``
                at step ``t`` (from 1), then stays at ``lr`` (a batch scaling rule's warm-up;
                the step count is checkpointed, so a resumed run goes on where it was).
        """
        self.kind = kind
        self.base_lr = self.lr = lr
        self.warmup_steps = warmup_steps
        self.betas = betas
        self.eps = eps if eps is not None else (1e-10 if kind == "adagrad" else 1e-8)
        self.steps = 0
        self._m = torch.zeros_like(like) if kind == "adam" else None
        self._v = torch.zeros_like(like) if kind in ("adam", "adagrad") else None

    @torch.no_grad()
    def step(self, params: torch.Tensor, grads: torch.Tensor) -> None:
        """One update of ``params`` (in place) with ``grads``."""
        self.steps += 1
        if self.steps <= self.warmup_steps:
            self.lr = self.base_lr * self.steps / self.warmup_steps
        else:
            self.lr = self.base_lr
        if self.kind == "sgd":
            params.add_(grads, alpha=-self.lr)
            return
        assert self._v is not None
        if self.kind == "adagrad":
            self._v.addcmul_(grads, grads)
            params.addcdiv_(grads, self._v.sqrt().add_(self.eps), value=-self.lr)
            return
        assert self._m is not None
        b1, b2 = self.betas
        self._m.mul_(b1).add_(grads, alpha=1 - b1)
        self._v.mul_(b2).addcmul_(grads, grads, value=1 - b2)
        bias1 = 1 - b1 ** self.steps
        bias2 = 1 - b2 ** self.steps
        denom = (self._v / bias2).sqrt_().add_(self.eps)
        params.addcdiv_(self._m, denom, value=-self.lr / bias1)

    def state_arrays(self) -> dict[str, torch.Tensor]:
        """The optimizer's state as named tensors (for checkpoints)."""
        out = {"opt_steps": torch.tensor([self.steps], dtype=torch.int64)}
        if self._m is not None:
            out["opt_m"] = self._m
        if self._v is not None:
            out["opt_v"] = self._v
        return out

    def load_state_arrays(self, arrays: dict[str, object]) -> None:
        """Restore the state :meth:`state_arrays` gave (arrays or tensors)."""
        self.steps = int(torch.as_tensor(arrays["opt_steps"]).reshape(-1)[0])
        for name, mine in (("opt_m", self._m), ("opt_v", self._v)):
            if mine is None:
                continue
            if name not in arrays:
                raise ValueError(f"checkpoint lacks {name}: written with another dense optimizer?")
            with torch.no_grad():
                mine.copy_(torch.as_tensor(arrays[name]).to(mine))
