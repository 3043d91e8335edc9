"""The online loop: the placement follows the stream while training goes on.

:class:`OnlineLoop` runs on every rank around the training steps of
:func:`trainer.worker.run_rank`. Before each step the ranks make one small all-reduce, the
*control* vector, so that every decision is taken by every rank at the same step:

* ``stop``: a rank was asked to stop (SIGTERM) or ``--max-records`` is reached;
* ``repartition`` (rank 0): the interval has passed, or remote rows per sample rose
  ``--drift-threshold`` above the level measured after the last placement (drift), or the
  cold-start window is full;
* ``ready`` (rank 0): the partitioner has a new placement;
* ``checkpoint`` (rank 0): the checkpoint interval has passed;
* the records each rank read, the rows it did not hold and the samples it trained in the
  previous step (for the drift test and the record budget), how many window samples each
  rank sends to rank 0 now, and each rank's samples and rows (for the imbalance gauges).

Then, in this order:

1. **Window.** Each rank sends rank 0 the ids of the samples it read in the previous step and
   did not route to rank 0 (rank 0 holds those already), or a ``--window-sample`` fraction of
   them: a little every step rather than a large gather that would stall one step.
2. **Repartition.** Rank 0 hands the samples gathered since the last plan to its partitioner
   process (:class:`~trainer.partition_worker.PartitionerProcess`), which rolls them into its
   access window and computes placement ``v+1``: a full (METIS) partition at cold start, the
   incremental one after that. Training does not wait for it, and its numpy and METIS work
   never holds the training process's GIL.
3. **Placement.** When the partitioner is done, rank 0 broadcasts the placement; every rank pushes
   its pending replica updates, switches to the new replica sets and starts a
   :class:`~trainer.migrate.Migration`.
4. **Migration.** One chunk of at most ``--migration-chunk-bytes`` moves between two steps
   (:func:`~trainer.migrate.move_chunk`), until every row has its new owner.
5. **Checkpoint.** When due, and at the end of the run (source ended, ``--max-records``,
   SIGTERM): see :meth:`OnlineLoop.checkpoint` and :mod:`trainer.checkpoint`.

The loop records what the benchmark and the report need: per step the rows not held, samples,
bytes and wall time with whether a migration was in progress, freshness (a record's append to
Kafka to the end of the step that applied its gradient), and every repartition and migration.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from partitioner import PartitionConfig, PassReport, Placement
from streaming.runtime import Clock
from streaming.types import ClickBatch
from trainer import checkpoint as ckpt
from trainer.comm import Comm
from trainer.counters import KINDS, StepCounters
from trainer.migrate import Migration, move_chunk, row_bytes
from trainer.partition_worker import PartitionerProcess
from trainer.step import Trainer
from trainer.types import OnlineConfig, TrainConfig

__all__ = ["OnlineLoop", "Control", "StepRecord", "budget_share", "restore"]

log = logging.getLogger(__name__)

# Steps after a migration whose remote rows per sample set the drift baseline.
_BASELINE_STEPS = 8
# Weight of the newest step in the running level compared against the baseline.
_EWMA = 0.25
# Steps between refreshes of the placement gauges (rows owned grow as rows are created).
_PUBLISH_EVERY = 10


@dataclass
class Control:
    """What every rank decided together before a step."""

    stop: bool = False
    repartition: bool = False
    ready: bool = False
    checkpoint: bool = False
    records: int = 0
    rows_not_held: int = 0
    samples: int = 0
    window_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


@dataclass
class StepRecord:
    """One step of one rank, for benchmarks and reports."""

    step: int
    records: int
    rows_not_held: int
    samples: int
    bytes_sent: int
    seconds: float
    migrating: bool
    version: int


class OnlineLoop:
    """Repartitioning, live migration, checkpoints and the record budget around the steps.

    Args:
        comm: Collectives of the job.
        trainer: This rank's trainer.
        source: This rank's source (a Kafka source commits offsets after checkpoints).
        config: Online-loop settings.
        train: Training settings (batch, replica budget, warm-up for the cold start).
        clock: Time source.
        seed: Seed of the partitioner.
        metrics: The rank's :class:`trainer.metrics.TrainerMetrics`, or None.
        schedule: Placements to move to at given steps (tests), instead of computing them.
        records: Records trained before this run (a resumed run).
        partition: Compute placements from the stream (off: only the schedule moves rows).
        fault: ``(rank, chunk)``: that rank kills itself with SIGKILL after moving that many
            chunks of a migration (tests of crash recovery).
        extra: Settings recorded in checkpoints and checked at resume.
        resumed_step: Step of the checkpoint this run resumed from (None: a fresh start).
        check_owners: After every chunk, check on every rank that each row lives on exactly
            the rank the placement in force names (tests; costs a gather of every id).
    """

    def __init__(self, comm: Comm, trainer: Trainer, source: Any, config: OnlineConfig,
                 train: TrainConfig, clock: Clock, *, seed: int = 0, metrics: Any = None,
                 schedule: dict[int, Placement] | None = None, records: int = 0,
                 partition: bool = True, fault: tuple[int, int] | None = None,
                 extra: dict[str, Any] | None = None, check_owners: bool = False,
                 resumed_step: int | None = None) -> None:
        self.comm, self.trainer, self.source = comm, trainer, source
        self.cfg, self.train, self.clock = config, train, clock
        self.metrics = metrics
        self.schedule = dict(sorted((schedule or {}).items()))
        self.partition = partition and config.repartition.enabled
        self.fault = fault
        self.extra = extra or {}
        self.check_owners = check_owners
        self.owner_checks = 0
        self.rank, self.world = comm.rank, comm.world
        self.records = records
        self.topic: str | None = getattr(getattr(source, "spec", None), "consumer", None) and \
            source.spec.consumer.topic
        self.history: list[StepRecord] = []
        self.events: list[dict[str, Any]] = []
        self.freshness: list[np.ndarray] = []
        self.migration: Migration | None = None
        self._migration_started = 0.0
        self._migration_bytes = 0
        self._chunks_done = 0
        self._row_size = row_bytes(trainer.store.dim, trainer.store.optimizer.state_width,
                                   trainer.dtype)
        self._last = (0, 0, 0)  # records read, rows not held, samples trained: previous step
        self._window_out = np.zeros((0, trainer.n_fields), np.int64)
        self._rng = np.random.default_rng(seed + 7919 * self.rank)
        # A resumed run does not rewrite the checkpoint it started from.
        self._last_checkpoint_step = -1 if resumed_step is None else resumed_step
        self._ckpt_records, self._ckpt_time = records, clock.monotonic()
        # Rank 0: the partitioner process, the thread that waits on it, the samples on their way
        # to its window, and the drift detector.
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[tuple[Placement, float, str, PassReport | None]] | None = None
        self._parts: list[np.ndarray] = []
        self._worker: PartitionerProcess | None = None
        # A placement restored from a checkpoint is repaired incrementally, not replaced.
        self._computed = trainer.placement.ids.size > 0
        self._rep_records, self._rep_time = records, clock.monotonic()
        self._level: float | None = None
        self._baseline: float | None = None
        self._baseline_acc: list[float] = []
        self.placements = 0
        self.moved_chunk = False
        self.checkpoint_seconds = 0.0
        self._rows_sent = 0
        self.backlog = 0
        self._rounds = 0
        self.sample_imbalance = 1.0
        self.row_imbalance = 1.0
        self._started_ms = clock.time() * 1000.0
        if self.rank == 0 and self.partition:
            pc = PartitionConfig(num_workers=self.world, global_batch=train.global_batch,
                                 replica_fraction=train.replica_fraction,
                                 replica_basis=train.replica_basis, seed=seed)
            self._worker = PartitionerProcess(trainer.n_fields, config.window, pc)
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="hetgmp-partitioner")

    # -- before a step -----------------------------------------------------------------------

    def control(self) -> Control:
        """The control all-reduce and everything decided by it (collective)."""
        world = self.world
        vec = np.zeros(7 + 3 * world, np.int64)
        vec[0] = int(self.comm.stop_requested())
        if self.rank == 0:
            vec[1] = int(self._repartition_due())
            vec[2] = int(self._future is not None and self._future.done()
                         and self.migration is None)
            vec[3] = int(self._checkpoint_due())
        vec[4:7] = self._last
        vec[7 + self.rank] = self._window_out.shape[0]
        vec[7 + world + self.rank] = self._last[2]
        vec[7 + 2 * world + self.rank] = len(self.trainer.store)
        t = torch.from_numpy(vec).to(self.comm.device)
        self.comm.all_reduce_sum(t, "control")
        v = t.cpu().numpy()
        ctl = Control(stop=bool(v[0]), repartition=bool(v[1]), ready=bool(v[2]),
                      checkpoint=bool(v[3]), records=int(v[4]), rows_not_held=int(v[5]),
                      samples=int(v[6]), window_rows=v[7:7 + world].copy())
        trained, rows = v[7 + world:7 + 2 * world], v[7 + 2 * world:]
        if trained.sum():
            self.sample_imbalance = float(trained.max() / trained.mean())
        if rows.sum():
            self.row_imbalance = float(rows.max() / rows.mean())
        self.records += ctl.records
        self._rounds += 1
        if self.cfg.max_records and self.records >= self.cfg.max_records:
            ctl.stop = True
        if self.rank == 0 and ctl.samples:
            self._observe_level(ctl.rows_not_held / ctl.samples)
        return ctl

    def between_steps(self, ctl: Control) -> None:
        """Window, repartition, placement, migration chunk and checkpoint, as decided.

        Sets :attr:`moved_chunk` (a migration was in progress) and :attr:`checkpoint_seconds`
        (time spent checkpointing, which is not step time).
        """
        self.moved_chunk = self.migration is not None or ctl.ready
        self.checkpoint_seconds = 0.0
        if int(ctl.window_rows.sum()):
            self._send_window(ctl.window_rows)
        if ctl.repartition and self.rank == 0:
            self._start_partition()
        if ctl.ready:
            self._receive_placement()
        elif self.migration is None and self.schedule:
            due = [s for s in self.schedule if s <= self.trainer.step_index]
            if due:
                self._start_migration(self.schedule.pop(due[0]))
        if self.migration is not None:
            self._move_chunk()
        if ctl.checkpoint:
            t0 = self.clock.monotonic()
            self.checkpoint()
            self.checkpoint_seconds = self.clock.monotonic() - t0

    def read_cap(self) -> int | None:
        """Most records this rank may read this step under ``--max-records`` (None: no cap)."""
        if not self.cfg.max_records:
            return None
        remaining = max(self.cfg.max_records - self.records, 0)
        return budget_share(remaining, self.rank, self.world, self._rounds)

    # -- after a step ------------------------------------------------------------------------

    def after_step(self, batch: ClickBatch, c: StepCounters, seconds: float,
                   migrating: bool) -> None:
        """Account for a trained step: window samples, freshness, history, metrics."""
        n = len(batch)
        self._window_out = self._window_out[:0]
        if self.partition:
            # Every sample reaches rank 0's window once: rank 0 adds what it read and what was
            # routed to it; the others send what they read and did not route to rank 0.
            tr = self.trainer
            if self.rank == 0:
                mine = [self._sample(batch.ids), self._sample(tr.last_routed_in)]
                self._parts += [m for m in mine if m.shape[0]]
                # Trimmed here too: when no other rank sends samples (one without partitions),
                # no window exchange runs to trim them.
                self._trim_parts()
            elif n:
                keep = tr.last_dest != 0 if tr.last_dest is not None else slice(None)
                self._window_out = self._sample(batch.ids[keep])
        self._last = (n, c.rows_not_held, c.samples_trained)
        fresh = np.zeros(0)
        stamps = batch.timestamps_ms[batch.timestamps_ms > 0] if n else batch.timestamps_ms[:0]
        if stamps.size:
            now = self.clock.time() * 1000.0
            fresh = np.maximum(now - stamps, 0.0) / 1000.0
            # Records appended before this loop began waited for the job to start: a backlog,
            # not the pipeline's latency; they are counted apart.
            live = stamps >= self._started_ms
            self.backlog += int(stamps.size - live.sum())
            self.freshness.append(fresh[live])
        self.history.append(StepRecord(
            self.trainer.step_index, self.records, c.rows_not_held, c.samples_trained,
            int(c.traffic.sent.sum()), seconds, migrating, self.trainer.placement.version))
        if self.metrics is not None:
            self.metrics.on_step(c, seconds, fresh, migrating)
            if self.trainer.step_index % _PUBLISH_EVERY == 0:
                self.publish_placement()

    def _sample(self, ids: np.ndarray) -> np.ndarray:
        """The ``--window-sample`` share of ``ids`` (all of them by default)."""
        if self.cfg.window_sample >= 1.0 or ids.shape[0] == 0:
            return ids
        return ids[self._rng.random(ids.shape[0]) < self.cfg.window_sample]

    def settle(self) -> None:
        """Count the last step's records (collective): a run ended by ``--steps`` has no next
        control round to count them before its final checkpoint."""
        t = torch.tensor([self._last[0]], dtype=torch.int64, device=self.comm.device)
        self.comm.all_reduce_sum(t, "control")
        self.records += int(t.item())
        self._last = (0, 0, 0)

    def note_read(self, n: int) -> None:
        """Records read for a step that ended the run (no trained step follows)."""
        self._last = (n, 0, 0)

    # -- window and partitioner (rank 0) -----------------------------------------------------

    def _send_window(self, rows: np.ndarray) -> None:
        fields = self.trainer.n_fields
        send = np.zeros(self.world, np.int64)
        send[0] = self._window_out.shape[0]
        recv = rows if self.rank == 0 else np.zeros(self.world, np.int64)
        out = torch.from_numpy(np.ascontiguousarray(self._window_out)).to(self.comm.device)
        got = self.comm.all_to_all(out, send, recv, "window")
        self._window_out = self._window_out[:0]
        if self.rank == 0 and got.numel():
            self._parts.append(got.cpu().numpy().reshape(-1, fields))
        self._trim_parts()

    @property
    def window_held(self) -> int:
        """Samples rank 0 holds for the next partition (less than ``--window`` plus one step's)."""
        return sum(p.shape[0] for p in self._parts)

    def _trim_parts(self) -> None:
        """Keep at most a window's worth of samples waiting for the partitioner."""
        held = self.window_held
        while self._parts and held - self._parts[0].shape[0] >= self.cfg.window:
            held -= self._parts.pop(0).shape[0]

    def _repartition_due(self) -> bool:
        if not self.partition or self._future is not None or self.migration is not None:
            return False
        records = self.records - self._rep_records
        if not self._computed:
            warm = self.train.warmup or self.cfg.repartition.count
            return records >= warm if warm else self.cfg.repartition.due(
                records, self.clock.monotonic() - self._rep_time)
        if self.cfg.repartition.due(records, self.clock.monotonic() - self._rep_time):
            return True
        return self._drifted()

    def _observe_level(self, value: float) -> None:
        """Track remote rows per sample: the running level and the post-placement baseline."""
        self._level = value if self._level is None else (1 - _EWMA) * self._level + _EWMA * value
        if self._baseline is None and self._computed and self.migration is None \
                and self._future is None:
            self._baseline_acc.append(value)
            if len(self._baseline_acc) >= _BASELINE_STEPS:
                self._baseline = float(np.mean(self._baseline_acc))
                self._level = self._baseline

    def _drifted(self) -> bool:
        thr = self.cfg.drift_threshold
        if not thr or self._baseline is None or self._level is None:
            return False
        if self._level > self._baseline * (1 + thr):
            log.info("drift: remote rows per sample %.3f, %.0f%% above the %.3f after the last "
                     "placement: repartitioning early", self._level,
                     100 * (self._level / max(self._baseline, 1e-9) - 1), self._baseline)
            self.events.append({"event": "drift", "step": self.trainer.step_index,
                                "records": self.records, "level": self._level,
                                "baseline": self._baseline})
            return True
        return False

    def _start_partition(self) -> None:
        assert self._executor is not None and self._worker is not None
        parts, self._parts = self._parts, []
        current = self.trainer.placement if self._computed else None
        version = self.trainer.placement.version
        self._rep_records, self._rep_time = self.records, self.clock.monotonic()
        self._baseline, self._baseline_acc = None, []
        self.events.append({"event": "repartition", "step": self.trainer.step_index,
                            "records": self.records,
                            "kind": "incremental" if self._computed else "full"})
        # The thread only waits on the partitioner process (no GIL held while it waits).
        self._future = self._executor.submit(self._worker.partition, parts, current, version)
        self._computed = True

    # -- placement and migration -------------------------------------------------------------

    def _receive_placement(self) -> None:
        payload = None
        if self.rank == 0:
            assert self._future is not None
            placement, seconds, kind, moves = self._future.result()
            self._future = None
            payload = (placement, seconds, kind, moves)
            log.info("placement v%d computed (%s) in %.2f s%s", placement.version, kind, seconds,
                     "" if moves is None else f": {moves.describe()}")
        placement, seconds, kind, moves = self.comm.broadcast_object(payload)
        size = placement.ids.nbytes + placement.owners.nbytes + sum(
            r.nbytes for r in placement.replicas)
        if self.rank == 0:
            self.comm.traffic.add("placement", size * (self.world - 1), 0)
        else:
            self.comm.traffic.add("placement", 0, size)
        self.events.append({"event": "placement", "step": self.trainer.step_index,
                            "records": self.records, "version": placement.version,
                            "seconds": seconds, "kind": kind,
                            "moves": None if moves is None else dataclasses.asdict(moves)})
        if self.metrics is not None:
            self.metrics.on_repartition(seconds, kind, moves)
        self._start_migration(placement)

    def _start_migration(self, placement: Placement) -> None:
        """Push pending replica updates, switch replica sets, and plan the move (collective)."""
        tr = self.trainer
        tr.flush()
        tr.replace_replicas(placement.replicas)
        self.migration = Migration(tr.placement, placement, self._row_size,
                                   self.cfg.migration_chunk_bytes)
        tr.set_placement(self.migration.current())
        self._verify_owners()
        self._migration_started = self.clock.monotonic()
        self._migration_bytes = 0
        self._chunks_done = 0
        self.placements += 1
        m = self.migration
        if self.rank == 0:
            log.info("migrating to placement v%d: %d rows change owner (%.1f MB) in %d chunk(s)",
                     placement.version, m.total, m.total * self._row_size / 1e6, m.chunks)
        self.events.append({"event": "migration_start", "step": tr.step_index,
                            "records": self.records, "version": placement.version,
                            "ids": m.total, "chunks": m.chunks})
        if m.finished:
            self._finish_migration()

    def _move_chunk(self) -> None:
        m = self.migration
        assert m is not None
        ids, src, dst = m.next_chunk()
        before = self.comm.traffic.copy()
        report = move_chunk(self.trainer, ids, src, dst, self.trainer.step_index)
        self.trainer.set_placement(m.advance())
        moved = self.comm.traffic - before
        self._verify_owners()
        self._migration_bytes += int(moved.sent.sum())
        self._chunks_done += 1
        if self.metrics is not None:
            self.metrics.on_migration_chunk(report.rows_sent, report.bytes_sent)
        self._rows_sent += report.rows_sent
        if self.fault is not None and self.fault == (self.rank, self._chunks_done) \
                and not m.finished:
            log.warning("fault injection: rank %d kills itself in the middle of a migration "
                        "(chunk %d of %d)", self.rank, self._chunks_done, m.chunks)
            os.kill(os.getpid(), signal.SIGKILL)
        if m.finished:
            self._finish_migration()

    def _verify_owners(self) -> None:
        """Every row on exactly one rank, the one the placement in force names (invariant 1)."""
        if not self.check_owners:
            return
        held = self.comm.all_gather_object(self.trainer.store.ids())
        every = np.concatenate(held)
        if np.unique(every).size != every.size:
            raise RuntimeError("invariant 1 broken: a row is held by two ranks")
        for rank, ids in enumerate(held):
            wrong = self.trainer.placement.owner_of(ids) != rank
            if wrong.any():
                raise RuntimeError(f"invariant 1 broken: rank {rank} holds {int(wrong.sum())} "
                                   "rows another rank owns")
        self.owner_checks += 1

    def _finish_migration(self) -> None:
        m = self.migration
        assert m is not None
        seconds = self.clock.monotonic() - self._migration_started
        rows = int(sum(self.comm.all_gather_object(self._rows_sent)))
        self._rows_sent = 0
        self.events.append({"event": "migration_done", "step": self.trainer.step_index,
                            "records": self.records, "version": m.new.version,
                            "rows_moved": rows, "ids": m.total, "seconds": seconds,
                            "bytes": self._migration_bytes})
        if self.rank == 0:
            log.info("placement v%d in force: %d rows moved in %.2f s", m.new.version, rows,
                     seconds)
        if self.metrics is not None:
            self.metrics.on_migration_done(seconds)
        self.migration = None
        self.publish_placement()

    def publish_placement(self) -> None:
        """Export the placement in force (version, rows owned and replicated, row balance)."""
        if self.metrics is None:
            return
        tr = self.trainer
        self.metrics.on_placement(tr.placement.version, len(tr.store), len(tr.replicas),
                                  self.sample_imbalance, self.row_imbalance)

    @property
    def offsets(self) -> dict[int, int]:
        """Next Kafka offset per partition of what this rank has trained (empty otherwise)."""
        return dict(getattr(self.source, "trained", {}))

    @property
    def migrating(self) -> bool:
        """Whether a migration is in progress."""
        return self.migration is not None

    # -- checkpoints -------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        if not self.cfg.checkpoint_dir:
            return False
        return self.cfg.checkpoint.due(self.records - self._ckpt_records,
                                       self.clock.monotonic() - self._ckpt_time)

    def checkpoint(self) -> ckpt.Manifest | None:
        """Write a checkpoint and then commit the Kafka offsets it covers (collective).

        Pending replica updates are pushed first, so the owners' rows hold every update of
        the steps trained. Each rank writes its rows; rank 0 the dense model and the
        placement; after a barrier rank 0 completes the checkpoint with its manifest (the
        offsets of every rank); after another, each rank commits its partitions' offsets.
        """
        if not self.cfg.checkpoint_dir:
            return None
        tr = self.trainer
        if self._last_checkpoint_step == tr.step_index:
            return None
        t0 = self.clock.monotonic()
        tr.flush()
        directory = ckpt.step_dir(self.cfg.checkpoint_dir, tr.step_index)
        directory.mkdir(parents=True, exist_ok=True)
        ids, values, state, versions = tr.store.export()
        ckpt.save_rows(directory, self.rank, ids, values, state, versions)
        if self.rank == 0:
            ckpt.save_dense(directory, {"flat": tr.dense.flat, **tr.optimizer.state_arrays()})
            ckpt.save_placement(directory, tr.placement)
        offsets: dict[int, int] = {}
        if hasattr(self.source, "flush_dead_letters"):
            self.source.flush_dead_letters()  # dead letters land before the offsets pass them
        mine = self.offsets
        for part in self.comm.all_gather_object(mine):
            offsets.update(part)
        self.comm.barrier()
        manifest = None
        if self.rank == 0:
            manifest = ckpt.write_manifest(
                directory, step=tr.step_index, world=self.world,
                placement_version=tr.placement.version, records=self.records,
                offsets=offsets, topic=self.topic, extra=self.extra)
            ckpt.prune(self.cfg.checkpoint_dir, self.cfg.keep_checkpoints)
        self.comm.barrier()
        committed = None
        if hasattr(self.source, "commit") and mine:
            committed = self.source.commit(mine)
        self._last_checkpoint_step = tr.step_index
        self._ckpt_records, self._ckpt_time = self.records, self.clock.monotonic()
        seconds = self.clock.monotonic() - t0
        self.events.append({"event": "checkpoint", "step": tr.step_index,
                            "records": self.records, "seconds": seconds,
                            "committed": committed})
        if self.rank == 0:
            log.info("checkpoint at step %d (%d records) written to %s in %.2f s",
                     tr.step_index, self.records, directory, seconds)
        if self.metrics is not None:
            self.metrics.on_checkpoint(self.clock.time())
        return manifest

    def close(self) -> None:
        """Stop the partitioner (a placement still being computed is dropped)."""
        if self._worker is not None:
            self._worker.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def report(self) -> dict[str, Any]:
        """What the loop saw on this rank (plain data: it travels back from spawned ranks)."""
        fresh = self.freshness_seconds()
        return {
            "history": [dataclasses.astuple(h) for h in self.history],
            "history_fields": [f.name for f in dataclasses.fields(StepRecord)],
            "events": self.events,
            "placements": self.placements,
            "owner_checks": self.owner_checks,
            "freshness_p50_s": percentile(fresh, 50),
            "freshness_p99_s": percentile(fresh, 99),
            "freshness_count": int(fresh.size),
            "freshness_backlog": self.backlog,
            "traffic_sent": {k: int(v) for k, v in zip(KINDS, self.comm.traffic.sent)},
            "records": self.records,
            "offsets": dict(self.offsets),
        }

    def freshness_seconds(self) -> np.ndarray:
        """Every freshness measured on this rank."""
        return np.concatenate(self.freshness) if self.freshness else np.zeros(0)


def budget_share(remaining: int, rank: int, world: int, turn: int) -> int:
    """Records ``rank`` may read of the ``remaining`` ones: an equal share, and the odd ones
    in turn. ``turn`` must advance every round, step or not: a round in which nobody read is
    no step, and a rank whose partitions are drained must not keep the odd record for ever."""
    extra = (rank + turn) % world < remaining % world
    return remaining // world + int(extra)


def restore(trainer: Trainer, manifest: ckpt.Manifest) -> int:
    """Load a checkpoint into a freshly built trainer; returns the rows this rank took.

    The trainer's placement decides which rows this rank keeps, so a checkpoint of N ranks
    loads on M: every rank reads every rank file and keeps the rows it owns now.
    """
    trainer.finish_step()  # nothing may land on the dense parameters after the load
    me, placement = trainer.comm.rank, trainer.placement
    ids, values, state, versions = ckpt.load_rows(
        manifest, keep=lambda a: placement.owner_of(a) == me)
    trainer.store.put(ids, torch.from_numpy(values), torch.from_numpy(state), versions,
                      manifest.step)
    dense = ckpt.load_dense(manifest)
    flat = torch.from_numpy(dense["flat"])
    if flat.shape != trainer.dense.flat.shape:
        raise ckpt.CheckpointError(
            f"{manifest.path}: dense parameters have {flat.numel()} values, the model "
            f"{trainer.dense.flat.numel()}: different model settings?")
    with torch.no_grad():
        trainer.dense.flat.copy_(flat.to(trainer.dense.flat))
    trainer.optimizer.load_state_arrays({k: v for k, v in dense.items() if k != "flat"})
    trainer.step_index = manifest.step
    return int(ids.size)


def check_compatible(manifest: ckpt.Manifest, extra: dict[str, Any],
                     topic: str | None = None) -> None:
    """Refuse a checkpoint of another model shape, or of another topic."""
    if manifest.topic and topic and manifest.topic != topic:
        raise ckpt.CheckpointError(
            f"{manifest.path} holds offsets of topic {manifest.topic!r}, this run reads "
            f"{topic!r}: use another --checkpoint-dir")
    saved = manifest.extra
    diff = {k: (saved.get(k), v) for k, v in extra.items() if k in saved and saved[k] != v}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise ckpt.CheckpointError(f"{manifest.path} was written by another model ({detail})")


def percentile(values: np.ndarray, q: float) -> float:
    """``q``-th percentile, NaN for no values."""
    return float(np.percentile(values, q)) if values.size else math.nan
