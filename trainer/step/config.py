"""The training loop's settings (``--staleness``, ``--global-batch``, ``--placement``, ...) and
the batch scaling rule (``--batch-scaling``) that derives learning rates and the embedding L2
penalty from the global batch.

The rules, with ``k = global_batch / base_batch`` (values at ``--base-batch`` are the ones
given: ``--store-lr``, ``--store-l2``, ``--dense-lr``):

* ``cowclip`` (Zheng et al., AAAI 2023; bytedance/LargeBatchCTR's hyper-parameter tables):
  embedding learning rate unchanged, embedding L2 ``lambda * k``, dense learning rate
  ``lr * sqrt(k)`` warmed up linearly from 0, and CowClip on (``--store-clip auto``). The paper
  warms up over one epoch of its data set; a stream has no epoch, so the warm-up spans
  ``--scaling-warmup`` records (the same records at every batch, as an epoch is).
* ``sqrt`` and ``linear`` (the vision rules: Krizhevsky 2014; Goyal et al. 2017): every
  learning rate, embedding and dense, times ``sqrt(k)`` or ``k``, with the same warm-up; L2 and
  clipping as given.
* ``none``: the settings as given, whatever the batch.

A warm-up applies only above the base batch (at ``k <= 1`` every rule keeps its values, so
``--batch-scaling cowclip`` at the base batch trains what ``none`` trains, with the clip).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from hetgmp.partitioner import ReplicaBasis, check_replica_basis
from hetgmp.trainer.embedding import StoreConfig

__all__ = ['Scaling', 'TrainConfig', 'scaled']

BatchRule = Literal["none", "cowclip", "sqrt", "linear"]


@dataclass(frozen=True)
class TrainConfig:
    """The training loop of every rank: batches, staleness, placement, dense optimizer."""

    staleness: int = field(
        default=10, metadata={"help": "replica staleness bound s (0 = synchronous training)"}
    )
    global_batch: int = field(default=4096, metadata={"help": "samples per step over all ranks"})
    steps: int = field(default=0, metadata={"help": "steps to train (0 = until the source ends)"})
    placement: Literal["auto", "hash", "graph"] = field(
        default="auto",
        metadata={"help": "hash: rows sharded by id hash; graph: partitioned from the stream's "
                  "access graph; auto: graph where it measurably sends fewer bytes per sample "
                  "than hash, re-decided as the stream changes (see --auto-margin)"},
    )
    route: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata={"help": "send samples to the rank holding most of their rows "
                  "(auto: on while a graph placement is in force, off for hash)"},
    )
    route_epsilon: float = field(
        default=0.0,
        metadata={"help": "routing lets a rank take up to (1 + this) times the mean samples of a "
                  "step: more locality, but every step waits for the fullest rank (0.05 saved "
                  "under 1%% of remote rows and cost ~3%% of throughput here)"},
    )
    route_rounds: int = field(
        default=-1,
        metadata={"help": "batch-aware routing: rounds of moves after routing a rank's batch, "
                  "so that samples gather where their rows are fetched anyway "
                  "(partitioner.batch_routing). -1 = auto: each rank measures the rows 3 "
                  "rounds save against their time and keeps them while they pay, "
                  "re-measuring as the stream changes; 0 = off; N = always N rounds"},
    )
    warmup: int = field(
        default=50_000,
        metadata={"help": "records whose access graph gives the graph placement (they are "
                  "trained on too)"},
    )
    replica_fraction: float = field(
        default=0.01,
        metadata={"help": "replica budget per rank, as a fraction of the rows counted by "
                  "--replica-basis"},
    )
    replica_basis: ReplicaBasis = field(
        default="window",
        metadata={"help": "what --replica-fraction counts: all the rows of the access window "
                  "(HET-GMP's count, a cache sized against the table), or the rows a rank's "
                  "samples use (touched: fewer copies)"},
    )
    dense_optimizer: Literal["adam", "adagrad", "sgd"] = field(
        default="adam", metadata={"help": "optimizer of the dense (MLP) parameters"}
    )
    dense_lr: float = field(default=1e-3, metadata={"help": "dense learning rate"})
    task_weights: tuple[float, ...] = field(
        default=(),
        metadata={"help": "with several labels: each task's weight in the loss, comma "
                  "separated in the schema's label order (default: 1 each)"},
    )
    batch_scaling: BatchRule = field(
        default="none",
        metadata={"help": "derive learning rates and the embedding L2 from --global-batch: "
                  "cowclip (embedding lr unchanged, --store-l2 x k, --dense-lr x sqrt(k) "
                  "warmed up, CowClip on; k = global batch / --base-batch), sqrt or linear "
                  "(every lr x sqrt(k) or x k, warmed up: the vision rules), none (as given). "
                  "See docs/large_batch.md"},
    )
    base_batch: int = field(
        default=1024,
        metadata={"help": "the global batch the given learning rates and L2 were set for "
                  "(--batch-scaling scales from it)"},
    )
    scaling_warmup: int = field(
        default=500_000,
        metadata={"help": "records over which a --batch-scaling rule raises the scaled learning "
                  "rates linearly from 0 (above the base batch only; 0 = no warm-up)"},
    )
    log_every: int = field(default=50, metadata={"help": "steps between progress lines (0 = off)"})

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.global_batch < 1 or self.steps < 0 or self.warmup < 0:
            raise ValueError("staleness, steps, warmup >= 0 and global_batch >= 1 required")
        if self.route_epsilon < 0 or self.route_rounds < -1:
            raise ValueError("route_epsilon must be >= 0 and route_rounds >= -1 (-1: auto)")
        if not 0.0 <= self.replica_fraction <= 1.0 or self.dense_lr <= 0:
            raise ValueError("replica_fraction in [0, 1] and dense_lr > 0 required")
        check_replica_basis(self.replica_basis)
        if self.base_batch < 1 or self.scaling_warmup < 0:
            raise ValueError("base_batch >= 1 and scaling_warmup >= 0 required")
        if not all(math.isfinite(w) and w >= 0 for w in self.task_weights):
            raise ValueError(f"task_weights {self.task_weights}: each must be a finite number "
                             ">= 0")

    def loss_weights(self, tasks: int) -> tuple[float, ...]:
        """Each task's weight in the loss (``task_weights``, or 1 each).

        Raises:
            ValueError: ``task_weights`` given for another number of tasks.
        """
        if not self.task_weights:
            return (1.0,) * tasks
        if len(self.task_weights) != tasks:
            raise ValueError(f"--task-weights gives {len(self.task_weights)} weight(s); the "
                             f"schema has {tasks} label(s)")
        return self.task_weights

    @property
    def routes(self) -> bool:
        """Whether samples are routed to the rank holding their rows (at start: with
        ``placement="auto"`` the online loop turns routing on while graph is in force)."""
        if self.route == "auto":  # auto placement: on here, the online loop decides after
            return self.placement in ("graph", "auto")
        return self.route == "on"


@dataclass(frozen=True)
class Scaling:
    """What a batch scaling rule set (:func:`scaled`).

    Attributes:
        rule: The rule.
        k: Global batch over base batch.
        train: The loop's settings with the dense learning rate the rule set.
        store: The store's settings with the embedding learning rate, L2 and clip it set.
        warmup_steps: Steps over which the scaled learning rates rise from 0 (0: none): the
            dense one, and under a vision rule the embedding one too.
        given: The values the rule scaled, as given (``store_lr``, ``store_l2``, ``dense_lr``).
    """

    rule: BatchRule
    k: float
    train: TrainConfig
    store: StoreConfig
    warmup_steps: int
    given: dict[str, float]

    def row_lr_factor(self, step: int) -> float:
        """What the embedding learning rate is multiplied by at ``step`` (from 0): a vision
        rule's warm-up, ``(step + 1) / warmup_steps`` up to 1 (CowClip leaves it unchanged)."""
        if self.rule not in ("sqrt", "linear") or step + 1 >= self.warmup_steps:
            return 1.0
        return (step + 1) / self.warmup_steps

    def record(self) -> dict[str, Any]:
        """Plain data for the summary and the checkpoint's manifest."""
        s, t = self.store, self.train
        return {"rule": self.rule, "global_batch": t.global_batch, "base_batch": t.base_batch,
                "k": self.k, "store_lr": s.lr, "store_l2": s.l2, "dense_lr": t.dense_lr,
                "warmup_steps": self.warmup_steps, "warmup_records": t.scaling_warmup
                if self.warmup_steps else 0, "clip": s.clip, "clip_ratio": s.clip_ratio,
                "clip_min": s.clip_min, "given": dict(self.given)}

    def describe(self) -> str:
        """One line saying what the rule set."""
        s, t, g = self.store, self.train, self.given

        def change(name: str, before: float, after: float) -> str:
            return f"{name} {before:g}" + (" (unchanged)" if before == after else f" -> {after:g}")

        warm = (f" warmed up over {t.scaling_warmup:,} records ({self.warmup_steps} steps)"
                if self.warmup_steps else "")
        clip = (f"CowClip on (r {s.clip_ratio:g}, zeta {s.clip_min:g})" if s.clips
                else "no clip")
        return (f"batch scaling {self.rule}: global batch {t.global_batch:,} = {self.k:g} x base "
                f"{t.base_batch:,}: {change('embedding lr', g['store_lr'], s.lr)}, "
                f"{change('embedding L2', g['store_l2'], s.l2)}, "
                f"{change('dense lr', g['dense_lr'], t.dense_lr)}{warm}, {clip}")


def scaled(train: TrainConfig, store: StoreConfig) -> Scaling:
    """Apply ``train.batch_scaling`` to the given settings (a pure function of both).

    Args:
        train: The loop's settings as given (``global_batch``, ``base_batch``, the rule).
        store: The store's settings as given.

    Returns:
        The settings the rule sets, with what it changed.
    """
    rule, k = train.batch_scaling, train.global_batch / train.base_batch
    given = {"store_lr": store.lr, "store_l2": store.l2, "dense_lr": train.dense_lr}
    emb_lr, l2, dense_lr = store.lr, store.l2, train.dense_lr
    if rule == "cowclip":
        l2, dense_lr = l2 * k, dense_lr * math.sqrt(k)
    elif rule in ("sqrt", "linear"):
        factor = math.sqrt(k) if rule == "sqrt" else k
        emb_lr, dense_lr = emb_lr * factor, dense_lr * factor
    clip = store.clip if store.clip != "auto" else "cowclip" if rule == "cowclip" else "none"
    warmup = (math.ceil(train.scaling_warmup / train.global_batch)
              if rule != "none" and k > 1 else 0)
    return Scaling(rule, k, replace(train, dense_lr=dense_lr),
                   replace(store, lr=emb_lr, l2=l2, clip=clip), warmup, given)
