"""The online loop's settings (repartitioning, migration, checkpoints, publishing) and its intervals."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ['AUTO', 'AUTO_CHECKPOINT_S', 'Interval', 'OnlineConfig']


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
    keep_checkpoints: int = field(
        default=3, metadata={"help": "complete checkpoints kept (with the ones they are "
                             "increments of)"})
    checkpoint_full_every: int = field(
        default=8,
        metadata={"help": "one checkpoint in this many writes every row; the others write the "
                  "rows changed since the checkpoint before (an increment: its cost grows with "
                  "what changed, not with the table); a resume reads at most this many; 1 = "
                  "every checkpoint full"})
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
        if self.checkpoint_full_every < 1:
            raise ValueError(f"--checkpoint-full-every {self.checkpoint_full_every}: at least 1 "
                             "(every checkpoint full)")
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
