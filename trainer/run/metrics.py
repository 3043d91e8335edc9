"""Prometheus metrics of one trainer rank, built on a registry you pass in.

Nothing is created at import. :class:`TrainerMetrics` keeps plain numbers that the training thread
updates once a step (under a lock) and turns them into metric families when Prometheus scrapes, so a
scrape always sees whole steps: ``remote_rows`` and ``samples_trained`` of the same step, never one
without the other. Every series carries the constant label ``rank``.

Counters (each sample name ends in ``_total``):
    ``hetgmp_steps_total``, ``hetgmp_samples_read_total``, ``hetgmp_samples_trained_total``,
    ``hetgmp_unique_rows_total`` (distinct ids looked up), ``hetgmp_owned_rows_total``,
    ``hetgmp_replica_reads_total``, ``hetgmp_replica_refreshes_total``,
    ``hetgmp_replica_pushes_total``, ``hetgmp_remote_rows_total`` (rows fetched from owners without
    a local copy), ``hetgmp_rows_served_total`` (rows sent as owner),
    ``hetgmp_exchanged_bytes_total{direction="sent"|"received", kind}`` (kinds:
    :data:`hetgmp.trainer.dist.counters.KINDS`), ``hetgmp_collective_seconds_total{kind}`` (wall time inside
    the collectives of each kind, waiting for peers included; on CUDA the host's time in the
    call, which torch documents as returning before the NCCL operation has finished on the
    device, so there the wait falls in whatever next reads the result on the host),
    ``hetgmp_migration_steps_total``
    (steps taken while a migration was in progress),
    ``hetgmp_repartitions_total{kind="full"|"incremental"}``,
    ``hetgmp_partitioner_moves_total{step}`` (rows an incremental pass moved, by step:
    ``partitioner.PassReport.STEPS``),
    ``hetgmp_migrated_rows_total``, ``hetgmp_migrated_bytes_total``, ``hetgmp_migrations_total``,
    ``hetgmp_checkpoints_total``, ``hetgmp_train_logloss_total`` (log-loss summed over the
    samples trained: ``sum(rate(...))`` over that of ``hetgmp_samples_trained_total`` is the mean
    loss of every sample the job trained in the window, whatever each rank's share).
Histograms:
    ``hetgmp_step_duration_seconds`` (5 ms .. 10 s), ``hetgmp_replica_staleness_updates`` (lag of
    the copy at each replica read of a row this rank owns, in updates; 0 .. 1000),
    ``hetgmp_freshness_seconds`` (record appended to Kafka -> its gradient applied; 0.05 .. 60 s),
    ``hetgmp_repartition_duration_seconds{kind}``, ``hetgmp_migration_duration_seconds``.
Gauges:
    ``hetgmp_train_loss`` (mean log-loss of the samples this rank trained in its last step that
    trained any: a rank left without samples keeps its last value, so for the job's loss prefer
    the ratio of sums above), ``hetgmp_remote_rows_per_sample``
    (last step, this rank: rows neither owned nor held fresh, i.e. fetches plus replica refreshes,
    per sample trained; the figure the reports call remote rows per sample),
    ``hetgmp_placement_version``, ``hetgmp_rows_owned``, ``hetgmp_rows_replicated``,
    ``hetgmp_placement_graph`` and ``hetgmp_placement_{hash,graph}_bytes_per_sample``
    (``--placement auto``: graph in force, and the measured costs of the last decision),
    ``hetgmp_batch_routing_rounds`` and ``hetgmp_batch_routing_seconds_{saved,cost}_per_step``
    (batch-aware routing in force, and what the last decision of ``--route-rounds -1`` weighed),
    ``hetgmp_imbalance_ratio{what="samples"|"rows"}`` (max / mean over ranks),
    ``hetgmp_checkpoint_age_seconds`` (computed at scrape time), ``hetgmp_heldout_auc``,
    ``hetgmp_staleness_bound_updates``.
The store (:meth:`TrainerMetrics.on_store`):
    ``hetgmp_store_rows{tier="memory"|"disk"}``, ``hetgmp_store_disk_bytes`` (the disk tier's
    files), counters ``hetgmp_store_{looked_up,created,evicted,spilled,restored}_rows_total``
    (evicted: dropped; spilled: written to the disk tier; restored: read back from it; the
    memory tier's hit rate is ``1 - rate(restored) / rate(looked_up)``). The disk series appear
    with ``--store-disk-dir`` only.

A gauge that has no value yet (loss before the first step, AUC before the first evaluation,
placement before the first placement, checkpoint age before the first checkpoint) has no sample
at all rather than NaN: ``absent()`` says what it means, and a NaN would turn ``avg()`` over ranks
into NaN.

The histograms are filled with whole arrays (a step can read 100k replicas): each keeps its own
bucket counts, so a step costs one ``numpy`` pass, not one ``observe()`` per value.

Consumer metrics (records consumed, decode errors by reason, dead letters, offsets) come from
:class:`hetgmp.streaming.metrics.ConsumerCollector`; register it on the same registry with
``labels={"rank": str(rank)}``. Consumer lag is not exported here: on the embedded Tansu broker
``end_offsets()`` returns the base offset of the last batch + 1, not the high watermark (FACTS.md),
so a lag computed from it is wrong; the dashboard compares records produced and consumed instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hetgmp.partitioner import PassReport
from hetgmp.streaming import serve_metrics as serve
from hetgmp.trainer.dist import KINDS, StepCounters

__all__ = ["TrainerMetrics", "check_metrics_port", "serve_rank"]

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STALENESS_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
# A full METIS partition of a few million edges takes seconds; an incremental pass far less.
REPARTITION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MIGRATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
REPARTITION_KINDS = ("full", "incremental")

# (metric name, help, StepCounters field): counters that add one field of each step.
_STEP_FIELDS = (
    ("hetgmp_samples_read_total", "Samples this rank took from its source.", "samples_read"),
    ("hetgmp_samples_trained_total", "Samples this rank trained on (after routing).", "samples_trained"),
    ("hetgmp_unique_rows_total", "Distinct ids looked up (each once per step).", "unique_ids"),
    ("hetgmp_owned_rows_total", "Distinct ids looked up that this rank owns.", "owned_reads"),
    ("hetgmp_replica_reads_total", "Rows read from a local replica.", "replica_reads"),
    ("hetgmp_replica_refreshes_total", "Replica reads the owner answered with a new value.",
     "replica_refreshes"),
    ("hetgmp_replica_pushes_total", "Replicas that pushed their pending updates to the owner.",
     "replica_pushes"),
    ("hetgmp_remote_rows_total", "Rows fetched from owners without a local copy.", "remote_rows"),
    ("hetgmp_rows_served_total", "Rows this rank sent as owner (fetches and refreshes).", "rows_served"),
    ("hetgmp_train_logloss_total",
     "Log-loss summed over the samples this rank trained (its rate over "
     "hetgmp_samples_trained_total's is the mean loss over any window and ranks).", "loss_sum"),
)
# (metric name, help): counters updated by the other events.
_EVENT_COUNTERS = (
    ("hetgmp_steps_total", "Training steps taken."),
    ("hetgmp_migration_steps_total", "Steps taken while a migration was in progress."),
    ("hetgmp_migrated_rows_total", "Embedding rows this rank received in migrations."),
    ("hetgmp_migrated_bytes_total", "Bytes of rows, optimizer state and versions received in migrations."),
    ("hetgmp_migrations_total", "Migrations completed."),
    ("hetgmp_checkpoints_total", "Checkpoints written."),
)
# (metric name, help): gauges without labels besides rank.
_GAUGES = (
    ("hetgmp_train_loss",
     "Mean log-loss of the samples this rank trained in its last step that trained any."),
    ("hetgmp_remote_rows_per_sample",
     "Last step: rows neither owned nor held fresh (fetches + refreshes) per sample trained."),
    ("hetgmp_placement_version", "Version of the placement this rank trains with."),
    ("hetgmp_placement_graph",
     "--placement auto: 1 while a graph placement is in force (tried or kept), 0 on hash."),
    ("hetgmp_placement_hash_bytes_per_sample",
     "--placement auto: bytes all ranks sent per sample on hash, as of the last decision."),
    ("hetgmp_placement_graph_bytes_per_sample",
     "--placement auto: bytes all ranks sent per sample on graph (loop traffic included), as "
     "of the last decision."),
    ("hetgmp_batch_routing_rounds",
     "Rounds of batch-aware routing this rank's batches get (0: route alone); with "
     "--route-rounds -1, chosen by measurement."),
    ("hetgmp_batch_routing_seconds_saved_per_step",
     "--route-rounds -1: seconds of row traffic batch-aware routing saved a step, as of the "
     "last decision (rows saved times the measured seconds a row)."),
    ("hetgmp_batch_routing_seconds_cost_per_step",
     "--route-rounds -1: seconds batch-aware routing's rounds took a step, as of the last "
     "decision."),
    ("hetgmp_rows_owned", "Embedding rows this rank owns."),
    ("hetgmp_rows_replicated", "Replicas of other ranks' rows this rank holds."),
    ("hetgmp_heldout_auc", "Rolling AUC of held-out (progressive validation) records."),
    ("hetgmp_staleness_bound_updates", "Staleness bound s: replicas lag their owner by at most s updates."),
)


def _by_label(name: str, doc: str, rank: str, label: str,
              values: dict[str, float] | dict[str, int]) -> CounterMetricFamily:
    """A counter family of this rank with one series per ``label`` value."""
    family = CounterMetricFamily(name, doc, labels=["rank", label])
    for key, value in values.items():
        family.add_metric([rank, key], value)
    return family


class BucketCounts:
    """One histogram series filled with whole arrays: per-bucket counts (not cumulative) and sum.

    Args:
        bounds: Upper bounds of the buckets, increasing; ``+Inf`` is added.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = np.asarray(bounds, np.float64)
        self.counts = np.zeros(self.bounds.size + 1, np.int64)
        self.sum = 0.0

    def observe(self, values: np.ndarray | Sequence[float] | float) -> None:
        """Count each finite value in the first bucket whose bound is >= it."""
        v = np.asarray(values, np.float64).ravel()
        v = v[np.isfinite(v)]
        self.counts += np.bincount(np.searchsorted(self.bounds, v, side="left"),
                                   minlength=self.counts.size)
        self.sum += float(v.sum())

    def add_value_counts(self, counts: np.ndarray) -> None:
        """Add a histogram of integer values: ``counts[k]`` values equal to ``k``."""
        counts = np.asarray(counts, np.int64)
        values = np.arange(counts.size)
        np.add.at(self.counts, np.searchsorted(self.bounds, values, side="left"), counts)
        self.sum += float(values @ counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as Prometheus exposes them, ``+Inf`` last."""
        cum = np.cumsum(self.counts)
        return [(floatToGoString(b), float(c)) for b, c in zip(self.bounds, cum)] + [
            ("+Inf", float(cum[-1]))
        ]


class TrainerMetrics(Collector):
    """The metrics of one trainer rank (the list is in the module docstring).

    Construct it once per rank; it registers itself on ``registry``. The ``on_*`` methods are
    called from the training thread, scrapes come from the HTTP thread: both take one lock.

    Args:
        registry: Where to register (a fresh ``CollectorRegistry``, not the global one).
        rank: This trainer's rank, the constant label ``rank`` of every series.
        staleness_bound: The bound ``s`` the rank trains with.
        clock: Wall clock (seconds since the epoch) for the checkpoint age; tests pass a fake one.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        rank: int,
        staleness_bound: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rank = str(rank)
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {name: 0 for name, _, _ in _STEP_FIELDS}
        self._counts.update({name: 0 for name, _ in _EVENT_COUNTERS})
        self._gauges: dict[str, float] = {}
        self._bytes: dict[tuple[str, str], int] = {
            (d, k): 0 for d in ("sent", "received") for k in KINDS
        }
        self._collective_s = dict.fromkeys(KINDS, 0.0)
        self._imbalance: dict[str, float] = {}
        self._task_auc: dict[str, float] = {}
        self._repartitions = {k: 0 for k in REPARTITION_KINDS}
        self._pass_moves = dict.fromkeys(PassReport.STEPS, 0)
        self._step = BucketCounts(STEP_BUCKETS)
        self._staleness = BucketCounts(STALENESS_BUCKETS)
        self._freshness = BucketCounts(FRESHNESS_BUCKETS)
        self._repartition = {k: BucketCounts(REPARTITION_BUCKETS) for k in REPARTITION_KINDS}
        self._migration = BucketCounts(MIGRATION_BUCKETS)
        self._checkpoint_at: float | None = None
        self._store: dict[str, int] = {}
        self.set_staleness_bound(staleness_bound)
        registry.register(self)

    # -- updates (training thread) ---------------------------------------------------------------

    def on_step(
        self, counters: StepCounters, step_seconds: float, freshness_s: np.ndarray, migrating: bool
    ) -> None:
        """Count one step.

        Args:
            counters: This rank's counts of the step.
            step_seconds: Wall time of the whole step.
            freshness_s: Per record trained: seconds from its append to Kafka to now (gradient
                applied). Negative values (clock skew between hosts) count as 0; NaN is skipped.
            migrating: Whether a migration was in progress during the step.
        """
        fresh = np.maximum(np.asarray(freshness_s, np.float64), 0.0)
        traffic = counters.traffic
        with self._lock:
            self._counts["hetgmp_steps_total"] += 1
            self._counts["hetgmp_migration_steps_total"] += int(migrating)
            for name, _, attr in _STEP_FIELDS:
                self._counts[name] += getattr(counters, attr)  # int counts; the loss a float
            for kind, sent, received in zip(KINDS, traffic.sent, traffic.received):
                self._bytes[("sent", kind)] = self._bytes.get(("sent", kind), 0) + int(sent)
                self._bytes[("received", kind)] = self._bytes.get(("received", kind), 0) + int(received)
            for kind, secs in zip(KINDS, traffic.seconds):
                self._collective_s[kind] += float(secs)
            self._step.observe(step_seconds)
            self._staleness.add_value_counts(counters.staleness)
            self._freshness.observe(fresh)
            if counters.loss_samples:
                self._gauges["hetgmp_train_loss"] = counters.loss_sum / counters.loss_samples
            self._gauges["hetgmp_remote_rows_per_sample"] = (
                counters.rows_not_held / counters.samples_trained if counters.samples_trained else 0.0
            )

    def on_placement(
        self,
        version: int,
        rows_owned: int,
        rows_replicated: int,
        imbalance_samples: float,
        imbalance_rows: float,
    ) -> None:
        """Record the placement this rank now trains with (and its imbalance, max / mean)."""
        with self._lock:
            self._gauges["hetgmp_placement_version"] = version
            self._gauges["hetgmp_rows_owned"] = rows_owned
            self._gauges["hetgmp_rows_replicated"] = rows_replicated
            self._imbalance = {"samples": imbalance_samples, "rows": imbalance_rows}

    def on_placement_choice(self, graph: bool, hash_bytes_per_sample: float | None,
                            graph_bytes_per_sample: float | None) -> None:
        """``--placement auto``: whether graph is in force, and the costs it last compared
        (None: not measured yet)."""
        with self._lock:
            self._gauges["hetgmp_placement_graph"] = int(graph)
            for name, value in (("hash", hash_bytes_per_sample),
                                ("graph", graph_bytes_per_sample)):
                if value is not None:
                    self._gauges[f"hetgmp_placement_{name}_bytes_per_sample"] = value

    def on_route_choice(self, gauges: dict[str, float]) -> None:
        """Batch-aware routing in force (``RouteChoice.gauges``: ``rounds``, and the saving and
        cost of the last decision once one was taken)."""
        with self._lock:
            for key, value in gauges.items():
                self._gauges[f"hetgmp_batch_routing_{key}"] = value

    def on_repartition(self, seconds: float, kind: str, moves: PassReport | None = None) -> None:
        """Count one repartition that took ``seconds``; ``kind`` is "full" or "incremental";
        ``moves``, what an incremental pass moved (every rank is told the same)."""
        if kind not in self._repartitions:
            raise ValueError(f"repartition kind must be one of {REPARTITION_KINDS}, not {kind!r}")
        with self._lock:
            self._repartitions[kind] += 1
            self._repartition[kind].observe(seconds)
            if moves is not None:
                for step, n in moves.moves_by_step().items():
                    self._pass_moves[step] += n

    def on_migration_chunk(self, rows: int, nbytes: int) -> None:
        """Count one chunk of rows that this rank received.

        Only the new owner counts a move, so the sum over ranks is the rows moved, not twice that.
        """
        with self._lock:
            self._counts["hetgmp_migrated_rows_total"] += rows
            self._counts["hetgmp_migrated_bytes_total"] += nbytes

    def on_migration_done(self, seconds: float) -> None:
        """Count a completed migration that took ``seconds`` (plan received -> last row applied)."""
        with self._lock:
            self._counts["hetgmp_migrations_total"] += 1
            self._migration.observe(seconds)

    def on_checkpoint(self, wall_time: float) -> None:
        """Record a checkpoint written at ``wall_time`` (seconds since the epoch)."""
        with self._lock:
            self._counts["hetgmp_checkpoints_total"] += 1
            self._checkpoint_at = wall_time

    def on_store(self, counts: dict[str, int]) -> None:
        """The store's rows by tier and its totals (:meth:`EmbeddingStore.counts`)."""
        with self._lock:
            self._store = dict(counts)

    def on_heldout_auc(self, auc: float) -> None:
        """Record the rolling AUC of held-out records."""
        with self._lock:
            self._gauges["hetgmp_heldout_auc"] = auc

    def on_task_aucs(self, aucs: dict[str, float]) -> None:
        """Record the rolling AUC of each task, by label (a schema of several labels)."""
        with self._lock:
            self._task_auc.update(aucs)

    def set_staleness_bound(self, s: int) -> None:
        """Record the staleness bound ``s`` (called at construction)."""
        with self._lock:
            self._gauges["hetgmp_staleness_bound_updates"] = s

    # -- exposition (HTTP thread) ----------------------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        """The families (for the registry's duplicate-name check)."""
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        """Metric families of everything counted so far."""
        with self._lock:
            families = self._families()
        return iter(families)

    def _families(self) -> list[Metric]:
        r = self.rank
        out: list[Metric] = []
        docs = {name: doc for name, doc, _ in _STEP_FIELDS} | dict(_EVENT_COUNTERS)
        for name, value in self._counts.items():
            counter = CounterMetricFamily(name, docs[name], labels=["rank"])
            counter.add_metric([r], value)
            out.append(counter)
        traffic = CounterMetricFamily(
            "hetgmp_exchanged_bytes_total", "Bytes this rank exchanged with other ranks, by purpose.",
            labels=["rank", "direction", "kind"],
        )
        for (direction, kind), n in self._bytes.items():
            traffic.add_metric([r, direction, kind], n)
        out.append(traffic)
        out.append(_by_label(
            "hetgmp_collective_seconds_total",
            "Wall time inside collectives, by purpose (waiting for the slowest peer included; "
            "on CUDA the host's time in the call, which can end before NCCL does).",
            r, "kind", self._collective_s))
        out.append(_by_label(
            "hetgmp_repartitions_total", "Repartitions (new placements computed), by kind.",
            r, "kind", self._repartitions))
        out.append(_by_label(
            "hetgmp_partitioner_moves_total",
            "Rows the incremental partitioner moved, by step of its passes (row_balance: moves "
            "the balance constraint forced, outside the move budget); every rank reports the "
            "same counts.",
            r, "step", self._pass_moves))

        for name, doc, hist in (
            ("hetgmp_step_duration_seconds", "Wall time of a training step.", self._step),
            ("hetgmp_replica_staleness_updates",
             "Updates a copy was behind this rank, its owner, at each replica read.", self._staleness),
            ("hetgmp_freshness_seconds",
             "Seconds from a record's append to Kafka to its gradient being applied.", self._freshness),
            ("hetgmp_migration_duration_seconds", "Wall time of a migration.", self._migration),
        ):
            family = HistogramMetricFamily(name, doc, labels=["rank"])
            family.add_metric([r], hist.buckets(), hist.sum)
            out.append(family)
        by_kind = HistogramMetricFamily(
            "hetgmp_repartition_duration_seconds", "Wall time of a repartition, by kind.",
            labels=["rank", "kind"],
        )
        for kind, hist in self._repartition.items():
            by_kind.add_metric([r, kind], hist.buckets(), hist.sum)
        out.append(by_kind)

        for name, doc in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["rank"])
            if name in self._gauges:
                gauge.add_metric([r], self._gauges[name])
            out.append(gauge)
        imbalance = GaugeMetricFamily(
            "hetgmp_imbalance_ratio", "Max / mean over ranks of samples per step and of rows owned.",
            labels=["rank", "what"],
        )
        for what, value in self._imbalance.items():
            imbalance.add_metric([r, what], value)
        out.append(imbalance)
        if self._task_auc:
            tasks = GaugeMetricFamily(
                "hetgmp_task_auc", "Rolling AUC of held-out (progressive validation) records, "
                "by task (label).", labels=["rank", "task"])
            for task, value in self._task_auc.items():
                tasks.add_metric([r, task], value)
            out.append(tasks)
        out.extend(_store_families(r, self._store))
        age = GaugeMetricFamily(
            "hetgmp_checkpoint_age_seconds", "Seconds since the last checkpoint was written.",
            labels=["rank"],
        )
        if self._checkpoint_at is not None:
            age.add_metric([r], self._clock() - self._checkpoint_at)
        out.append(age)
        return out


_STORE_COUNTERS = (
    ("looked_up", "Distinct ids the store looked up."),
    ("created", "Rows created (an id's first row)."),
    ("evicted", "Rows dropped: idle past --store-evict-after, or past the cap without a disk tier."),
    ("spilled", "Rows written whole to the disk tier past the cap."),
    ("restored", "Rows read back from the disk tier into memory."),
)


def _store_families(r: str, store: dict[str, int]) -> list[Metric]:
    if not store:
        return []
    rows = GaugeMetricFamily("hetgmp_store_rows", "Embedding rows this rank owns, by tier.",
                             labels=["rank", "tier"])
    rows.add_metric([r, "memory"], store["memory_rows"])
    out: list[Metric] = [rows]
    if "disk_rows" in store:
        rows.add_metric([r, "disk"], store["disk_rows"])
        disk = GaugeMetricFamily("hetgmp_store_disk_bytes",
                                 "Bytes the disk tier's files take.", labels=["rank"])
        disk.add_metric([r], store["disk_bytes"])
        out.append(disk)
    for key, doc in _STORE_COUNTERS:
        if key in store:
            counter = CounterMetricFamily(f"hetgmp_store_{key}_rows", doc, labels=["rank"])
            counter.add_metric([r], store[key])
            out.append(counter)
    return out


def check_metrics_port(base_port: int, ranks: int, *, zero: str | None) -> None:
    """Refuse a base port that would put one of ``ranks`` ranks (rank r on ``base + r``) past
    65535; ``zero`` says what 0 means where it is allowed (None: it is not).

    Raises:
        ValueError: The range the base must lie in.
    """
    top = 65536 - ranks
    if not (1 <= base_port <= top or (zero is not None and base_port == 0)):
        raise ValueError(f"metrics port {base_port}: rank r serves on it + r, so with {ranks} "
                         f"rank(s) it must lie in 1..{top}"
                         + ("" if zero is None else f" (0: {zero})"))


def serve_rank(registry: CollectorRegistry, base_port: int, rank: int, host: str = "127.0.0.1") -> int:
    """Serve ``registry`` on ``http://host:base_port+rank/metrics``; returns the port.

    The server runs in a daemon thread for the life of the process, as a rank's exporter should.
    ``base_port`` 0 lets the system pick a free port (for tests); the port is returned either way.
    """
    check_metrics_port(base_port, rank + 1, zero="a free port")
    server = serve(registry, base_port + rank if base_port else 0, host)
    return int(server.server_port)
