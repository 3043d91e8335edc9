"""The manifest: what makes a checkpoint complete, and the checks a checkpoint must pass.

Layout (one directory per checkpoint, ``step-<step>`` under the checkpoint directory)::

    step-000000001200/
        rank-00000.npz ... rank-0000N.npz   rows a rank owns: ids, values, optimizer state, versions
        rank-00000-0001.npz ...             (optional) more of a rank's rows: a table larger than
                                            memory is written and read a part at a time
        dense.npz                           dense parameters and their optimizer state (rank 0)
        placement.npz                       the placement in force (rank 0)
        MANIFEST.json                       written last: the checkpoint is complete once it exists

The manifest, written by rank 0 after every rank's files are durable, names them with their sizes
and SHA-256 digests and holds the step, the world size, the records trained, the topic (and its
id) and the next Kafka offset of every partition trained from. Offsets are committed to Kafka only
after the manifest is durable (invariant 5): a crash between the two replays at most one
checkpoint interval.

Schema of ``MANIFEST.json`` (every key required unless marked; anything else is refused)::

    format             "hetgmp-checkpoint/1"
    step               int >= 0               steps trained
    world              int >= 1               ranks that wrote it
    placement_version  int >= 0
    records            int >= 0               records trained over all ranks
    topic              string or null         the Kafka topic trained from
    topic_id           string or null         (optional) the topic's id then
    offsets            {"<partition>": int}   next offset per partition, both >= 0
    created            number                 Unix time it was completed
    files              {name: {"bytes": int >= 0, "sha256": 64 hex digits}}
                       exactly rank-00000.npz .. rank-<world-1>.npz, dense.npz, placement.npz,
                       and each rank's parts rank-<r>-0001.npz .. numbered without a gap
    extra              object                 settings checked at resume (the model shape);
                                              its batch_scaling (the --batch-scaling rule
                                              and what it set: learning rates, L2, warm-up,
                                              clip) is recorded, not checked
    model              object                 (optional) the model delta log it covers:
        topic          string                 the delta-log topic
        lineage        string                 the checkpoint directory's name in the log
        generation     int >= 0               the run that wrote it (trainer.online.publisher)
        publishes      int >= 0               publishes made up to it (its rows' log version)
        offsets        {"<partition>": int}   the log's offsets it covers: every delta below
                                              them is older than the checkpoint, or equal
        final          bool                   the log held every change of it when it was taken

    base               object                 (optional) an increment: its rank files hold only
                                              the rows changed since its parent (and the ids
                                              removed since), the rest comes from the parent
        parent         string                 the parent checkpoint's directory (a sibling)
        manifest_sha256  64 hex digits        SHA-256 of the parent's MANIFEST.json
        depth          int >= 1               increments from the last full checkpoint to it

A full checkpoint has no ``base``; an increment's chain (:func:`chain`) leads through its
parents to one, each verified as the checkpoint itself is, and each parent's manifest must be
the one the child named (its digest): a parent replaced by a checkpoint of another run is caught.
The depth is bounded by ``--checkpoint-full-every`` (every so many checkpoints one is full), so a
restore reads a bounded chain; :func:`prune` keeps the parents of every checkpoint it keeps.

So a name can only be one of this checkpoint's own files (no path leads outside its directory),
every rank of its world has its file, and a checkpoint whose world was edited down is caught by
the rank file it no longer lists.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetgmp.trainer.checkpoint.files import (
    CheckpointError,
    atomic_write,
    digest,
    fsync_dir,
    read_verified,
    regular_file,
)

__all__ = [
    "MANIFEST",
    "Manifest",
    "Base",
    "ModelLog",
    "chain",
    "has_manifest",
    "latest",
    "parse_manifest",
    "prune",
    "part_files",
    "rank_file",
    "read_manifest",
    "set_aside_newer",
    "new_step_dir",
    "step_dir",
    "write_manifest",
]

log = logging.getLogger(__name__)

FORMAT = "hetgmp-checkpoint/1"
MANIFEST = "MANIFEST.json"
_PREFIX = "step-"
_KEYS = {"format", "step", "world", "placement_version", "records", "topic", "offsets", "created",
         "files", "extra"}
_OPTIONAL = {"topic_id", "model", "base"}
_BASE_KEYS = {"parent", "manifest_sha256", "depth"}
_STEP_DIR = re.compile(r"step-\d{12}(-\d+)?")
_MAX_DEPTH = 1 << 16
_MODEL_KEYS = {"topic", "lineage", "generation", "publishes", "offsets", "final"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RANK_FILE = re.compile(r"rank-\d{5}(-\d{4,})?\.npz")
_PART_FILE = re.compile(r"rank-(\d{5})-(\d{4,})\.npz")
_MAX_WORLD = 1 << 16


@dataclass(frozen=True)
class ModelLog:
    """Where a checkpoint stands in the model delta log (:mod:`hetgmp.trainer.serving.deltas`).

    Attributes:
        topic: The delta-log topic.
        lineage: The checkpoint directory's name in the log (its deltas carry it).
        generation: The run that wrote the checkpoint.
        publishes: Publishes made up to it; its rows' version is that of the last of them.
        offsets: Per partition, the offset below which every delta is no newer than it.
        final: The log held every change of the checkpoint when it was taken (a run that
            resumes from it need not republish its rows).
    """

    topic: str
    lineage: str
    generation: int
    publishes: int
    offsets: dict[int, int]
    final: bool

    def body(self) -> dict[str, Any]:
        """As the manifest holds it."""
        return {"topic": self.topic, "lineage": self.lineage, "generation": self.generation,
                "publishes": self.publishes, "final": self.final,
                "offsets": {str(p): int(o) for p, o in sorted(self.offsets.items())}}


@dataclass(frozen=True)
class Base:
    """What an increment is an increment of (see the schema above).

    Attributes:
        parent: The parent checkpoint's directory name (beside this one).
        manifest_sha256: SHA-256 of the parent's ``MANIFEST.json``.
        depth: Increments since the last full checkpoint, this one included (>= 1).
    """

    parent: str
    manifest_sha256: str
    depth: int

    def body(self) -> dict[str, Any]:
        """As the manifest holds it."""
        return {"parent": self.parent, "manifest_sha256": self.manifest_sha256,
                "depth": self.depth}


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint holds.

    Attributes:
        path: Its directory.
        step: Steps trained when it was taken.
        world: Ranks that wrote it.
        placement_version: Version of the placement in force.
        records: Records trained (over all ranks).
        offsets: Next offset to read per partition of ``topic`` (empty for other sources).
        topic: The Kafka topic trained from (None for other sources).
        topic_id: The topic's id when it was taken (None: unknown).
        created: Unix time it was completed.
        files: File name -> {"bytes", "sha256"}.
        extra: Settings recorded for checks at resume (model shape).
        model: The delta log it covers (see the schema above), or None.
        base: What it is an increment of (None: a full checkpoint).
    """

    path: Path
    step: int
    world: int
    placement_version: int
    records: int
    offsets: dict[int, int]
    topic: str | None
    topic_id: str | None
    created: float
    files: dict[str, dict[str, Any]]
    extra: dict[str, Any]
    model: ModelLog | None = None
    base: Base | None = None

    @property
    def depth(self) -> int:
        """Increments since the last full checkpoint (0: this one is full)."""
        return self.base.depth if self.base is not None else 0

    def digest(self) -> str:
        """SHA-256 of its ``MANIFEST.json`` (what an increment of it records)."""
        path = self.path / MANIFEST
        regular_file(path)
        return digest(path.read_bytes())

    def rank_files(self, rank: int) -> list[str]:
        """Names of ``rank``'s row files: its first, then its parts in order."""
        parts = part_files(self.files, self.world) or {}
        return [rank_file(Path(), rank).name, *parts.get(rank, [])]

    def read(self, name: str) -> bytes:
        """The bytes of one of its files, verified against the manifest."""
        meta = self.files.get(name)
        if meta is None:
            raise CheckpointError(f"{self.path}: {name} is not one of its files")
        return read_verified(self.path / name, meta["bytes"], meta["sha256"])


def step_dir(root: str | os.PathLike[str], step: int, seq: int = 0) -> Path:
    """Directory of the checkpoint taken at ``step`` (the ``seq``-th at that step, when offsets
    moved without a step; names still sort by age)."""
    return Path(root) / (f"{_PREFIX}{step:012d}" + (f"-{seq}" if seq else ""))


def new_step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """Where the next checkpoint at ``step`` goes: never a complete checkpoint's directory
    (overwriting one in place would leave, after a crash half way, neither it nor the new one);
    what a crash left incomplete there is removed first."""
    seq = 0
    while (step_dir(root, step, seq) / MANIFEST).exists():
        seq += 1
    directory = step_dir(root, step, seq)
    if directory.exists():
        shutil.rmtree(directory)
    return directory


def rank_file(directory: Path, rank: int, part: int = 0) -> Path:
    """File of ``rank``'s rows (its ``part``-th file after the first, where it has several)."""
    return directory / (f"rank-{rank:05d}.npz" if part == 0 else f"rank-{rank:05d}-{part:04d}.npz")


def part_files(names: Any, world: int) -> dict[int, list[str]] | None:
    """Each rank's files after its first among ``names``, in order; None when a part names a
    rank outside the world or a rank's parts leave a gap."""
    parts: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        m = _PART_FILE.fullmatch(name)
        if m is not None:
            parts.setdefault(int(m.group(1)), []).append((int(m.group(2)), name))
    out = {}
    for rank, found in parts.items():
        found.sort()
        if rank >= world or [n for n, _ in found] != list(range(1, len(found) + 1)):
            return None
        out[rank] = [name for _, name in found]
    return out


# Files a checkpoint may hold besides every rank's rows, the dense parameters and the
# placement: the model's torch.export program (trainer.model.export.EXPORTED).
_OPTIONAL_FILES = ("model.pt2",)


def _file_names(world: int) -> list[str]:
    return [rank_file(Path(), r).name for r in range(world)] + ["dense.npz", "placement.npz"]


def _step_dirs(base: Path, newest_first: bool = False) -> list[Path]:
    """The checkpoint directories under ``base``, oldest first (names sort by step)."""
    return sorted((p for p in base.iterdir() if p.name.startswith(_PREFIX)), reverse=newest_first)


def write_manifest(directory: Path, *, step: int, world: int, placement_version: int,
                   records: int, offsets: dict[int, int], topic: str | None,
                   topic_id: str | None = None, extra: dict[str, Any],
                   model: ModelLog | None = None, base: Base | None = None) -> Manifest:
    """Complete a checkpoint (rank 0, once every rank's files are written)."""
    files = {}
    # A model exported with torch.export (trainer.model.export) goes with the files when
    # rank 0 wrote one.
    optional = [n for n in _OPTIONAL_FILES if (directory / n).exists()]
    optional += sorted(p.name for p in directory.glob("rank-*-*.npz")
                       if _PART_FILE.fullmatch(p.name))
    for name in _file_names(world) + optional:
        path = directory / name
        if not path.exists():
            raise CheckpointError(f"{path} is missing: the checkpoint is not complete")
        data = path.read_bytes()
        files[name] = {"bytes": len(data), "sha256": digest(data)}
    body = {"format": FORMAT, "step": step, "world": world,
            "placement_version": placement_version, "records": records, "topic": topic,
            "topic_id": topic_id,
            "offsets": {str(p): int(o) for p, o in sorted(offsets.items())},
            "created": time.time(), "files": files, "extra": extra}
    if model is not None:
        body["model"] = model.body()
    if base is not None:
        body["base"] = base.body()
    data = json.dumps(body, indent=1, sort_keys=True, allow_nan=False).encode()
    atomic_write(directory / MANIFEST, lambda f: f.write(data))
    # The checkpoint directory's own entry too: offsets are committed to Kafka once this
    # returns, and a crash must not then lose the checkpoint that covers them.
    fsync_dir(directory.parent)
    return parse_manifest(directory, body)


def _int(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int:
    value = body[key]
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise CheckpointError(f"{key} must be an integer {bound}, not {value!r}")
    return value


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise CheckpointError(f"{key} must be a string or null, not {value!r}")
    return value


def _offsets(value: Any, key: str) -> dict[int, int]:
    if not isinstance(value, dict) or not all(
            isinstance(p, str) and p.isdigit() and type(o) is int and o >= 0
            for p, o in value.items()):
        raise CheckpointError(f"{key} must map partition numbers to offsets >= 0")
    return {int(p): o for p, o in value.items()}


def _model_log(value: Any) -> ModelLog | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _MODEL_KEYS:
        keys = sorted(value) if isinstance(value, dict) else value
        raise CheckpointError(f"model must be an object of exactly {sorted(_MODEL_KEYS)}, "
                              f"not {keys!r}")
    if not isinstance(value["topic"], str) or not value["topic"]:
        raise CheckpointError(f"model.topic must be a topic name, not {value['topic']!r}")
    if type(value["final"]) is not bool:
        raise CheckpointError(f"model.final must be true or false, not {value['final']!r}")
    if not isinstance(value["lineage"], str):
        raise CheckpointError(f"model.lineage must be a string, not {value['lineage']!r}")
    return ModelLog(value["topic"], value["lineage"], _int(value, "generation", 0),
                    _int(value, "publishes", 0),
                    _offsets(value["offsets"], "model.offsets"), value["final"])


def _base(value: Any) -> Base | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _BASE_KEYS:
        keys = sorted(value) if isinstance(value, dict) else value
        raise CheckpointError(f"base must be an object of exactly {sorted(_BASE_KEYS)}, "
                              f"not {keys!r}")
    parent, sha = value["parent"], value["manifest_sha256"]
    if not isinstance(parent, str) or not _STEP_DIR.fullmatch(parent):
        raise CheckpointError(f"base.parent must name a checkpoint directory (step-...), not "
                              f"{parent!r}")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise CheckpointError(f"base.manifest_sha256 must be 64 hex digits, not {sha!r}")
    return Base(parent, sha, _int(value, "depth", 1, _MAX_DEPTH))


def parse_manifest(directory: Path, body: Any) -> Manifest:
    """The manifest of ``directory`` from its JSON body, checked against the schema above.

    Raises:
        CheckpointError: What the body breaks.
    """
    try:
        if not isinstance(body, dict):
            raise CheckpointError("the manifest is not a JSON object")
        missing, unknown = _KEYS - body.keys(), body.keys() - _KEYS - _OPTIONAL
        if missing or unknown:
            raise CheckpointError(f"missing keys {sorted(missing)}, unknown keys "
                                  f"{sorted(unknown)}")
        if body["format"] != FORMAT:
            raise CheckpointError(f"unknown format {body['format']!r}")
        world = _int(body, "world", 1, _MAX_WORLD)
        offsets = _offsets(body["offsets"], "offsets")
        files = body["files"]
        parts = part_files(files, world) if isinstance(files, dict) else None
        if parts is None or set(files) - set(_OPTIONAL_FILES) - {
                n for names in parts.values() for n in names} != set(_file_names(world)):
            names = sorted(files) if isinstance(files, dict) else files
            raise CheckpointError(f"files must name exactly the {world} rank file(s), "
                                  f"dense.npz and placement.npz of a world of {world} (and "
                                  f"{', '.join(_OPTIONAL_FILES)} if written, and ranks' parts "
                                  f"numbered from 1), not {names!r}")
        for name, meta in files.items():
            if not (isinstance(meta, dict) and set(meta) == {"bytes", "sha256"}
                    and type(meta["bytes"]) is int and meta["bytes"] >= 0
                    and isinstance(meta["sha256"], str) and _SHA256.fullmatch(meta["sha256"])):
                raise CheckpointError(f"files[{name!r}] must be {{bytes: int, sha256: 64 hex "
                                      f"digits}}, not {meta!r}")
        if not isinstance(body["extra"], dict):
            raise CheckpointError("extra must be an object")
        created = body["created"]
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise CheckpointError(f"created must be a number, not {created!r}")
        return Manifest(directory, _int(body, "step", 0), world,
                        _int(body, "placement_version", 0), _int(body, "records", 0),
                        offsets, _optional_str(body, "topic"),
                        _optional_str(body, "topic_id"), float(created), dict(files),
                        dict(body["extra"]), _model_log(body.get("model")),
                        _base(body.get("base")))
    except CheckpointError as exc:
        raise CheckpointError(f"{directory / MANIFEST}: {exc}") from None


def read_manifest(directory: Path, verify: bool = False) -> Manifest:
    """The manifest of a checkpoint directory, checked against the schema and the directory.

    Every file it names must be a regular file of the size it gives, and no rank file may lie
    there that it does not name; ``verify`` also checks every file's digest (loading always
    does, on the bytes it loads).
    """
    path = directory / MANIFEST
    if not path.exists():
        raise CheckpointError(f"{directory} has no {MANIFEST}: not a complete checkpoint")
    regular_file(path)
    try:
        body = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from None
    m = parse_manifest(directory, body)
    stray = sorted(p.name for p in directory.iterdir()
                   if _RANK_FILE.fullmatch(p.name) and p.name not in m.files)
    if stray:
        raise CheckpointError(f"{directory} holds rank files its manifest does not name "
                              f"({', '.join(stray)}): its world ({m.world}) was changed?")
    for name, meta in m.files.items():
        if regular_file(directory / name).st_size != meta["bytes"]:
            raise CheckpointError(f"{directory / name} is truncated or replaced")
        if verify:
            m.read(name)
    return m


def chain(manifest: Manifest, verify: bool = False) -> list[Manifest]:
    """The checkpoints a restore of ``manifest`` reads, its full base first and it last.

    Each parent is read as :func:`read_manifest` reads a checkpoint (``verify``: every file's
    digest too) and must be the one its child names: the digest of its manifest and a depth
    one less. Raises :class:`CheckpointError` naming the first link that breaks.
    """
    out = [manifest]
    while (base := out[-1].base) is not None:
        parent = out[-1].path.parent / base.parent
        if not (parent / MANIFEST).exists():
            raise CheckpointError(f"{out[-1].path} is an increment of {base.parent}, which is "
                                  "not a complete checkpoint (deleted?)")
        found = read_manifest(parent, verify=verify)
        if found.digest() != base.manifest_sha256:
            raise CheckpointError(f"{out[-1].path} is an increment of another {base.parent} "
                                  "(its manifest's digest differs: replaced?)")
        if found.depth != base.depth - 1:
            raise CheckpointError(f"{out[-1].path}: depth {base.depth} on a parent of depth "
                                  f"{found.depth}")
        out.append(found)
    return out[::-1]


def latest(root: str | os.PathLike[str], verify: bool = True) -> Manifest | None:
    """The newest complete checkpoint under ``root`` (None if there is none).

    Directories without a manifest (a checkpoint interrupted by a crash) are skipped; so is a
    complete one whose files or whose chain's (an increment's parents) fail their checks, with a
    warning.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    for d in _step_dirs(base, newest_first=True):
        if not (d / MANIFEST).exists():
            continue
        try:
            found = read_manifest(d, verify=verify)
            chain(found, verify=verify)
            return found
        except CheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", d, exc)
    return None


def has_manifest(root: str | os.PathLike[str]) -> bool:
    """Whether any checkpoint under ``root`` got as far as its manifest (verified or not)."""
    base = Path(root)
    return base.is_dir() and any((d / MANIFEST).exists() for d in _step_dirs(base))


def set_aside_newer(root: str | os.PathLike[str], kept: Manifest) -> list[Path]:
    """Clear the way above ``kept``: checkpoint directories newer than it are removed if they
    never completed, renamed ``damaged-<name>`` if they did and failed their checks.

    A run resumes from the newest checkpoint that passes its checks. Left in place, a newer
    directory would rank above every checkpoint the resumed run writes (those are numbered from
    the older step on), so :func:`prune` would delete the good ones and keep it. One that never
    got its manifest is what a crash while writing leaves: nothing in it is worth keeping, and
    a job that crashes often would otherwise fill its disk with them. One that has a manifest
    but fails its checks is damage worth a look: it is renamed, out of the way. Returns the new
    paths of those renamed.
    """
    base = Path(root)
    moved = []
    for d in _step_dirs(base):
        if d.name <= kept.path.name:
            continue
        if not (d / MANIFEST).exists():
            shutil.rmtree(d, ignore_errors=True)
            log.warning("--resume: %s never completed (a crash while it was written); removed",
                        d.name)
            continue
        target = d.with_name(f"damaged-{d.name}")
        suffix = 1
        while target.exists():
            target = d.with_name(f"damaged-{d.name}.{suffix}")
            suffix += 1
        d.rename(target)
        log.warning("--resume: %s failed its checks; renamed to %s (delete it once looked at)",
                    d.name, target)
        moved.append(target)
    fsync_dir(base)
    return moved


def prune(root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints and the parents those need (an
    increment's chain down to its full base), and older incomplete ones."""
    base = Path(root)
    dirs = _step_dirs(base, newest_first=True)
    complete = [d for d in dirs if (d / MANIFEST).exists()]
    if len(complete) <= keep:
        return []
    oldest_kept = complete[keep - 1].name
    needed = set()
    for d in complete[:keep]:
        while d.name not in needed:
            needed.add(d.name)
            try:
                parent = read_manifest(d).base
            except CheckpointError:
                break  # not restorable anyway: its parents are not worth keeping for it
            if parent is None:
                break
            d = d.parent / parent.parent
    gone = [d for d in dirs if d.name < oldest_kept and d.name not in needed]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone
