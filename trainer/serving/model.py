"""The model a serving process holds: a checkpoint, then every delta after it.

:class:`ServingModel` is built from a checkpoint (:meth:`ServingModel.from_checkpoint`: its
rows, dense parameters and model shape) and kept current by :meth:`ServingModel.apply`, one
decoded delta at a time, by the version rule of :mod:`hetgmp.trainer.serving.deltas`: a row replaces
the held one when newer, a tombstone removes a held row that is older, dense parameters replace
the held ones when newer and complete. The checkpoint's rows all count as of the checkpoint's
last publish. Ids without a row score with their initial value, from (seed, id) as the trainer
creates it, and are counted.

:meth:`ServingModel.score` reads rows under a lock held only for the gather (a copy), and runs
the forward pass on a model object that a dense update replaces rather than writes into, so
requests and the log's follower never wait on each other's arithmetic.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hetgmp.streaming import ClickBatch
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.model import (
    EXPORTED,
    Bags,
    ExportError,
    FieldReader,
    FlatParameters,
    ModelConfig,
    ModelSpec,
    build_model,
    call_exported,
    load_exported,
)
from hetgmp.trainer.serving.deltas import GENERATION_SHIFT, Delta, Rejected, log_version
from hetgmp.trainer.serving.table import ServingTable

__all__ = ["Applied", "RankMark", "ServingModel", "ServingTable", "model_config"]

log = logging.getLogger(__name__)

_PUBLISH_MASK = (1 << GENERATION_SHIFT) - 1
# Dense publishes assembled at once: a trainer's are whole before the next begins (one in
# flight, two across a reader's restart); more are lost or forged parts.
_ASSEMBLING_MAX = 4
# Publishes a rank's marks are remembered by, to tell a replayed mark from a gap.
_MARKED_KEEP = 256
# How far a new generation may jump past the one held: runs that crashed before publishing
# anything each take a number.
MAX_GENERATION_JUMP = 1024
# How far past a rank's last complete publish (or its run's base) a publish number may be: a
# rank's publishes arrive in order, one mark each, so a legitimate one is next or close to it.
MAX_PUBLISH_AHEAD = 1 << 16


def _bags_of(shape: dict[str, Any], fields: int) -> Bags:
    """How the checkpoint's fields make the model's features (``mean``; the sequence fields'
    names, lengths and tables when it has some; the labels when several)."""
    mean = tuple(bool(m) for m in shape.get("mean") or ())
    try:
        labels = tuple(str(n) for n in shape.get("labels") or ())
        # Tables of their own widths: each field's, as the trainer cut its rows.
        dims = tuple(int(d) for d in shape.get("dims") or ())
        first = tuple(bool(f) for f in shape.get("first_order") or ())
        if len(dims) not in (0, fields) or len(first) != len(dims):
            raise ValueError(f"{len(dims)} dims and {len(first)} first_order for {fields} fields")
        if not shape.get("sequence"):
            return Bags(mean=mean, labels=labels, dims=dims, first_order=first)
        return Bags(mean=mean, names=tuple(str(n) for n in shape["names"]),
                    sequence=tuple(bool(s) for s in shape["sequence"]),
                    max_len=tuple(int(n) for n in shape["max_len"]),
                    tables=tuple(str(t) for t in shape["tables"]), labels=labels, dims=dims,
                    first_order=first)
    except (KeyError, TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"the checkpoint does not describe its fields: {exc!r}") \
            from None


def model_config(shape: dict[str, Any]) -> ModelConfig:
    """The model a checkpoint's shape (its manifest's ``extra``) describes, in float32."""
    try:
        kind = shape["model"]
        first = 1 if kind in ("widedeep", "deepfm") else 0
        defaults = ModelConfig()
        return ModelConfig(model=kind, embed_dim=int(shape["row_dim"]) - first,
                           hidden=tuple(int(h) for h in shape["hidden"]),
                           cross_layers=int(shape["cross_layers"]),
                           cross_rank=int(shape.get("cross_rank", defaults.cross_rank)),
                           bottom=tuple(int(h) for h in shape.get("bottom", defaults.bottom)),
                           dtype="float32")
    except (KeyError, TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"the checkpoint does not describe its model: {exc!r}") from None


@dataclass
class RankMark:
    """The last complete publish seen from one rank."""

    publish: int
    watermark_ms: int
    step: int
    caught_up_ms: int = -1


@dataclass
class Applied:
    """What :meth:`ServingModel.apply` has done since the model was built."""

    deltas: int = 0
    rows: int = 0
    rows_stale: int = 0
    tombstones: int = 0
    dense: int = 0
    foreign: int = 0
    abandoned: int = 0
    dropped: int = 0
    gaps: int = 0
    incomplete: int = 0
    replayed: int = 0
    dense_dropped: int = 0
    generations: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class ServingModel:
    """A checkpoint's model kept current by the delta log.

    Args:
        shape: The model shape (a manifest's ``extra``).
        flat: The dense parameters.
        lineage: The checkpoint directory's name in the log (deltas of another are ignored).
        version: The version of the checkpoint's rows and dense parameters.
        world: Ranks of the run that wrote the checkpoint.
        step: Its step.
        program: The model's torch.export program, if the checkpoint holds one.
        memory_rows: Rows held in memory, the rest in a disk tier under ``disk_dir`` (0: all
            in memory).
        disk_dir: Parent of the disk tier.
    """

    def __init__(self, shape: dict[str, Any], flat: np.ndarray, *, lineage: str, version: int,
                 world: int, step: int, program: bytes | None = None, memory_rows: int = 0,
                 disk_dir: str = "") -> None:
        self.shape = shape
        self.config = model_config(shape)
        self.fields, self.n_dense = int(shape["fields"]), int(shape["dense"])
        self.bags = _bags_of(shape, self.fields)
        # Rows in blocks of one width, read as the trainer reads them (trainer.model.widths).
        try:
            self.reader = FieldReader.of(self.bags, self.config, self.fields)
        except ValueError as exc:
            raise ckpt.CheckpointError(f"the checkpoint's row widths: {exc}") from None
        self.widths, self.row_dim = self.reader.widths, self.reader.widths.row_dim
        self.spec = ModelSpec.of_bags(self.config, self.bags, self.fields, self.n_dense)
        # A user's model exported with torch.export (trainer.model.export): scored without
        # its code; the dense parameters go into the program by name.
        self._program = program if program and shape.get("dense_names") else None
        if self._program is not None:
            log.info("serving model %r from its torch.export program: its code is not needed "
                     "here", self.config.model)
        elif ":" in self.config.model:
            log.info("serving model %r by import path: its module must be importable here, "
                     "as it was where the trainer ran", self.config.model)
        self.table = ServingTable(self.row_dim, int(shape.get("row_seed", 0)),
                                  float(shape.get("row_init_scale", 0.01)),
                                  memory_rows=memory_rows, disk_dir=disk_dir)
        self.lineage = lineage
        self.applied = Applied()
        self.step = step
        self._lock = threading.Lock()
        self._dense_version = version
        self._model = self._build(flat)
        self._assembling: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._generation = version >> GENERATION_SHIFT
        self._base = 0
        # The version of the checkpoint it started from: a run that resumed from an older one
        # would take serving back past what it has held.
        self._floor = version
        self._numel = int(flat.size)
        self._world = world
        self._marks: dict[int, RankMark] = {}
        # rank -> the publishes of this generation whose marks were read, the newest few.
        self._marked: dict[int, collections.deque[int]] = {}
        self._counts: dict[tuple[int, int], int] = {}  # (rank, publish) -> messages seen
        # A checkpoint records the offsets stored when it was taken, without waiting for the
        # publish in flight: the first publish of each rank read after it may have messages
        # below those offsets (covered by the checkpoint), so it is not counted incomplete.
        self._cut: set[int] = set(range(world))
        self.unknown_ids = 0

    @classmethod
    def from_checkpoint(cls, manifest: ckpt.Manifest, *, memory_rows: int = 0,
                        disk_dir: str = "") -> ServingModel:
        """The model of a complete checkpoint (its rows and dense parameters verified), its
        rows read a file at a time (with a disk tier, a table larger than memory)."""
        if manifest.model is None:
            raise ckpt.CheckpointError(
                f"{manifest.path} records no delta-log position (written without a delta log:"
                " a Kafka source, --checkpoint-dir and --publish-interval > 0 make one)")
        m = manifest.model
        version = log_version(m.generation, m.publishes)
        dense = ckpt.load_dense(manifest)["flat"]
        program = manifest.read(EXPORTED) if EXPORTED in manifest.files else None
        model = cls(manifest.extra, dense, lineage=m.lineage, version=version,
                    world=manifest.world, step=manifest.step, program=program,
                    memory_rows=memory_rows, disk_dir=disk_dir)
        if not np.isfinite(dense).all():
            raise ckpt.CheckpointError(f"{manifest.path} holds NaN or infinite parameters")
        for ids, values, _, _ in ckpt.iter_rows(manifest):
            if values.shape[1:] != (model.row_dim,):
                raise ckpt.CheckpointError(f"{manifest.path}: rows of width {values.shape[1:]},"
                                           f" the model's are {model.row_dim}")
            if not np.isfinite(values).all():
                raise ckpt.CheckpointError(f"{manifest.path} holds NaN or infinite parameters")
            model.table.upsert(ids, values.astype(np.float32), version)
        return model

    def _build(self, flat: np.ndarray) -> tuple[torch.nn.Module, torch.Tensor]:
        """A new model object holding ``flat`` (and that flat buffer)."""
        if self._program is not None:
            try:
                module, named = load_exported(self._program,
                                              [str(n) for n in self.shape["dense_names"]])
            except ExportError as exc:
                raise ckpt.CheckpointError(f"the checkpoint's {EXPORTED}: {exc}") from None
            params = FlatParameters(module, named)
        else:
            module = build_model(self.config, self.fields, self.n_dense, self.spec)
            params = FlatParameters(module)
        if params.numel != flat.size:
            raise ckpt.CheckpointError(f"dense parameters of {flat.size} values, the model has "
                                       f"{params.numel}")
        with torch.no_grad():
            params.flat.copy_(torch.from_numpy(np.ascontiguousarray(flat, np.float32)))
        if self._program is None:
            module.eval()  # a program was traced in eval mode (and refuses eval())
        return module, params.flat

    # -- the log -----------------------------------------------------------------------------

    def check(self, delta: Delta) -> None:
        """Refuse a delta that this model must not apply: sizes that are not the model's, or
        a generation or publish number that cannot follow what it holds. What a message can
        be checked for alone, :func:`~hetgmp.trainer.serving.deltas.decode` has checked.

        Raises:
            Rejected: ``delta`` must be skipped (nothing of it was applied).
        """
        h = delta.head
        if h.lineage != self.lineage:
            return  # another job's: ignored, whatever it holds
        if delta.kind == "rows" and delta.values.shape[1] != self.row_dim:
            raise Rejected("shape", f"rows of width {delta.values.shape[1]}; the model's are "
                                    f"{self.row_dim}")
        if delta.kind == "dense" and delta.dense_size != self._numel:
            raise Rejected("shape", f"dense parameters of {delta.dense_size} values; the model "
                                    f"has {self._numel}")
        if h.generation < self._generation:
            return  # an older run's: it never outranks what is held (apply)
        if h.generation > self._generation:
            if h.generation - self._generation > MAX_GENERATION_JUMP:
                raise Rejected("order", f"generation {h.generation} jumps more than "
                                        f"{MAX_GENERATION_JUMP} past {self._generation}")
            if h.base < self._floor:
                raise Rejected("order", f"generation {h.generation} resumed from version "
                                        f"{h.base}, before the checkpoint serving started from "
                                        f"({self._floor}): restart serve to follow it")
            ref = h.base & _PUBLISH_MASK
        else:
            if h.world != self._world:
                raise Rejected("bounds", f"world {h.world} in generation {h.generation} of "
                                         f"world {self._world}")
            last = self._marks.get(h.rank)
            ref = max(self._floor, self._base) & _PUBLISH_MASK
            if last is not None:
                ref = max(ref, last.publish)
        if h.publish > ref + MAX_PUBLISH_AHEAD:
            raise Rejected("order", f"publish {h.publish} of rank {h.rank} is more than "
                                    f"{MAX_PUBLISH_AHEAD} past {ref}")

    def apply(self, delta: Delta) -> None:
        """Apply one delta of the log, in the order its partition holds them.

        Raises:
            Rejected: :meth:`check` refused it; the model is as it was.
        """
        self.check(delta)
        a, h = self.applied, delta.head
        if h.lineage != self.lineage:
            a.foreign += 1
            return
        version = h.version
        if h.generation > self._generation:
            # A new run: what older ones published past the checkpoint it started from was
            # abandoned (it republishes the rows it restored).
            self._generation, self._base = h.generation, h.base
            self._world = h.world
            self._marks, self._marked = {}, {}
            self._cut = set()  # a new run's publishes are read from their first message
            a.generations += 1
            with self._lock:
                a.dropped += self.table.drop_newer(h.base)
                if self._dense_version > h.base:
                    self._dense_version = h.base  # the new run's dense parameters replace it
        elif h.generation < self._generation and version > self._base:
            a.abandoned += 1  # read late, from a run abandoned past the newest one's base
            return
        a.deltas += 1
        a.by_kind[delta.kind] = a.by_kind.get(delta.kind, 0) + 1
        key = (h.rank, h.publish)
        self._counts[key] = self._counts.get(key, 0) + 1
        if delta.kind == "rows":
            with self._lock:
                n = self.table.upsert(delta.ids, delta.values, version)
            a.rows += n
            a.rows_stale += int(delta.ids.size) - n
        elif delta.kind == "tombstones":
            with self._lock:
                a.tombstones += self.table.remove(delta.ids, version)
        elif delta.kind == "dense":
            self._dense_part(delta, version)
        elif delta.kind == "mark":
            self._mark(delta)

    def _dense_part(self, delta: Delta, version: int) -> None:
        if version <= self._dense_version:
            return
        if version not in self._assembling:
            if len(self._assembling) >= _ASSEMBLING_MAX:
                # A publish whose dense messages never all came (lost, or a writer that
                # sends parts of many): the oldest goes, or serve grows by a model's worth
                # of floats with every such publish number.
                oldest = min(self._assembling)
                if version < oldest:
                    self.applied.dense_dropped += 1
                    return
                del self._assembling[oldest]
                self.applied.dense_dropped += 1
            self._assembling[version] = (np.zeros(delta.dense_size, np.float32),
                                         np.zeros(delta.dense_size, bool))
        buf, seen = self._assembling[version]
        end = delta.start + delta.values.size
        buf[delta.start:end] = delta.values
        seen[delta.start:end] = True
        if seen.all():
            model = self._build(buf)
            with self._lock:
                self._model, self._dense_version = model, version
            self.applied.dense += 1
            self._assembling = {v: p for v, p in self._assembling.items() if v > version}

    def _mark(self, delta: Delta) -> None:
        h, a = delta.head, self.applied
        seen = self._counts.pop((h.rank, h.publish), 0) - 1  # less the mark itself
        last = self._marks.get(h.rank)
        marked = self._marked.setdefault(h.rank, collections.deque(maxlen=_MARKED_KEEP)) \
            if h.generation == self._generation else None
        if marked is not None and h.publish in marked:
            # A publish whose mark was read already: a replay (a producer's retry, a copied
            # message). Its rows were applied by version (nothing older replaces newer):
            # neither a gap nor a publish missing messages.
            a.replayed += 1
            return
        if marked is not None:
            marked.append(h.publish)
        cut = h.rank in self._cut and h.publish <= (self._floor & _PUBLISH_MASK) + 1
        self._cut.discard(h.rank)
        if seen < delta.messages and cut:
            log.info("publish %d of rank %d began before the checkpoint's offsets: %d of its "
                     "%d messages read after them", h.publish, h.rank, seen, delta.messages)
        elif seen != delta.messages:
            a.incomplete += 1
            log.warning("publish %d of rank %d: %d of its %d messages seen", h.publish, h.rank,
                        seen, delta.messages)
        if h.generation < self._generation:
            return
        if last is not None and h.publish != last.publish + 1:
            a.gaps += 1
            log.warning("rank %d: publish %d follows publish %d (missing or out of order)",
                        h.rank, h.publish, last.publish)
        if last is None or h.publish > last.publish:
            self._marks[h.rank] = RankMark(h.publish, h.watermark_ms, h.step, delta.caught_up_ms)
            self.step = max(self.step, h.step)
        # Counts of publishes whose mark never came are not kept forever.
        if len(self._counts) > 4 * max(self._world, 1):
            newest = max(p for _, p in self._counts)
            self._counts = {k: v for k, v in self._counts.items() if k[1] >= newest - 2}

    @property
    def watermark_ms(self) -> int:
        """Newest append time whose every update the model holds: the oldest of the ranks'
        last complete publishes (-1: not every rank has published yet)."""
        marks = [self._marks.get(r) for r in range(self._world)]
        if any(m is None for m in marks):
            return -1
        return min(m.watermark_ms for m in marks if m is not None)

    @property
    def fresh_ms(self) -> int:
        """Time up to which the model holds every record appended: per rank the later of its
        watermark and when every rank had read its whole log (a quiet stream is not a model
        behind), the oldest over ranks (-1: not every rank has published yet)."""
        marks = [self._marks.get(r) for r in range(self._world)]
        if any(m is None for m in marks):
            return -1
        return min(max(m.watermark_ms, m.caught_up_ms) for m in marks if m is not None)

    @property
    def dense_version(self) -> int:
        """The version of the dense parameters held."""
        return self._dense_version

    # -- requests ----------------------------------------------------------------------------

    @torch.no_grad()
    def score(self, batch: ClickBatch) -> np.ndarray:
        """Click probabilities of ``batch``'s records (float64 ``[n]``; ``[n, T]`` for a
        model of T labels)."""
        if batch.fields != self.fields or batch.dense.shape[1:] != (self.n_dense,):
            raise ValueError(f"records of {batch.fields} sparse and "
                             f"{batch.dense.shape[1:]} dense fields; the model takes "
                             f"{self.fields} and {self.n_dense}")
        batch = self.widths.expand(batch)
        uniq, inverse = np.unique(batch.values, return_inverse=True)
        with self._lock:
            rows, unknown = self.table.gather(uniq)
            model = self._model[0]
        self.unknown_ids += unknown
        table, index = torch.from_numpy(rows), torch.from_numpy(inverse.reshape(-1))
        # As the trainer builds them (Trainer.features): each value's row read where it lies.
        weights = None if batch.weights is None else torch.from_numpy(batch.weights)
        features = self.reader.features(
            table, torch.from_numpy(batch.lengths),
            torch.from_numpy(np.ascontiguousarray(batch.dense, np.float32)), weights=weights,
            index=index, one_value=batch.one_value)
        logits = model(features) if self._program is None else \
            call_exported(model, features, self.spec)
        if logits.dim() == 2 and logits.shape[1] == 1:
            logits = logits.squeeze(1)
        return torch.sigmoid(logits).numpy().astype(np.float64)

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, values, versions) of the rows held and the flat dense parameters."""
        with self._lock:
            ids, values, versions = self.table.export()
            flat = self._model[1].detach().numpy().copy()
        return ids, values, versions, flat
