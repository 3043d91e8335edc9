"""The embedding store's settings (``--store-*``): initial values, row optimizer, admission, eviction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ['StoreConfig']


@dataclass(frozen=True)
class StoreConfig:
    """The embedding store of a rank: initial values, row optimizer, admission, eviction."""

    optimizer: Literal["adagrad", "sgd"] = field(
        default="adagrad", metadata={"help": "row optimizer: row-wise Adagrad or plain SGD"}
    )
    lr: float = field(default=0.02, metadata={"help": "embedding learning rate"})
    init_scale: float = field(
        default=0.05, metadata={"help": "initial row values are uniform in [-scale, scale)"}
    )
    adagrad_eps: float = field(default=1e-8, metadata={"help": "Adagrad denominator epsilon"})
    adagrad_init: float = field(
        default=0.0, metadata={"help": "initial value of the row-wise Adagrad accumulator"}
    )
    seed: int = field(
        default=0, metadata={"help": "seed of the initial row values (same on every rank)"}
    )
    admit_after: int = field(
        default=0,
        metadata={"help": "an id gets a trainable row after being used in this many steps "
                  "(0 or 1 = at first use); before that it reads its initial value"},
    )
    evict_after: int = field(
        default=0, metadata={"help": "evict rows unused for this many steps (0 = never)"}
    )
    max_rows: int = field(
        default=0, metadata={"help": "cap on rows per rank (0 = none): at the end of a step "
                             "that passed it, the least recently used rows go, down to 1/32 "
                             "below it; a step's new rows are the most it is ever passed by"}
    )
    def __post_init__(self) -> None:
        if self.lr <= 0 or self.init_scale < 0 or self.adagrad_eps <= 0:
            raise ValueError("lr and adagrad_eps must be positive, init_scale non-negative")
        if self.admit_after < 0 or self.evict_after < 0 or self.max_rows < 0:
            raise ValueError("admit_after, evict_after and max_rows must be non-negative")

    @property
    def state_width(self) -> int:
        """Optimizer state values per row (one accumulator for row-wise Adagrad)."""
        return 1 if self.optimizer == "adagrad" else 0
