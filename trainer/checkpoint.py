"""Checkpoints: every rank's rows, the dense model, the placement and the Kafka offsets trained.

Layout (one directory per checkpoint, ``step-<step>`` under the checkpoint directory)::

    step-000000001200/
        rank-00000.npz ... rank-0000N.npz   rows a rank owns: ids, values, optimizer state, versions
        dense.npz                           dense parameters and their optimizer state (rank 0)
        placement.npz                       the placement in force (rank 0)
        MANIFEST.json                       written last: the checkpoint is complete once it exists

Every file is written to a temporary name, flushed to disk, renamed into place, and the directory
entry is synced too, so a crash leaves either the old state or the new file, never half a file;
after the manifest, the checkpoint directory's entry in the root is synced as well.
The manifest, written by rank 0 after every rank's files are durable, names them with their sizes
and SHA-256 digests and holds the step, the world size, the records trained and the next Kafka
offset of every partition trained from. Offsets are committed to Kafka only after the manifest is
durable (invariant 5): a crash between the two replays at most one checkpoint interval.

Arrays are stored with ``numpy.savez`` and loaded with ``allow_pickle=False``; the manifest is
JSON. Nothing in a checkpoint is unpickled, so a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from partitioner import Placement

__all__ = [
    "CheckpointError",
    "Manifest",
    "latest",
    "load_dense",
    "load_placement",
    "load_rows",
    "prune",
    "rank_file",
    "save_dense",
    "save_placement",
    "save_rows",
    "step_dir",
    "write_manifest",
]

log = logging.getLogger(__name__)

FORMAT = "hetgmp-checkpoint/1"
MANIFEST = "MANIFEST.json"
_PREFIX = "step-"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match the job."""


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
        created: Unix time it was completed.
        files: File name -> {"bytes", "sha256"}.
        extra: Settings recorded for checks at resume (model shape).
    """

    path: Path
    step: int
    world: int
    placement_version: int
    records: int
    offsets: dict[int, int]
    topic: str | None
    created: float
    files: dict[str, dict[str, Any]]
    extra: dict[str, Any]


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """Directory of the checkpoint taken at ``step``."""
    return Path(root) / f"{_PREFIX}{step:012d}"


def _step_dirs(base: Path, newest_first: bool = False) -> list[Path]:
    """The checkpoint directories under ``base``, oldest first (names sort by step)."""
    return sorted((p for p in base.iterdir() if p.name.startswith(_PREFIX)), reverse=newest_first)


def rank_file(directory: Path, rank: int) -> Path:
    """File of ``rank``'s rows."""
    return directory / f"rank-{rank:05d}.npz"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Any) -> None:
    """Write through ``write(file)`` to a temporary file, sync it, rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # (numpy's stub lets a ** mapping fill savez's allow_pickle keyword, hence the cast.)
    _atomic_write(path, lambda f: np.savez(f, **cast(dict[str, Any], arrays)))


def _load_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        raise CheckpointError(f"{path} is missing")
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def save_rows(directory: Path, rank: int, ids: np.ndarray, values: torch.Tensor,
              state: torch.Tensor, versions: np.ndarray) -> None:
    """Write ``rank``'s owned rows."""
    _save_arrays(rank_file(directory, rank), {
        "ids": np.asarray(ids, np.int64), "values": _np(values), "state": _np(state),
        "versions": np.asarray(versions, np.int64)})


def load_rows(manifest: Manifest, keep: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                             np.ndarray]:
    """Rows of every rank file of a checkpoint, filtered by ``keep(ids) -> bool mask``.

    Returns:
        (ids, values, optimizer state, versions) of the rows kept, ids sorted.
    """
    parts = []
    for rank in range(manifest.world):
        a = _load_arrays(rank_file(manifest.path, rank))
        mask = keep(a["ids"]) if keep is not None else np.ones(a["ids"].size, bool)
        parts.append({k: v[mask] for k, v in a.items()})
    ids = np.concatenate([p["ids"] for p in parts])
    order = np.argsort(ids, kind="stable")
    if ids.size and bool(np.any(ids[order][1:] == ids[order][:-1])):
        raise CheckpointError(f"{manifest.path}: an id is owned by two ranks")
    return (ids[order], np.concatenate([p["values"] for p in parts])[order],
            np.concatenate([p["state"] for p in parts])[order],
            np.concatenate([p["versions"] for p in parts])[order])


def save_dense(directory: Path, arrays: dict[str, torch.Tensor | np.ndarray]) -> None:
    """Write the dense parameters and their optimizer state."""
    _save_arrays(directory / "dense.npz",
                 {k: _np(v) if isinstance(v, torch.Tensor) else np.asarray(v)
                  for k, v in arrays.items()})


def load_dense(manifest: Manifest) -> dict[str, np.ndarray]:
    """The dense arrays of a checkpoint."""
    return _load_arrays(manifest.path / "dense.npz")


def save_placement(directory: Path, placement: Placement) -> None:
    """Write a placement (replica sets concatenated, with one count per worker)."""
    reps = placement.replicas
    _save_arrays(directory / "placement.npz", {
        "version": np.array([placement.version], np.int64),
        "num_workers": np.array([placement.num_workers], np.int64),
        "ids": placement.ids, "owners": placement.owners,
        "replica_counts": np.array([r.size for r in reps], np.int64),
        "replicas": np.concatenate(reps) if reps else np.zeros(0, np.int64)})


def load_placement(manifest: Manifest) -> Placement:
    """The placement a checkpoint was taken under."""
    a = _load_arrays(manifest.path / "placement.npz")
    bounds = np.concatenate([[0], np.cumsum(a["replica_counts"])])
    reps = tuple(a["replicas"][bounds[i]:bounds[i + 1]] for i in range(bounds.size - 1))
    return Placement(int(a["version"][0]), int(a["num_workers"][0]), a["ids"], a["owners"], reps)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path, *, step: int, world: int, placement_version: int,
                   records: int, offsets: dict[int, int], topic: str | None,
                   extra: dict[str, Any]) -> Manifest:
    """Complete a checkpoint (rank 0, once every rank's files are written)."""
    names = [rank_file(directory, r).name for r in range(world)] + ["dense.npz", "placement.npz"]
    files = {}
    for name in names:
        path = directory / name
        if not path.exists():
            raise CheckpointError(f"{path} is missing: the checkpoint is not complete")
        files[name] = {"bytes": path.stat().st_size, "sha256": _digest(path)}
    body = {"format": FORMAT, "step": step, "world": world,
            "placement_version": placement_version, "records": records,
            "topic": topic, "offsets": {str(p): int(o) for p, o in sorted(offsets.items())},
            "created": time.time(), "files": files, "extra": extra}
    data = json.dumps(body, indent=1, sort_keys=True).encode()
    _atomic_write(directory / MANIFEST, lambda f: f.write(data))
    # The checkpoint directory's own entry too: offsets are committed to Kafka once this
    # returns, and a crash must not then lose the checkpoint that covers them.
    _fsync_dir(directory.parent)
    return _manifest(directory, body)


def _manifest(directory: Path, body: dict[str, Any]) -> Manifest:
    return Manifest(directory, int(body["step"]), int(body["world"]),
                    int(body["placement_version"]), int(body["records"]),
                    {int(p): int(o) for p, o in body["offsets"].items()}, body.get("topic"),
                    float(body["created"]), dict(body["files"]), dict(body.get("extra", {})))


def read_manifest(directory: Path, verify: bool = False) -> Manifest:
    """The manifest of a checkpoint directory (``verify``: check every file's digest)."""
    path = directory / MANIFEST
    if not path.exists():
        raise CheckpointError(f"{directory} has no {MANIFEST}: not a complete checkpoint")
    body = json.loads(path.read_text())
    if body.get("format") != FORMAT:
        raise CheckpointError(f"{path}: unknown format {body.get('format')!r}")
    m = _manifest(directory, body)
    for name, meta in m.files.items():
        f = directory / name
        if not f.exists() or f.stat().st_size != meta["bytes"]:
            raise CheckpointError(f"{f} is missing or truncated")
        if verify and _digest(f) != meta["sha256"]:
            raise CheckpointError(f"{f} does not match its digest")
    return m


def latest(root: str | os.PathLike[str], verify: bool = True) -> Manifest | None:
    """The newest complete checkpoint under ``root`` (None if there is none).

    Directories without a manifest (a checkpoint interrupted by a crash) are skipped; so is a
    complete one whose files fail their check, with a warning.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    for d in _step_dirs(base, newest_first=True):
        if not (d / MANIFEST).exists():
            continue
        try:
            return read_manifest(d, verify=verify)
        except (CheckpointError, ValueError, KeyError) as exc:  # ValueError: broken JSON
            log.warning("skipping checkpoint %s: %s", d, exc)
    return None


def has_manifest(root: str | os.PathLike[str]) -> bool:
    """Whether any checkpoint under ``root`` got as far as its manifest (verified or not)."""
    base = Path(root)
    return base.is_dir() and any((d / MANIFEST).exists() for d in _step_dirs(base))


def set_aside_newer(root: str | os.PathLike[str], kept: Manifest) -> list[Path]:
    """Rename the checkpoint directories newer than ``kept`` to ``damaged-<name>``.

    A run resumes from the newest checkpoint that passes its checks; any newer one failed them
    or never completed. Left in place, such a directory would rank above every checkpoint the
    resumed run writes (those are numbered from the older step on), so :func:`prune` would
    delete the good ones and keep it. Renamed, it is out of the way and still there to look
    at. Returns the new paths.
    """
    base = Path(root)
    moved = []
    for d in _step_dirs(base):
        if d.name > kept.path.name:
            target = d.with_name(f"damaged-{d.name}")
            suffix = 1
            while target.exists():
                target = d.with_name(f"damaged-{d.name}.{suffix}")
                suffix += 1
            d.rename(target)
            log.warning("--resume: %s failed its checks or never completed; renamed to %s "
                        "(delete it once looked at)", d.name, target)
            moved.append(target)
    if moved:
        _fsync_dir(base)
    return moved


def prune(root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, and older incomplete ones."""
    base = Path(root)
    dirs = _step_dirs(base, newest_first=True)
    complete = [d for d in dirs if (d / MANIFEST).exists()]
    if len(complete) <= keep:
        return []
    oldest_kept = complete[keep - 1].name
    gone = [d for d in dirs if d.name < oldest_kept]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone
