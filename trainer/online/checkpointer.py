"""Checkpoint, then commit: the loop's side of :mod:`hetgmp.trainer.checkpoint` (invariant 5).

A checkpoint is taken when ``--checkpoint-interval`` has passed (records or seconds), at the
end of a run and on SIGTERM. Pending replica updates are pushed first, so the owners' rows hold
every update of the steps trained. Each rank writes its rows; rank 0 the dense model and the
placement; after a barrier rank 0 completes the checkpoint with its manifest (every rank's
offsets); after another, each rank commits its partitions' offsets to Kafka. So an offset is
committed only once a durable checkpoint holds the effect of every record before it.

One checkpoint in ``--checkpoint-full-every`` writes every row; the others are increments of the
one before: each rank writes the rows changed, created or moved in since then and the ids it
dropped (:meth:`~hetgmp.trainer.embedding.EmbeddingStore.saved_rows`), so their cost follows
what changed. The first checkpoint of a run is full (a resumed run's store knows nothing of the
chain it came from), and so is the one after a checkpoint that failed part way.

:func:`restore` is the way back: a checkpoint of N ranks loads on M.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetgmp.runtime import Clock
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.model import EXPORTED, ExportError, export_model
from hetgmp.trainer.online.config import Interval
from hetgmp.trainer.online.observe import Observer
from hetgmp.trainer.online.publisher import Publisher
from hetgmp.trainer.online.stats import LoopStats
from hetgmp.trainer.sources import Source
from hetgmp.trainer.step import Trainer

__all__ = ["Checkpointer", "check_compatible", "restore"]

log = logging.getLogger(__name__)

# Rows of a disk tier a file of a full checkpoint holds (about 0.5 GB at 64 float32 and
# Adagrad): a table larger than memory is written, and restored, a file at a time.
PART_ROWS = 1 << 21


class Checkpointer:
    """When to checkpoint, and the checkpoint-then-commit sequence.

    Args:
        comm: Collectives of the job.
        root: Checkpoint directory ('' = no checkpoints).
        interval: How often.
        keep: Complete checkpoints kept.
        stats: Where events are logged.
        clock: Time source.
        extra: Settings recorded in the manifest and checked at resume (the model shape).
        records: Records trained when the loop starts.
        resumed: (step, records, offsets, publishes) of the checkpoint this run resumed from
            (it is not written again unless something moved).
        metrics: The rank's metrics (None: none).
        observers: Told once a checkpoint's rows are on disk, before its manifest.
        full_every: One checkpoint in this many is full, the others increments.
    """

    def __init__(self, comm: Comm, root: str, interval: Interval, keep: int, stats: LoopStats,
                 clock: Clock, *, extra: dict[str, Any], records: int = 0,
                 resumed: tuple[int, int, dict[int, int], int] | None = None,
                 metrics: Any = None, observers: Observer | None = None,
                 full_every: int = 1) -> None:
        self.comm, self.root, self.interval, self.keep = comm, root, interval, keep
        self.full_every = full_every
        # Rank 0: the last checkpoint this run completed, which the next may be an increment of.
        self._parent: ckpt.Manifest | None = None
        self.stats, self.clock, self.extra, self.metrics = stats, clock, extra, metrics
        self.observers = observers or Observer()
        self.written = 0
        # A user's model as a torch.export program (rank 0, made at the first checkpoint and
        # written in each): serve scores it without the user's code. None: not made yet;
        # b"": not exportable (said once), serve imports it by path.
        self._program: bytes | None = None
        # A resumed run does not rewrite the checkpoint it started from.
        self._last: tuple[int, int, dict[int, int], int] | None = resumed
        self._since = (records, clock.monotonic())

    def _exported(self, trainer: Trainer) -> bytes:
        """The program of a user's model (b"" for a built-in, or one torch cannot export)."""
        if self._program is None:
            self._program = b""
            name = trainer.model_config.model
            if ":" in name:
                try:
                    self._program = export_model(trainer.model, trainer.spec)
                    log.info("model %r exported with torch.export: serve scores it without "
                             "its code", name)
                except ExportError as exc:
                    log.warning("model %r could not be exported (%s): serve will import it "
                                "by path", name, exc)
        return self._program

    def _base(self) -> ckpt.Base | None:
        """What the next checkpoint is an increment of (rank 0; None: it is full)."""
        parent = self._parent
        if parent is None or parent.depth + 1 >= self.full_every:
            return None
        return ckpt.Base(parent.path.name, parent.digest(), parent.depth + 1)

    @property
    def enabled(self) -> bool:
        """Whether checkpoints are written at all."""
        return bool(self.root)

    def due_by_time(self) -> bool:
        """A seconds interval has passed since the last checkpoint (rank 0 decides: the ranks'
        clocks differ)."""
        return self.enabled and self.interval.seconds > 0 and \
            self.clock.monotonic() - self._since[1] >= self.interval.seconds

    def due_by_records(self, records: int) -> bool:
        """A records interval has passed, counting the step just agreed on (every rank decides
        alike: they share the count)."""
        return self.enabled and self.interval.count > 0 and \
            records - self._since[0] >= self.interval.count

    def write(self, trainer: Trainer, source: Source, records: int, *,
              publisher: Publisher | None = None, final: bool = False) -> ckpt.Manifest | None:
        """Write a checkpoint of the steps trained so far, then commit its offsets (collective).

        Args:
            trainer: This rank's trainer.
            source: This rank's source (its offsets, its commit).
            records: Records trained over all ranks.
            publisher: The delta log (its position goes in the manifest).
            final: Every rank's publisher has just published and flushed everything.

        Returns:
            Rank 0's manifest (None elsewhere, without checkpoints, or when this step's
            checkpoint exists already).
        """
        if not self.enabled:
            return None
        mine = source.snapshot()
        offsets: dict[int, int] = {}
        logged = publisher.acked_offsets() if publisher is not None else {}
        gathered = self.comm.all_gather_object((mine, logged, final))
        for part, _, _ in gathered:
            offsets.update(part)
        # The same step can need a new checkpoint: offsets move without a step past messages
        # whose records were all rejected, and the delta log moves with a publish. Every rank
        # compares the same gathered figures.
        publishes = publisher.publishes if publisher is not None else 0
        position = (trainer.step_index, records, offsets, publishes)
        if position == self._last:
            return None
        t0 = self.clock.monotonic()
        trainer.flush()
        model = None if publisher is None else publisher.position(
            [log_offsets for _, log_offsets, _ in gathered], all(f for _, _, f in gathered))
        # Rank 0 picks the directory (and clears what a crash left there: rank files of
        # another world, say) and whether it is full; the broadcast is also the barrier
        # before anyone writes.
        chosen = None
        if self.comm.rank == 0:
            chosen = (str(ckpt.new_step_dir(self.root, trainer.step_index)), self._base())
            self._parent = None  # until this one completes
        where, base = self.comm.broadcast_object(chosen)
        directory = Path(where)
        directory.mkdir(parents=True, exist_ok=True)
        parts, removed = trainer.store.saved_rows(full=base is None, part_rows=PART_ROWS)
        rows = ckpt.save_rows(directory, self.comm.rank, parts,
                              removed=None if base is None else removed)
        self.written += 1
        self.observers.on_checkpoint_rows(self.written)
        if self.comm.rank == 0:
            ckpt.save_dense(directory, {"flat": trainer.dense.flat,
                                        **trainer.optimizer.state_arrays()})
            ckpt.save_placement(directory, trainer.placement)
            program = self._exported(trainer)
            if program:
                ckpt.atomic_write(directory / EXPORTED, lambda f: f.write(program))
        source.prepare_commit()  # dead letters land before the offsets pass them
        self.comm.barrier()
        manifest = None
        if self.comm.rank == 0:
            manifest = ckpt.write_manifest(
                directory, step=trainer.step_index, world=self.comm.world,
                placement_version=trainer.placement.version, records=records, offsets=offsets,
                topic=source.topic, topic_id=source.topic_id, extra=self.extra, model=model,
                base=base)
            self._parent = manifest
            ckpt.prune(self.root, self.keep)
        self.comm.barrier()
        committed = source.commit(mine) if mine else None
        self._last = position
        self._since = (records, self.clock.monotonic())
        seconds = self.clock.monotonic() - t0
        self.stats.event("checkpoint", step=trainer.step_index, records=records, seconds=seconds,
                         committed=committed, rows=rows,
                         increment_of=None if base is None else base.parent)
        if self.comm.rank == 0:
            log.info("checkpoint at step %d (%d records) written to %s in %.2f s%s",
                     trainer.step_index, records, directory, seconds,
                     "" if base is None else f" (an increment of {base.parent})")
        if self.metrics is not None:
            self.metrics.on_checkpoint(self.clock.time())
        return manifest


def restore(trainer: Trainer, manifest: ckpt.Manifest) -> int:
    """Load a checkpoint into a freshly built trainer; returns the rows this rank took.

    The trainer's placement decides which rows this rank keeps, so a checkpoint of N ranks
    loads on M: every rank reads every rank file and keeps the rows it owns now.
    """
    trainer.finish_step()  # nothing may land on the dense parameters after the load
    me, placement, store = trainer.comm.rank, trainer.placement, trainer.store
    before, taken = store.rows, 0
    # A file at a time (a table larger than memory spills as it comes). The parts share no id
    # (a row has one owner when written), so the tier is not searched for them; two ranks'
    # files holding one id are caught where both stay in memory.
    for ids, values, state, versions in ckpt.iter_rows(
            manifest, keep=lambda a: placement.owner_of(a) == me):
        if not np.isfinite(values).all():
            raise ckpt.CheckpointError(f"{manifest.path}: parameters that are not finite (NaN "
                                       "or infinite): a checkpoint of a diverged model")
        store.put(ids, torch.from_numpy(values), torch.from_numpy(state), versions,
                  manifest.step, published=True, new=True)
        taken += int(ids.size)
    if store.rows != before + taken:
        raise ckpt.CheckpointError(f"{manifest.path}: an id is owned by two ranks")
    dense = ckpt.load_dense(manifest)
    flat = torch.from_numpy(dense["flat"])
    if flat.shape != trainer.dense.flat.shape:
        raise ckpt.CheckpointError(
            f"{manifest.path}: dense parameters have {flat.numel()} values, the model "
            f"{trainer.dense.flat.numel()}: different model settings?")
    if not bool(torch.isfinite(flat).all()):
        raise ckpt.CheckpointError(f"{manifest.path}: parameters that are not finite (NaN or "
                                   "infinite): a checkpoint of a diverged model")
    with torch.no_grad():
        trainer.dense.flat.copy_(flat.to(trainer.dense.flat))
    trainer.optimizer.load_state_arrays({k: v for k, v in dense.items() if k != "flat"})
    trainer.step_index = manifest.step
    return taken


def check_compatible(manifest: ckpt.Manifest, extra: dict[str, Any],
                     topic: str | None = None) -> None:
    """Refuse a checkpoint of another model shape, or of another topic."""
    if manifest.topic and topic and manifest.topic != topic:
        raise ckpt.CheckpointError(
            f"{manifest.path} holds offsets of topic {manifest.topic!r}, this run reads "
            f"{topic!r}: use another --checkpoint-dir")
    saved = manifest.extra
    if "batch_scaling" in saved and saved["batch_scaling"] != extra.get("batch_scaling"):
        log.warning("%s was trained under batch scaling %s; this run sets %s", manifest.path,
                    saved["batch_scaling"], extra.get("batch_scaling"))
    diff = {k: (saved.get(k), v) for k, v in extra.items()
            if k in saved and saved[k] != v and k != "batch_scaling"}
    for key in ("labels", "dims", "first_order"):  # absent: one label, one width
        if saved.get(key) != extra.get(key):
            diff[key] = (saved.get(key), extra.get(key))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise ckpt.CheckpointError(f"{manifest.path} was written by another model ({detail})")
