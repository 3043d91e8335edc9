"""What the trainer really does, counted per step: rows, replicas, staleness, bytes by purpose.

Bytes are what crosses between ranks (a rank's messages to itself are free and not counted),
by purpose (:data:`KINDS`): ``route`` (samples sent to the rank holding their rows, with the
step's header when it rides in the same message), ``header`` (the per-step count exchanges),
``request`` (ids, push counts and the owners' staleness notices), ``response`` (rows,
and the optimizer state of refreshed replicas), ``gradient`` (gradients of remote rows
and replica pushes), ``flush`` (pushes of pending replica updates at evaluation/checkpoint
time), ``eval`` (read-only row fetches for evaluation), ``dense`` (the all-reduce of the dense
gradients, counted as ring all-reduce traffic), and the
online loop's own traffic between steps: ``control`` (the per-step control all-reduce),
``window`` (access-window samples gathered for the partitioner), ``placement`` (new placements
broadcast) and ``migrate`` (rows handed to new owners).
:attr:`Totals.embedding_bytes` is the training path only (``route`` to ``flush``): the traffic
a placement changes, comparable between static and online runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

__all__ = ["EMBEDDING_KINDS", "KINDS", "ONLINE_KINDS", "PHASES", "Traffic", "StepCounters", "Totals"]

KINDS = ("route", "header", "request", "response", "gradient", "flush", "eval", "dense",
         "control", "window", "placement", "migrate")
ONLINE_KINDS = ("control", "window", "placement", "migrate")
PHASES = ("route", "read", "compute", "write", "dense")
EMBEDDING_KINDS = ("route", "header", "request", "response", "gradient", "flush")


@dataclass
class Traffic:
    """Bytes sent and received by one rank, per purpose (cumulative), and the time spent in the
    collectives that moved them.

    ``seconds`` is the wall time inside each collective, waiting for the slowest peer included:
    on a shared CPU most of it is waiting, so it shows where ranks fall out of step rather than
    what the wire costs. A collective left running (the dense all-reduce, and since cea027a the
    row exchange's request, response and gradient all-to-alls) counts only the wait left at
    ``wait()``, after the work done meanwhile. ``calls`` counts the timed collectives. With
    gloo a collective returns when it is done; with NCCL it returns once queued, so on CUDA the
    time is the launch only.
    Bytes counted outside a timed collective (the placement broadcast) add no time.
    """

    sent: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS), np.int64))
    received: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS), np.int64))
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS)))
    calls: np.ndarray = field(default_factory=lambda: np.zeros(len(KINDS), np.int64))

    def add(self, kind: str, sent: int, received: int, seconds: float | None = None) -> None:
        """Count one exchange; ``seconds``: the collective's wall time, when it was timed."""
        i = KINDS.index(kind)
        self.sent[i] += sent
        self.received[i] += received
        if seconds is not None:
            self.seconds[i] += seconds
            self.calls[i] += 1

    def copy(self) -> Traffic:
        """A snapshot."""
        return Traffic(self.sent.copy(), self.received.copy(), self.seconds.copy(),
                       self.calls.copy())

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.sent + other.sent, self.received + other.received,
                       self.seconds + other.seconds, self.calls + other.calls)

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.sent - other.sent, self.received - other.received,
                       self.seconds - other.seconds, self.calls - other.calls)

    def merge(self, other: Traffic) -> Traffic:
        """Two ranks' traffic over the same steps: bytes add up; the time in collectives is
        the longer wait of the two, per kind (the rank that waits longest is usually the
        fastest one)."""
        return Traffic(self.sent + other.sent, self.received + other.received,
                       np.maximum(self.seconds, other.seconds),
                       np.maximum(self.calls, other.calls))


@dataclass
class StepCounters:
    """One rank's counts for one step.

    Attributes:
        samples_read: Samples this rank took from its source.
        samples_trained: Samples this rank trained on (after routing).
        samples_routed_out: Samples sent to another rank.
        global_samples: Samples of the step over all ranks.
        unique_ids: Distinct ids in this rank's batch (each looked up once).
        owned_reads: Of those, rows this rank owns.
        replica_reads: Rows read from a local replica (fresh enough or refreshed).
        replica_refreshes: Replica reads that the owner answered with a new value.
        replica_pushes: Replicas that pushed their accumulated updates to the owner.
        remote_rows: Rows fetched from owners without a local copy.
        rows_served: Rows this rank sent as owner (fetches and refreshes).
        staleness: Histogram of the lag at replica reads of rows this rank owns (the owner
            keeps each copy's lag): entry ``k`` counts reads whose copy was ``k`` updates
            behind (refreshed reads count as 0). Summed over ranks, every replica read of the
            step. Its length is not capped, so a lag above the bound would show rather than be
            clipped.
        traffic: Bytes by purpose.
        loss_sum: Summed log-loss of ``loss_samples`` samples this rank trained: this step's,
            or on the device path (which reads the loss back with the next step's counts,
            not in a wait of its own) the last step's.
        loss_samples: Samples whose loss ``loss_sum`` is.
        seconds: Wall time by phase (:data:`PHASES`): routing (with the batch's
            deduplication when samples are not routed), row reads, forward/backward, row
            writes, dense all-reduce and update (the wait for the previous step's all-reduce
            and its update, which the step applies before training). Waiting for peers counts
            in the phase whose collective waited.
    """

    samples_read: int = 0
    samples_trained: int = 0
    samples_routed_out: int = 0
    global_samples: int = 0
    unique_ids: int = 0
    owned_reads: int = 0
    replica_reads: int = 0
    replica_refreshes: int = 0
    replica_pushes: int = 0
    remote_rows: int = 0
    rows_served: int = 0
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    traffic: Traffic = field(default_factory=Traffic)
    loss_sum: float = 0.0
    loss_samples: int = 0
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(len(PHASES)))

    @property
    def rows_not_held(self) -> int:
        """Rows neither owned nor held fresh: HET-GMP's remote rows (fetches + refreshes)."""
        return self.remote_rows + self.replica_refreshes


_SCALARS = tuple(
    f.name for f in fields(StepCounters)
    if f.name not in ("staleness", "traffic", "loss_sum", "loss_samples", "seconds")
)


@dataclass
class Totals:
    """Counters summed over steps (and, with :meth:`merge`, over ranks)."""

    steps: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_SCALARS, 0))
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    traffic: Traffic = field(default_factory=Traffic)
    loss_sum: float = 0.0
    loss_samples: int = 0
    seconds: np.ndarray = field(default_factory=lambda: np.zeros(len(PHASES)))

    def add(self, c: StepCounters) -> None:
        """Add one step of one rank."""
        self.steps += 1
        for name in _SCALARS:
            self.counts[name] += int(getattr(c, name))
        self.staleness = _add_hist(self.staleness, c.staleness)
        self.traffic = self.traffic + c.traffic
        self.loss_sum += c.loss_sum
        self.loss_samples += c.loss_samples
        self.seconds = self.seconds + c.seconds

    def merge(self, other: Totals) -> Totals:
        """Totals of two ranks over the same steps (step-level values are not doubled)."""
        out = Totals(steps=max(self.steps, other.steps))
        out.counts = {k: self.counts[k] + other.counts[k] for k in self.counts}
        # Every rank sees the whole global batch: keep one rank's figure.
        out.counts["global_samples"] = max(self.counts["global_samples"],
                                           other.counts["global_samples"])
        out.staleness = _add_hist(self.staleness, other.staleness)
        out.traffic = self.traffic.merge(other.traffic)
        out.loss_sum = self.loss_sum + other.loss_sum
        out.loss_samples = self.loss_samples + other.loss_samples
        # Ranks run their phases side by side: the slower rank's time is the job's.
        out.seconds = np.maximum(self.seconds, other.seconds)
        return out

    @property
    def samples(self) -> int:
        """Samples trained (over all ranks, when merged)."""
        return self.counts["samples_trained"]

    @property
    def embedding_bytes(self) -> int:
        """Bytes sent for the embedding path: routing, headers, requests, rows, gradients."""
        idx = [KINDS.index(k) for k in EMBEDDING_KINDS]
        return int(self.traffic.sent[idx].sum())

    @property
    def dense_bytes(self) -> int:
        """Bytes sent for the dense all-reduce."""
        return int(self.traffic.sent[KINDS.index("dense")])

    @property
    def max_staleness(self) -> int:
        """Largest lag seen at a replica read (-1 when no replica was read)."""
        nz = np.flatnonzero(self.staleness)
        return int(nz[-1]) if nz.size else -1

    def per_sample(self, value: float) -> float:
        """``value`` divided by the samples trained (0 without samples)."""
        return value / self.samples if self.samples else 0.0

    def summary(self) -> dict[str, float | int | list[int]]:
        """A flat dict for reports and JSON lines."""
        out: dict[str, float | int | list[int]] = dict(self.counts)
        out.update(
            steps=self.steps,
            embedding_bytes=self.embedding_bytes,
            dense_bytes=self.dense_bytes,
            bytes_per_sample=self.per_sample(self.embedding_bytes),
            dense_bytes_per_sample=self.per_sample(self.dense_bytes),
            remote_rows_per_sample=self.per_sample(
                self.counts["remote_rows"] + self.counts["replica_refreshes"]),
            staleness_histogram=[int(x) for x in self.staleness],
            max_staleness=self.max_staleness,
            mean_loss=self.loss_sum / self.loss_samples if self.loss_samples else float("nan"),
        )
        for kind, sent, secs in zip(KINDS, self.traffic.sent, self.traffic.seconds):
            out[f"bytes_{kind}"] = int(sent)
            out[f"collective_seconds_{kind}"] = round(float(secs), 4)
        for phase, secs in zip(PHASES, self.seconds):
            out[f"seconds_{phase}"] = round(float(secs), 4)
        return out


def _add_hist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = max(a.size, b.size)
    out = np.zeros(n, np.int64)
    out[: a.size] += a
    out[: b.size] += b
    return out
