"""Durable writes and verified reads of a checkpoint's files.

Every file is written to a temporary name, flushed to disk, renamed into place, and the directory
entry is synced too, so a crash leaves either the old state or the new file, never half a file.
A file is read whole, checked against the digest its manifest gives, and only then parsed, so
what is loaded is what was verified (no check-then-read race), and only regular files inside the
checkpoint directory are read (a symbolic link is refused: it could point anywhere).

Arrays are stored with ``numpy.savez`` and loaded with ``allow_pickle=False``: nothing in a
checkpoint is unpickled, so a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np

__all__ = ["CheckpointError", "atomic_write", "digest", "fsync_dir", "load_arrays",
           "read_verified", "save_arrays"]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, damaged, or does not match the job."""


def fsync_dir(path: Path) -> None:
    """Make ``path``'s directory entries durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Any], object]) -> None:
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
    fsync_dir(path.parent)


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` as one ``.npz`` file, durably."""
    # (numpy's stub lets a ** mapping fill savez's allow_pickle keyword, hence the cast.)
    atomic_write(path, lambda f: np.savez(f, **cast(dict[str, Any], arrays)))


def digest(data: bytes) -> str:
    """SHA-256 of ``data``, hex."""
    return hashlib.sha256(data).hexdigest()


def regular_file(path: Path) -> os.stat_result:
    """``path``'s status, refusing anything but a regular file (a link could point anywhere)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path} is not a regular file (a link or a device): refused")
    return st


def read_verified(path: Path, size: int, sha256: str) -> bytes:
    """The bytes of ``path``, once they match the size and digest a manifest gives."""
    regular_file(path)
    data = path.read_bytes()
    if len(data) != size:
        raise CheckpointError(f"{path} has {len(data)} bytes, its manifest says {size}: "
                              f"truncated or replaced")
    if digest(data) != sha256:
        raise CheckpointError(f"{path} does not match its digest: damaged or replaced")
    return data


def load_arrays(data: bytes, path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file's verified bytes."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            return {k: arrays[k] for k in arrays.files}
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{path} is not a readable array file: {exc}") from None
