"""How ranks are started (``--workers``, ``--device``, ``--threads``, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ['LaunchConfig']


@dataclass(frozen=True)
class LaunchConfig:
    """How ranks are started and how long a collective may wait before the job is failed."""

    workers: int = field(default=2, metadata={"help": "ranks on this machine"})
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto",
        metadata={"help": "auto: CUDA (NCCL, one GPU per rank) when this machine has a GPU for "
                  "every rank, else CPU (gloo)"}
    )
    timeout_s: float = field(
        default=120.0,
        metadata={"help": "a collective waiting longer fails the job (a peer is gone)"},
    )
    threads: int = field(default=1, metadata={"help": "torch threads per rank"})
    keep_freed_memory: bool = field(
        default=True,
        metadata={"help": "fix glibc malloc's thresholds in every rank so that the memory a step "
                  "frees is reused by the next instead of being returned to the kernel and "
                  "faulted in again (see trainer.dist.allocator)"},
    )

    def __post_init__(self) -> None:
        if self.workers < 1 or self.timeout_s <= 0 or self.threads < 1:
            raise ValueError("workers, timeout_s and threads must be positive")
