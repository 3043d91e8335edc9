"""The embedding store's settings (``--store-*``): initial values, row optimizer (with CowClip
and an L2 penalty), admission, eviction, the disk tier."""

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
    clip: Literal["auto", "cowclip", "none"] = field(
        default="auto",
        metadata={"help": "per-id gradient clip where owners apply gradients: cowclip clips "
                  "each row's gradient to count x max(ratio x |row|, min) (CowClip, Zheng et "
                  "al. 2023; count: the id's occurrences in the global batch); auto: cowclip "
                  "under --batch-scaling cowclip, else none. See docs/large_batch.md"},
    )
    clip_ratio: float = field(
        default=1.0, metadata={"help": "CowClip's r: the clip threshold per occurrence is r "
                               "times the row's norm (the paper's r = 1)"}
    )
    clip_min: float = field(
        default=1e-4, metadata={"help": "CowClip's lower bound zeta on r x |row| (rows near "
                                "zero still move; the paper's 1e-5 to 1e-4)"}
    )
    l2: float = field(
        default=0.0, metadata={"help": "embedding L2 penalty lambda, per occurrence: each row "
                               "gradient gains lambda x count / batch x row (at --base-batch "
                               "when --batch-scaling scales it)"}
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
    disk_dir: str = field(
        default="", metadata={"help": "directory of a disk tier (RocksDB) under the rows in "
                              "memory: with --store-max-rows, the rows a step passes the cap "
                              "by spill there whole (value, optimizer state, version) instead "
                              "of being dropped, and come back bit for bit when their id is "
                              "read again; rows idle --store-evict-after steps are still "
                              "dropped. Each rank writes a directory of its own under it, "
                              "removed at exit (checkpoints hold the rows). Empty: no tier"}
    )
    prefetch: bool = field(
        default=False, metadata={"help": "with a disk tier: read the next batch's spilled rows "
                                 "(of ids this rank owns) on a thread while a step trains "
                                 "(for ranks with an idle core, a GPU's; on a CPU rank it "
                                 "measured no faster: docs/scale.md)"}
    )

    def __post_init__(self) -> None:
        if self.disk_dir and not self.max_rows:
            raise ValueError("a disk tier (disk_dir) needs max_rows, the rows kept in memory")
        if self.lr <= 0 or self.init_scale < 0 or self.adagrad_eps <= 0:
            raise ValueError("lr and adagrad_eps must be positive, init_scale non-negative")
        if self.admit_after < 0 or self.evict_after < 0 or self.max_rows < 0:
            raise ValueError("admit_after, evict_after and max_rows must be non-negative")
        if self.clip_ratio <= 0 or self.clip_min < 0 or self.l2 < 0:
            raise ValueError("clip_ratio must be positive, clip_min and l2 non-negative")

    @property
    def clips(self) -> bool:
        """Whether owners clip gradients (CowClip); "auto" is settled by the batch scaling rule
        (:func:`hetgmp.trainer.step.scaled`) and reads as off until then."""
        return self.clip == "cowclip"

    @property
    def state_width(self) -> int:
        """Optimizer state values per row (one accumulator for row-wise Adagrad)."""
        return 1 if self.optimizer == "adagrad" else 0
