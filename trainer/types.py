"""Values of the trainer: one frozen config dataclass per component, and what a rank reports.

Each config's fields carry a ``help`` text, so :func:`runtime.add_flags` turns it into
command-line flags with environment fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from partitioner import ReplicaBasis, check_replica_basis

__all__ = [
    "StoreConfig",
    "ModelConfig",
    "TrainConfig",
    "LaunchConfig",
    "OnlineConfig",
    "ServeConfig",
    "Interval",
]


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


@dataclass(frozen=True)
class ModelConfig:
    """The CTR model: architecture, embedding dimension, layer sizes, float type."""

    model: Literal["widedeep", "deepfm", "dcn"] = field(
        default="deepfm", metadata={"help": "CTR model"}
    )
    embed_dim: int = field(default=16, metadata={"help": "embedding dimension"})
    hidden: tuple[int, ...] = field(
        default=(128, 64), metadata={"help": "hidden layer sizes of the deep part"}
    )
    cross_layers: int = field(default=2, metadata={"help": "cross layers of DCN"})
    dtype: Literal["float32", "float64"] = field(
        default="float32", metadata={"help": "parameter and exchange float type"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the dense parameters"})
    autocast: Literal["off", "bf16"] = field(
        default="off",
        metadata={"help": "bf16: the model's forward and backward in training under "
                  "torch.autocast(bfloat16) (rows, parameters and their updates stay float32; "
                  "needs --dtype float32)"},
    )

    compile: Literal["off", "on"] = field(
        default="off",
        metadata={"help": "on: the model's training forward and backward go through "
                  "torch.compile (Inductor; compiled once per rank at the first step, 9-20 s "
                  "on a CPU the first time and about 2 s once Inductor's on-disk cache has the "
                  "kernels; the batch dimension is dynamic, so uneven local batches do not "
                  "recompile); prediction stays eager"},
    )

    def __post_init__(self) -> None:
        if self.embed_dim < 1 or self.cross_layers < 0 or any(h < 1 for h in self.hidden):
            raise ValueError("embed_dim and hidden sizes must be positive, cross_layers >= 0")
        if self.autocast == "bf16" and self.dtype != "float32":
            raise ValueError("autocast bf16 needs dtype float32 (float64 is for exact checks)")

    @property
    def first_order(self) -> bool:
        """Whether each row carries a first-order (linear) weight in front of its vector.

        Wide&Deep's wide part and DeepFM's first-order term are per-id scalars; keeping them as
        column 0 of the same row means one lookup, one exchange and one optimizer per id.
        """
        return self.model in ("widedeep", "deepfm")

    @property
    def row_dim(self) -> int:
        """Width of a stored embedding row."""
        return self.embed_dim + (1 if self.first_order else 0)


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
        default=0,
        metadata={"help": "batch-aware routing: rounds of moves after routing a rank's batch, "
                  "so that samples gather where their rows are fetched anyway "
                  "(partitioner.batch_routing; 0 = off)"},
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
        if self.route_epsilon < 0 or self.route_rounds < 0:
            raise ValueError("route_epsilon and route_rounds must be >= 0")
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


# --checkpoint-interval auto: this often with a checkpoint directory, plus one at the first
# publish. Bounds what a crash replays and how much delta log a starting serve reads.
AUTO = "auto"
AUTO_CHECKPOINT_S = 300.0


@dataclass(frozen=True)
class Interval:
    """Every ``count`` records, or every ``seconds`` seconds; parsed from ``"100000"`` / ``"30s"``.

    ``"0"`` (or an empty string) is never.
    """

    count: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        # A negative interval used to parse as one that never fires: the placement silently
        # stayed static.
        if self.count < 0 or not 0.0 <= self.seconds < float("inf"):
            raise ValueError(f"an interval must be a non-negative number of records or "
                             f"seconds, got {self.count or self.seconds}")

    @classmethod
    def parse(cls, text: str) -> Interval:
        """``N`` records or ``Ns`` seconds (``Nm`` minutes)."""
        t = str(text).strip().lower()
        if not t or t == "0":
            return cls()
        try:
            if t.endswith("s"):
                count, seconds = 0, float(t[:-1])
            elif t.endswith("m"):
                count, seconds = 0, 60.0 * float(t[:-1])
            else:
                count, seconds = int(t.replace("_", "")), 0.0
        except ValueError:
            raise ValueError(f"interval {text!r}: expected records (100000) or seconds (30s)") \
                from None
        if count < 0 or seconds < 0:
            raise ValueError(f"interval {text!r} is negative: give records (100000), seconds "
                             f"(30s), or 0 for never")
        return cls(count=count, seconds=seconds)

    @property
    def enabled(self) -> bool:
        """Whether the interval ever fires."""
        return self.count > 0 or self.seconds > 0

    def due(self, records: int, seconds: float) -> bool:
        """Whether ``records`` records or ``seconds`` seconds since the last firing reach it."""
        return (self.count > 0 and records >= self.count) or (
            self.seconds > 0 and seconds >= self.seconds)


@dataclass(frozen=True)
class OnlineConfig:
    """The online loop: repartitioning on the stream, live migration, checkpoints, bounded runs."""

    repartition_interval: str = field(
        default="100000",
        metadata={"help": "repartition every N records (e.g. 100000) or every N seconds (30s); "
                  "0 = never (the placement stays as set at start)"},
    )
    drift_threshold: float = field(
        default=0.25,
        metadata={"help": "repartition early when remote rows per sample rise this fraction "
                  "above the level measured after the last placement (0 = off)"},
    )
    window: int = field(
        default=200_000, metadata={"help": "samples in the partitioner's access window"}
    )
    window_sample: float = field(
        default=1.0,
        metadata={"help": "fraction of the samples sent to rank 0's window (less traffic, "
                  "coarser graph)"},
    )
    auto_margin: float = field(
        default=0.03,
        metadata={"help": "--placement auto keeps a graph placement when everything the ranks "
                  "send per sample under it (window, placements, migrations included) is at "
                  "most (1 - this) of what they sent under hash"},
    )
    migration_chunk_bytes: int = field(
        default=2 << 20,
        metadata={"help": "most bytes of rows moved between two steps during a migration"},
    )
    checkpoint_dir: str = field(
        default="", metadata={"help": "directory of checkpoints ('' = no checkpoints)"}
    )
    checkpoint_interval: str = field(
        default="auto",
        metadata={"help": "checkpoint every N records or every N seconds (60s), 0 = only at "
                  "the end of a run and on SIGTERM, or auto: every 300 s and once at the first "
                  "publish of a fresh run, so that `hetgmp serve` (which starts from a "
                  "checkpoint) can start while it trains; only with --checkpoint-dir"},
    )
    keep_checkpoints: int = field(default=3, metadata={"help": "complete checkpoints kept"})
    resume: bool = field(
        default=False,
        metadata={"help": "start from the latest complete checkpoint in --checkpoint-dir "
                  "(any number of ranks; rows are re-homed by the placement)"},
    )
    max_records: int = field(
        default=0, metadata={"help": "end the run after this many records over all ranks (0 = "
                             "until the source ends)"}
    )
    publish_interval: float = field(
        default=1.0,
        metadata={"help": "seconds between publishes of the model's changes to the delta log "
                  "that `hetgmp serve` follows (0 = off); on with a Kafka source and "
                  "--checkpoint-dir"},
    )
    model_topic: str = field(
        default="", metadata={"help": "the delta-log topic ('' = <topic>.model)"}
    )
    delta_key_file: str = field(
        default="", metadata={"help": "sign every delta-log message with the key in this file "
                              "(HMAC-SHA256; hetgmp serve given the same file applies only "
                              "what it signed; '' = unsigned)"}
    )
    history: int = field(
        default=20_000, metadata={"help": "most recent steps whose records the loop keeps for "
                                  "the run's report (memory stays bounded on a long run)"})

    def __post_init__(self) -> None:
        Interval.parse(self.repartition_interval)
        self.checkpoint  # noqa: B018 (parses: a bad interval is refused here)
        if self.drift_threshold < 0 or self.window < 1 or self.migration_chunk_bytes < 1:
            raise ValueError("drift_threshold >= 0, window >= 1, migration_chunk_bytes >= 1")
        if not 0 < self.window_sample <= 1 or self.keep_checkpoints < 1 or self.max_records < 0:
            raise ValueError("window_sample in (0, 1], keep_checkpoints >= 1, max_records >= 0")
        if not 0.0 <= self.auto_margin < 1.0:
            raise ValueError(f"auto_margin {self.auto_margin}: must lie in [0, 1)")
        if self.publish_interval < 0:
            raise ValueError("publish_interval >= 0 (0 = no delta log)")
        if self.history < 1:
            raise ValueError(f"history must keep at least one step, not {self.history}")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir")
        if self.checkpoint_interval != AUTO and self.checkpoint.enabled \
                and not self.checkpoint_dir:
            raise ValueError("--checkpoint-interval needs --checkpoint-dir")

    @property
    def repartition(self) -> Interval:
        """When to repartition."""
        return Interval.parse(self.repartition_interval)

    @property
    def checkpoint(self) -> Interval:
        """When to checkpoint (``auto``: every 300 s with a checkpoint directory)."""
        if self.checkpoint_interval.strip().lower() == AUTO:
            return Interval(seconds=AUTO_CHECKPOINT_S if self.checkpoint_dir else 0.0)
        return Interval.parse(self.checkpoint_interval)

    @property
    def checkpoint_at_first_publish(self) -> bool:
        """A fresh run checkpoints at its first publish (``--checkpoint-interval auto``)."""
        return self.checkpoint_interval.strip().lower() == AUTO


@dataclass(frozen=True)
class ServeConfig:
    """Where the model comes from and how requests are answered."""

    checkpoint_dir: str = field(
        default="", metadata={"help": "the training job's checkpoint directory (required): "
                              "the newest complete checkpoint is loaded, or waited for"})
    model_topic: str = field(
        default="", metadata={"help": "the delta-log topic ('' = the one the checkpoint "
                              "names)"})
    host: str = field(default="127.0.0.1", metadata={
        "help": "address to listen on (0.0.0.0 for every interface)"})
    port: int = field(default=8500, metadata={"help": "port to listen on"})
    format: Literal["tsv", "json"] = field(default="tsv", metadata={
        "help": "record format of a request that names no Content-Type"})
    schema: str = field(default="criteo", metadata={
        "help": "field names, as the consumer's --consumer-schema ('criteo', '13,26' or "
                "'label=y;dense=a,b;sparse=c,d')"})
    max_body_bytes: int = field(default=8 << 20, metadata={
        "help": "largest request body (bigger ones get 413)"})
    max_records: int = field(default=65536, metadata={"help": "most records in one request"})
    max_record_bytes: int = field(default=65536, metadata={
        "help": "longer records are malformed"})
    threads: int = field(default=2, metadata={"help": "threads that decode and score "
                                              "(torch intra-op threads: 1 each)"})
    wait_s: float = field(default=0.0, metadata={
        "help": "how long to wait for a first checkpoint (0 = as long as it takes)"})
    follow: bool = field(default=True, metadata={
        "help": "follow the delta log (off: serve the checkpoint as it is)"})
    delta_key_file: str = field(default="", metadata={
        "help": "apply only delta-log messages signed with the key in this file (the "
                "trainer's --delta-key-file; '' = an unsigned log)"})
    header_timeout_s: float = field(default=10.0, metadata={
        "help": "close a connection that has not sent a whole request head this long after "
                "it opened or after its last reply (idle keep-alive connections too)"})
    body_timeout_s: float = field(default=30.0, metadata={
        "help": "answer 408 to a request whose body has not arrived this long after its head"})
    max_inflight_bytes: int = field(default=64 << 20, metadata={
        "help": "most request-body bytes held in memory at once (reserved as a request's "
                "Content-Length, or --max-body-bytes without one); past it requests get 503 "
                "with Retry-After"})

    def __post_init__(self) -> None:
        if self.format not in ("tsv", "json"):
            raise ValueError(f"format must be tsv or json, not {self.format!r}")
        if not 0 < self.port < 65536 and self.port != 0:
            raise ValueError(f"port {self.port} is not a TCP port")
        if self.max_body_bytes < 1 or self.max_records < 1 or self.threads < 1:
            raise ValueError("max_body_bytes, max_records and threads must be positive")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s must be positive")
        if self.max_inflight_bytes < self.max_body_bytes:
            raise ValueError(f"max_inflight_bytes ({self.max_inflight_bytes}) must hold one "
                             f"body of max_body_bytes ({self.max_body_bytes})")
        if self.wait_s < 0:
            raise ValueError("wait_s >= 0")
