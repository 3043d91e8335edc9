"""The training loop's settings (``--staleness``, ``--global-batch``, ``--placement``, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from partitioner import ReplicaBasis, check_replica_basis

__all__ = ['TrainConfig']


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
    log_every: int = field(default=50, metadata={"help": "steps between progress lines (0 = off)"})

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.global_batch < 1 or self.steps < 0 or self.warmup < 0:
            raise ValueError("staleness, steps, warmup >= 0 and global_batch >= 1 required")
        if self.route_epsilon < 0 or self.route_rounds < -1:
            raise ValueError("route_epsilon must be >= 0 and route_rounds >= -1 (-1: auto)")
        if not 0.0 <= self.replica_fraction <= 1.0 or self.dense_lr <= 0:
            raise ValueError("replica_fraction in [0, 1] and dense_lr > 0 required")
        check_replica_basis(self.replica_basis)

    @property
    def routes(self) -> bool:
        """Whether samples are routed to the rank holding their rows (at start: with
        ``placement="auto"`` the online loop turns routing on while graph is in force)."""
        if self.route == "auto":  # auto placement: on here, the online loop decides after
            return self.placement in ("graph", "auto")
        return self.route == "on"
