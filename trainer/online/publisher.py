"""Publish the model's changes to the delta log: the loop's side of :mod:`hetgmp.trainer.serving`.

Every ``--publish-interval`` (rank 0's clock decides, the control vector tells every rank) each
rank sends, between two steps: tombstones for the rows it evicted, the rows it owns that changed
since its last publish (:meth:`EmbeddingStore.changes`: once each), rank 0 the dense parameters
when a step changed them, and a mark that closes the publish (format:
:mod:`hetgmp.trainer.serving.deltas`). Sends are asynchronous; what the broker refused is sent again
at the next publish.

Versions. The publish count runs on over the whole job (a resumed run continues from its
checkpoint's) and the *generation* numbers the runs of a checkpoint directory (``GENERATION``
there, incremented by every run that publishes). A run that resumes from a checkpoint the log
may have moved past (the crashed run published after it) republishes every row it restores:
a newer generation, so serving drops what the crashed run had published beyond the checkpoint.
A checkpoint taken right after the final publish of a clean end is marked ``final``; resuming
from it republishes nothing.

Watermark. A publish first pushes the replicas' pending updates to their owners (the flush a
checkpoint does; once a publish interval it costs one collective), so the owners hold every
update of every step trained and the publish's watermark is the newest append time among the
records read. Without that push it would lag ``s`` steps behind (2.6 s at s = 10 and 3.9 steps
a second: the serve benchmark measured a freshness p50 of 2.30 s, p99 3.18 s that way).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetgmp.runtime import Clock
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.serving import (
    DeltaSink,
    Publish,
    dense_messages,
    log_version,
    mark_message,
    row_messages,
    rows_per_message,
    tombstone_messages,
)
from hetgmp.trainer.step import Trainer

__all__ = ["GENERATION_FILE", "PublishStats", "Publisher", "next_generation"]

log = logging.getLogger(__name__)

GENERATION_FILE = "GENERATION"


def _identity(root: Path) -> dict[str, object]:
    st = root.stat()
    return {"path": str(root.resolve()), "device": st.st_dev, "inode": st.st_ino}


def _same_directory(recorded: object, now: dict[str, object]) -> bool:
    """Whether the directory that wrote a run count is this one: the same inode (moved
    within its file system, remounted), or the same path (restored from a backup in place).
    A copy elsewhere (``cp -a``, a snapshot mounted beside the original) is neither."""
    if not isinstance(recorded, dict):
        return True  # written before directories were recorded: adopted as it is
    return ((recorded.get("device"), recorded.get("inode")) == (now["device"], now["inode"])
            or recorded.get("path") == now["path"])


def next_generation(root: str) -> tuple[str, int]:
    """Count one more run in checkpoint directory ``root`` (rank 0), durably.

    Returns:
        The directory's *lineage* (a random name given by its first run: serving ignores
        deltas of another lineage, another job's on the same topic) and the new run's number.
        A copy of a checkpoint directory is another job: the first run in it takes a lineage
        of its own, so that it never publishes as the original (whose serve processes would
        apply its rows).
    """
    path = Path(root) / GENERATION_FILE
    Path(root).mkdir(parents=True, exist_ok=True)
    here = _identity(Path(root))
    lineage, last = uuid.uuid4().hex, 0
    if path.exists():
        try:
            body = json.loads(path.read_text())
            lineage, last = str(body["lineage"]), int(body["generation"])
            recorded = body.get("directory")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ckpt.CheckpointError(
                f"{path} is not a run count ({exc!r}): restore or delete it (serving orders "
                "the runs of a checkpoint directory by it)") from None
        if not _same_directory(recorded, here):
            copied, lineage = lineage, uuid.uuid4().hex
            log.warning("%s is a copy of the checkpoint directory %s: it publishes as a job of "
                        "its own (lineage %s, not %s); serve processes of the original ignore "
                        "it", root, recorded.get("path") if isinstance(recorded, dict) else "?",
                        lineage, copied)
    data = json.dumps({"lineage": lineage, "generation": last + 1, "directory": here}).encode()
    ckpt.atomic_write(path, lambda f: f.write(data))
    return lineage, last + 1


@dataclass
class PublishStats:
    """What this rank published in this run."""

    publishes: int = 0
    rows: int = 0
    tombstones: int = 0
    messages: int = 0
    bytes: int = 0
    resent_rows: int = 0
    failed_messages: int = 0
    seconds: float = 0.0


class Publisher:
    """A rank's publishes (``sink`` None: publishing is off and every call does nothing).

    Args:
        comm: Collectives of the job.
        trainer: This rank's trainer.
        sink: Where messages go.
        interval_s: Seconds between publishes.
        clock: Time source.
        root: The checkpoint directory (its run count gives the generation).
        resumed: The log position of the checkpoint this run resumed from (None: none).
    """

    def __init__(self, comm: Comm, trainer: Trainer, sink: DeltaSink | None, interval_s: float,
                 clock: Clock, *, root: str, resumed: ckpt.ModelLog | None) -> None:
        self.comm, self.trainer, self.sink, self.clock = comm, trainer, sink, clock
        self.interval_s = interval_s
        self.stats = PublishStats()
        self.enabled = sink is not None
        self.publishes = resumed.publishes if resumed is not None else 0
        self.offsets: dict[int, int] = dict(resumed.offsets) if resumed is not None else {}
        self.generation = 0
        self.lineage = ""
        self.base = 0 if resumed is None else log_version(resumed.generation, resumed.publishes)
        self._since = clock.monotonic()
        self._newest = -1  # newest append time read so far
        self._caught_up = -1  # newest wall time at which every rank had read its whole log
        self._dense_step = -1
        self._tombstones: list[np.ndarray] = []
        if not self.enabled:
            return
        chosen = next_generation(root) if comm.rank == 0 else None
        self.lineage, self.generation = comm.broadcast_object(chosen)
        trainer.store.track_evictions(True)
        if (resumed is None or not resumed.final or resumed.generation != self.generation - 1
                or resumed.lineage != self.lineage):
            if resumed is not None or len(trainer.store):
                # The log may hold what a crashed run published past the checkpoint.
                trainer.store.unpublish()
                log.info("rank %d: generation %d republishes the %d rows it resumed with",
                         comm.rank, self.generation, len(trainer.store))

    @property
    def topic(self) -> str | None:
        """The delta-log topic (None: off)."""
        return self.sink.topic if self.sink is not None else None

    def due(self) -> bool:
        """Rank 0: a publish is due."""
        return self.enabled and self.clock.monotonic() - self._since >= self.interval_s

    def observe(self, newest_ms: int, caught_up_ms: int = -1) -> None:
        """The newest append time among the records every rank read for the last step, and
        (-1: some rank was behind) when this rank last saw its source caught up with its log
        while every rank was: the model then holds every record appended before it."""
        self._newest = max(self._newest, newest_ms)
        self._caught_up = max(self._caught_up, caught_up_ms)

    @property
    def watermark_ms(self) -> int:
        """Newest append time of the records whose every update the owners hold (-1: none)."""
        return self._newest

    def publish(self) -> None:
        """Publish what changed since the last publish (every rank, at the same step)."""
        if self.sink is None:
            return
        t0 = self.clock.monotonic()
        # The replicas' pending updates go to their owners first (collective: every rank
        # publishes at this step), so a publish holds every update of every step trained, and
        # its watermark is the newest record read, not the one s steps before.
        self.trainer.flush()
        store, st = self.trainer.store, self.stats
        failed = self.sink.take_failed()
        if failed.messages:
            st.failed_messages += failed.messages
            log.warning("rank %d: the broker did not store %d delta message(s) (%s); their "
                        "rows are sent again", self.comm.rank, failed.messages, failed.error)
            for ids in failed.rows:
                store.unpublish(ids)
                st.resent_rows += int(ids.size)
            self._tombstones.extend(failed.tombstones)
        self.publishes += 1
        head = Publish(self.comm.rank, self.comm.world, self.generation, self.publishes,
                       self.trainer.step_index, self.watermark_ms, self.lineage, self.base)
        sent = 0
        evicted = np.unique(np.concatenate([store.take_tombstones(), *self._tombstones]))
        self._tombstones = []
        if evicted.size:
            for message in tombstone_messages(evicted, head):
                self._send(message, tombstones=evicted)
                sent += 1
        ids, values = store.changes()
        if ids.size:
            host = values.detach().cpu().numpy()
            per = rows_per_message(host.shape[1])
            for lo in range(0, ids.size, per):
                (message,) = row_messages(ids[lo:lo + per], host[lo:lo + per], head)
                self._send(message, rows=ids[lo:lo + per])
                sent += 1
        if self.comm.rank == 0 and self.trainer.step_index != self._dense_step:
            # The last step's dense update is still in flight (Trainer.step): finish it. Every
            # rank has started that all-reduce, so waiting here alone is safe.
            self.trainer.finish_step()
            for message in dense_messages(self.trainer.dense.flat.detach().cpu().numpy(), head):
                self._send(message)
                sent += 1
            self._dense_step = self.trainer.step_index
        self._send(mark_message(sent, head, caught_up_ms=self._caught_up))
        st.publishes += 1
        st.rows += int(ids.size)
        st.tombstones += int(evicted.size)
        st.seconds += self.clock.monotonic() - t0
        self._since = self.clock.monotonic()

    def _send(self, message: bytes, *, rows: np.ndarray | None = None,
              tombstones: np.ndarray | None = None) -> None:
        assert self.sink is not None
        self.sink.send(message, rows=rows, tombstones=tombstones)
        self.stats.messages += 1
        self.stats.bytes += len(message)

    def acked_offsets(self) -> dict[int, int]:
        """This rank's stored offsets, by partition (no wait: a delta stored later lands
        above them, where it belongs; see :meth:`position`)."""
        return {} if self.sink is None else self.sink.acked()

    def flush(self) -> bool:
        """Wait for every send; whether the broker stored all of them."""
        if self.sink is None:
            return True
        self.sink.flush()
        failed = self.sink.take_failed()
        if failed.messages:
            self.stats.failed_messages += failed.messages
            for ids in failed.rows:
                self.trainer.store.unpublish(ids)
            self._tombstones.extend(failed.tombstones)
            return False
        return True

    def position(self, gathered: list[dict[int, int]], final: bool) -> ckpt.ModelLog | None:
        """The log position a checkpoint records, from every rank's :meth:`acked_offsets`.

        Every delta below these offsets was stored before the checkpoint was taken, so it is
        no newer than the checkpoint; a delta sent before but stored after lands above them,
        and its version (no newer than the checkpoint's) keeps serving from applying it.
        """
        if self.sink is None:
            return None
        offsets = dict(self.offsets)
        for part in gathered:
            for p, o in part.items():
                offsets[p] = max(offsets.get(p, 0), o)
        self.offsets = offsets
        return ckpt.ModelLog(self.sink.topic, self.lineage, self.generation, self.publishes,
                             offsets, final)

    def report(self) -> dict[str, float]:
        """What this rank published (plain data)."""
        s = self.stats
        return {"publishes": s.publishes, "rows": s.rows, "tombstones": s.tombstones,
                "messages": s.messages, "bytes": s.bytes, "resent_rows": s.resent_rows,
                "failed_messages": s.failed_messages, "seconds": s.seconds}

    def close(self) -> None:
        """Flush and close the sink."""
        if self.sink is not None:
            try:
                self.sink.close()
            finally:
                self.sink = None

