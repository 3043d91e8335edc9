"""The store's disk tier: rows past the memory tier's cap, whole (value, optimizer state,
version), in RocksDB on local disk.

A row lives in exactly one tier. :class:`~hetgmp.trainer.embedding.store.EmbeddingStore` spills
the least recently used rows here when it passes ``--store-max-rows`` and takes a row back into
memory when its id is read again, bit for bit what was spilled. The engine was chosen by
measurement (``hetgmp bench store --engines``, ``docs/experiments.md`` "Disk tier engines"):
RocksDB keeps its index on disk (an id -> slot map in memory would cost 16 bytes a spilled row),
stores a row in 1.08x its bytes (LMDB's B-tree pages, filled by random ids, took 3.6x), and
its checkpoints are hard links.

Keys are the ids as big-endian unsigned integers offset by 2**63, so that the engine's key order
is the ids' numeric order (``items`` answers sorted). Values are the row's floats (value then
state, in the store's dtype) followed by three int64: its version, the step of its last use
(:meth:`DiskTier.expire` drops rows idle too long: ``--store-evict-after`` reaches the disk) and
a mark the store gives it (the checkpoint epoch in which it last changed: the store reads a
spilled row's "changed since the last checkpoint" from it, without a set of ids to search).
Writes skip RocksDB's write-ahead
log: the tier is an extension of the rank's memory, not a durable copy (checkpoints are that),
and a new tier starts empty: each store opens a directory of its own, removed when the store is
collected or the process ends (a killed process's leftovers are removed by the next store that
opens under the same parent).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from hetgmp.trainer.dist import process_alive

if TYPE_CHECKING:
    from rocksdict import Rdict

__all__ = ["DiskTier", "keys_of", "open_engine"]

_OFFSET = np.uint64(1 << 63)
_PREFIX = "tier-"


def keys_of(ids: np.ndarray) -> list[bytes]:
    """The engine's keys of int64 ids (their order is the ids' numeric order)."""
    raw = (np.asarray(ids, dtype=np.int64).view(np.uint64) ^ _OFFSET).astype(">u8").tobytes()
    return [raw[i:i + 8] for i in range(0, len(raw), 8)]  # (a scalar's bytes are native order)


def _ids(keys: list[bytes]) -> np.ndarray:
    raw = np.frombuffer(b"".join(keys), dtype=">u8").astype(np.uint64)
    return (raw ^ _OFFSET).view(np.int64)


def _remove_leftovers(parent: Path) -> None:
    """Tiers of processes that are gone (killed before they could remove theirs)."""
    for old in parent.glob(f"{_PREFIX}*"):
        try:
            pid = int(old.name[len(_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if not process_alive(pid):
            shutil.rmtree(old, ignore_errors=True)


def _du(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (a file compaction removes meanwhile
    counts nothing)."""
    total = 0
    for p in path.rglob("*"):
        try:
            total += p.stat().st_blocks * 512 if p.is_file() else 0
        except FileNotFoundError:
            pass
    return total


def open_engine(path: Path) -> Rdict:
    """The tier's RocksDB at ``path``: raw bytes, no compression (float rows do not compress),
    no write-ahead log (a spill is made durable by the checkpoint, not per write), and point
    lookups' options: a hash index in each block and a bloom filter, 185k -> 205k rows/s read
    after compaction on 2M rows of 64 (docs/scale.md, "The disk tier"), a 64 MB block cache.
    ``hetgmp bench store --engines`` measures this same engine."""
    from rocksdict import DBCompressionType, Options, Rdict, WriteOptions

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.none())
    opts.optimize_for_point_lookup(64)
    db = Rdict(str(path), opts)
    write = WriteOptions()
    # A property at run time; rocksdict's stub declares a method of the same name.
    write.disable_wal = True  # type: ignore[method-assign, assignment]
    db.set_write_options(write)
    return db


def _close(db: object, path: Path) -> None:
    try:
        db.close()  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(path, ignore_errors=True)


class DiskTier:
    """Rows of one store on disk, keyed by id.

    Args:
        parent: Directory under which this tier makes its own (``tier-<pid>-<random>``).
        dim: Row width.
        state_width: Optimizer state values a row.
        dtype: Float type of values and state (the store's).
    """

    def __init__(self, parent: str | Path, dim: int, state_width: int,
                 dtype: torch.dtype) -> None:
        parent = Path(parent)
        parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(parent)
        self.path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=parent))
        self.dim, self.state_width, self.dtype = dim, state_width, dtype
        self._np_dtype = np.float64 if dtype == torch.float64 else np.float32
        self._floats = dim + state_width
        self.row_bytes = self._floats * np.dtype(self._np_dtype).itemsize + 24
        self._db = open_engine(self.path)
        self._size = 0
        self.reads = self.writes = 0  # rows, since the tier opened
        self._bytes, self._bytes_at = 0, -1e9
        # Reads ahead (read_async) run on one thread; for each, until forgotten, the ids
        # deleted since it began are kept: a row read ahead is stale once its id left the tier.
        self._reader: ThreadPoolExecutor | None = None
        self._watchers: list[list[np.ndarray]] = []
        self._finalizer = weakref.finalize(self, _close, self._db, self.path)

    def __len__(self) -> int:
        return self._size

    def close(self) -> None:
        """Close the engine and remove the directory (the rows are gone)."""
        if self._reader is not None:
            self._reader.shutdown(wait=True)
        self._finalizer()

    def read_async(self, ids: np.ndarray) -> tuple[Future[tuple[
            np.ndarray, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]], list[np.ndarray]]:
        """:meth:`get_marked` on a thread (RocksDB's multi-get runs without the GIL), and the
        list to which the ids deleted from now on are added, until :meth:`forget` of it."""
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="tier-read")
        deleted: list[np.ndarray] = []
        self._watchers.append(deleted)
        return self._reader.submit(self.get_marked, ids), deleted

    def forget(self, deleted: list[np.ndarray]) -> None:
        """Stop keeping deletes for a read ahead (:meth:`read_async`'s list)."""
        self._watchers = [w for w in self._watchers if w is not deleted]

    def flush(self) -> None:
        """Write the engine's memory table out to its files (RocksDB flushes on its own as the
        table fills; a benchmark flushes to count the bytes on disk)."""
        self._db.flush()
        self._bytes_at = -1e9

    @property
    def disk_bytes(self) -> int:
        """Bytes the tier's files take on disk (counted at most once a second: each call
        lists the directory)."""
        now = time.monotonic()
        if now - self._bytes_at >= 1.0:
            self._bytes = _du(self.path)
            self._bytes_at = now
        return self._bytes

    # -- rows ----------------------------------------------------------------------------------

    def put(self, ids: np.ndarray, values: torch.Tensor, state: torch.Tensor,
            versions: np.ndarray, used: np.ndarray | None = None,
            marks: np.ndarray | None = None) -> None:
        """Write rows of ids not in the tier (a row lives in one tier: the store's contract),
        with the step of each one's last use and its mark (None: 0 each)."""
        from rocksdict import WriteBatch

        n = int(len(ids))
        if n == 0:
            return
        packed = np.empty((n, self.row_bytes), np.uint8)
        floats = torch.cat([values, state], dim=1).detach().cpu().numpy().astype(
            self._np_dtype, copy=False)
        packed[:, :-24] = np.ascontiguousarray(floats).view(np.uint8).reshape(n, -1)
        for at, column in ((-24, versions), (-16, used), (-8, marks)):
            packed[:, at:at + 8 or None] = np.asarray(0 if column is None else column,
                                                     dtype="<i8").reshape(-1, 1).view(np.uint8)
        batch = WriteBatch(raw_mode=True)
        for key, row in zip(keys_of(ids), packed):
            batch.put(key, row.tobytes())
        self._db.write(batch)
        self._size += n
        self.writes += n

    def _none(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        return (torch.zeros((0, self.dim), dtype=self.dtype),
                torch.zeros((0, self.state_width), dtype=self.dtype), np.zeros(0, np.int64))

    def _unpack(self, raws: list[bytes]
                ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
        n = len(raws)
        packed = np.frombuffer(b"".join(raws), np.uint8).reshape(n, self.row_bytes)
        floats = np.ascontiguousarray(packed[:, :-24]).view(self._np_dtype).reshape(
            n, self._floats)
        versions, marks = (np.ascontiguousarray(packed[:, at:at + 8 or None]).view("<i8")
                           .reshape(n).astype(np.int64) for at in (-24, -8))
        rows = torch.from_numpy(floats.copy())
        return rows[:, :self.dim], rows[:, self.dim:], versions, marks

    def get(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """(mask of ids in the tier, then their values, state and versions, in the ids' order)."""
        return self.get_marked(ids)[:4]

    def get_marked(self, ids: np.ndarray
                   ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
        """:meth:`get` and the rows' marks."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0 or self._size == 0:
            return (np.zeros(ids.size, bool), *self._none(), np.zeros(0, np.int64))
        order = np.argsort(ids)  # in key order: neighbouring keys share the engine's blocks
        got = cast(list[bytes | None], self._db.get(cast(list[Any], keys_of(ids[order]))))
        hit = np.array([g is not None for g in got], dtype=bool)
        found = np.empty_like(hit)
        found[order] = hit
        rank = np.empty(ids.size, np.int64)  # each found id's place among the found, key order
        rank[order[hit]] = np.arange(int(hit.sum()))
        values, state, versions, marks = self._unpack([g for g in got if g is not None])
        back = torch.from_numpy(rank[found])
        values, state = values[back], state[back]
        versions, marks = versions[rank[found]], marks[rank[found]]
        self.reads += int(found.sum())
        return found, values.to(self.dtype), state.to(self.dtype), versions, marks

    def delete(self, ids: np.ndarray) -> None:
        """Remove rows known to be in the tier."""
        from rocksdict import WriteBatch

        if len(ids) == 0:
            return
        batch = WriteBatch(raw_mode=True)
        for key in keys_of(ids):
            batch.delete(key)
        self._db.write(batch)
        self._size -= int(len(ids))
        for deleted in self._watchers:
            deleted.append(np.asarray(ids, np.int64))

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """:meth:`get`, and the rows found leave the tier."""
        found, values, state, versions = self.get(ids)
        self.delete(np.asarray(ids, dtype=np.int64)[found])
        return found, values, state, versions

    def expire(self, before: int) -> tuple[np.ndarray, np.ndarray]:
        """Drop the rows last used before step ``before``; their (ids sorted, versions) (a scan
        of the tier, each row's trailer read without unpacking the rest)."""
        gone: list[bytes] = []
        versions: list[int] = []
        for k, v in cast(Iterable[tuple[bytes, bytes]], self._db.items()):
            if int.from_bytes(v[-16:-8], "little", signed=True) < before:
                gone.append(k)
                versions.append(int.from_bytes(v[-24:-16], "little", signed=True))
        ids = _ids(gone) if gone else np.zeros(0, np.int64)
        self.delete(ids)
        return ids, np.array(versions, np.int64)

    def ids(self) -> np.ndarray:
        """Every id in the tier, sorted."""
        keys = cast(Iterable[bytes], self._db.keys())
        return _ids(list(keys)) if self._size else np.zeros(0, np.int64)

    def items(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        """Every row: (ids sorted, values, state, versions)."""
        parts = list(self.chunks(max(self._size, 1)))
        if not parts:
            return (np.zeros(0, np.int64), *self._none())
        return parts[0]

    def chunks(self, rows: int) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor,
                                                  np.ndarray]]:
        """Every row, ``rows`` at a time in id order: (ids, values, state, versions) a chunk
        (a table larger than memory is read this way; the tier must not change meanwhile)."""
        keys: list[bytes] = []
        raws: list[bytes] = []
        for k, v in cast(Iterable[tuple[bytes, bytes]], self._db.items()):
            keys.append(k)
            raws.append(v)
            if len(keys) == rows:
                yield self._chunk(keys, raws)
                keys, raws = [], []
        if keys:
            yield self._chunk(keys, raws)

    def _chunk(self, keys: list[bytes], raws: list[bytes]
               ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]:
        values, state, versions, _ = self._unpack(raws)
        return _ids(keys), values.to(self.dtype), state.to(self.dtype), versions
