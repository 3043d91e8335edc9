"""Which embedded store holds the disk tier's rows (issue 57): LMDB, RocksDB, or fixed-size
rows in a memory-mapped file with an index in memory.

Each engine is given the tier's work on the same rows: spills (batches of evicted rows written
at once), reads of a batch's cold rows (random ids among those on disk, fetched as one call),
re-spills (rows on disk written again), then its bytes on disk a row. A row is what the store
keeps for an id: the vector, its optimizer state and its version (``--dim`` float32 + one
float32 of row-wise Adagrad + an int64).

Reads hit the page cache unless the file is larger than free memory: a 24 GiB box caches the
default 2M rows (0.5 GB). ``--rows`` larger than memory measures the disk; the summary prints the
disk's own random 4 KiB read rate from the same file for scale.

    hetgmp bench store --engines                   # about 1 min
    hetgmp bench store --engines --rows 20000000   # 5.4 GB of rows
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Protocol, cast

import numpy as np

from hetgmp.trainer.embedding.tier import keys_of, open_engine

ENGINES = ("lmdb", "rocksdb", "mmap")


class Engine(Protocol):
    def put(self, keys: np.ndarray, rows: np.ndarray) -> None: ...
    def get(self, keys: np.ndarray) -> np.ndarray: ...
    def close(self) -> None: ...


class Lmdb:
    def __init__(self, path: Path, row_bytes: int, rows: int) -> None:
        import lmdb

        self.row_bytes = row_bytes
        self.env = lmdb.open(str(path), map_size=max(1 << 30, rows * row_bytes * 4),
                             subdir=True, sync=False, metasync=False, writemap=True,
                             readahead=False, max_dbs=0)

    def put(self, keys: np.ndarray, rows: np.ndarray) -> None:
        order = np.argsort(keys)
        with self.env.begin(write=True) as txn, txn.cursor() as cur:
            cur.putmulti(zip(keys_of(keys[order]), (r.tobytes() for r in rows[order])))

    def get(self, keys: np.ndarray) -> np.ndarray:
        out = np.empty((len(keys), self.row_bytes), np.uint8)
        with self.env.begin(buffers=True) as txn, txn.cursor() as cur:
            for i, (_, v) in enumerate(cur.getmulti(keys_of(keys))):
                out[i] = np.frombuffer(v, np.uint8)
        return out

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()


class Rocks:
    """The tier's own engine and options (:func:`hetgmp.trainer.embedding.tier.open_engine`)."""

    def __init__(self, path: Path, row_bytes: int, rows: int) -> None:
        self.row_bytes = row_bytes
        self.db = open_engine(path)

    def put(self, keys: np.ndarray, rows: np.ndarray) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for k, r in zip(keys_of(keys), rows):
            wb.put(k, r.tobytes())
        self.db.write(wb)

    def get(self, keys: np.ndarray) -> np.ndarray:
        vals = cast(list[bytes], self.db.get(cast(list[Any], keys_of(keys))))
        return np.frombuffer(b"".join(vals), np.uint8).reshape(len(keys), self.row_bytes)

    def close(self) -> None:
        self.db.flush()
        self.db.compact_range(None, None)
        self.db.close()


class Mmap:
    """Fixed rows appended to a file, an id -> slot index in memory (sorted arrays)."""

    def __init__(self, path: Path, row_bytes: int, rows: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.row_bytes = row_bytes
        self.file = np.memmap(path / "rows.bin", np.uint8, "w+", shape=(max(rows, 1), row_bytes))
        self.ids = np.empty(0, np.uint64)
        self.slots = np.empty(0, np.int64)
        self.used = 0

    def _find(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.searchsorted(self.ids, keys).clip(max=max(len(self.ids) - 1, 0))
        hit = (self.ids[at] == keys) if len(self.ids) else np.zeros(len(keys), bool)
        return at, hit

    def put(self, keys: np.ndarray, rows: np.ndarray) -> None:
        at, hit = self._find(keys)
        self.file[self.slots[at[hit]]] = rows[hit]
        new = keys[~hit]
        slots = np.arange(self.used, self.used + len(new))
        self.file[slots] = rows[~hit]
        self.used += len(new)
        ids = np.concatenate([self.ids, new])
        order = np.argsort(ids, kind="stable")
        self.ids, self.slots = ids[order], np.concatenate([self.slots, slots])[order]

    def get(self, keys: np.ndarray) -> np.ndarray:
        at, _ = self._find(keys)
        slots = self.slots[at]
        order = np.argsort(slots)  # read in file order, hand back in the keys' order
        out = np.empty((len(keys), self.row_bytes), np.uint8)
        out[order] = self.file[slots[order]]
        return out

    def close(self) -> None:
        self.file.flush()
        del self.file


_MAKERS: dict[str, Callable[[Path, int, int], Engine]] = {
    "lmdb": Lmdb, "rocksdb": Rocks, "mmap": Mmap}


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def _random_reads(path: Path, reads: int, rng: np.random.Generator) -> float:
    """4 KiB random reads a second from the engine's largest file, page cache and all."""
    big = max((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    size = big.stat().st_size
    fd = os.open(big, os.O_RDONLY)
    try:
        offs = rng.integers(0, max(size // 4096, 1), reads) * 4096
        t = time.perf_counter()
        for off in offs:
            os.pread(fd, 4096, int(off))
        return reads / (time.perf_counter() - t)
    finally:
        os.close(fd)


def run_engine(name: str, root: Path, rows: int, dim: int, batch: int, spill: int,
               seed: int) -> dict:
    rng = np.random.default_rng(seed)
    row_bytes = dim * 4 + 4 + 8
    ids = rng.choice(np.iinfo(np.int64).max, size=rows, replace=False).astype(np.uint64)
    path = root / name
    engine = _MAKERS[name](path, row_bytes, rows)
    data = rng.integers(0, 256, (spill, row_bytes), dtype=np.uint8)

    t = time.perf_counter()
    for lo in range(0, rows, spill):
        engine.put(ids[lo:lo + spill], data[:min(spill, rows - lo)])
    spill_s = time.perf_counter() - t

    reads = max(rows // 10, batch * 8)
    t = time.perf_counter()
    checked = 0
    for _ in range(reads // batch):
        pick = rng.integers(0, rows, batch)
        got = engine.get(ids[pick])
        if checked == 0:  # the first batch's rows are what was written
            if not np.array_equal(got, data[pick % spill]):
                raise AssertionError(f"{name}: a row read back differs from the row written")
            checked = 1
    read_s = time.perf_counter() - t

    respill = rows // 10
    t = time.perf_counter()
    for lo in range(0, respill, spill):
        pick = rng.integers(0, rows, min(spill, respill - lo))
        engine.put(ids[pick], data[:len(pick)])
    respill_s = time.perf_counter() - t
    engine.close()
    disk = _disk_bytes(path)
    pread = _random_reads(path, 20_000, rng)
    shutil.rmtree(path, ignore_errors=True)
    return {"engine": name, "rows": rows, "row_bytes": row_bytes,
            "spill_rows_per_s": round(rows / spill_s), "read_rows_per_s":
            round((reads // batch) * batch / read_s), "respill_rows_per_s":
            round(respill / respill_s), "disk_bytes_per_row": round(disk / rows, 1),
            "disk_over_row": round(disk / rows / row_bytes, 3),
            "file_4k_reads_per_s": round(pread)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetgmp bench store --engines", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(ENGINES),
                   help=f"the engines to run, comma separated, of {', '.join(ENGINES)}")
    p.add_argument("--rows", type=int, default=2_000_000, help="rows spilled")
    p.add_argument("--dim", type=int, default=64, help="row width (float32)")
    p.add_argument("--batch", type=int, default=8192, help="ids a read fetches at once")
    p.add_argument("--spill", type=int, default=65_536, help="rows a spill writes at once")
    p.add_argument("--dir", default="", help="where the engines write (default: a temporary "
                   "directory under $TMPDIR; mind that it is a disk, not a tmpfs)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(ENGINES)
    if unknown:
        p.error(f"unknown engine(s) {sorted(unknown)}: choose from {', '.join(ENGINES)}")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tier-engines-"))
    rows = []
    try:
        print(f"== tier engines: {args.rows:,} rows of {args.dim} float32 + state + version, "
              f"spills of {args.spill:,}, reads of {args.batch:,} ids ({root})")
        for name in names:
            if name == "lmdb" and importlib.util.find_spec("lmdb") is None:
                print("    lmdb: not installed (pip install lmdb), left out")
                continue
            r = run_engine(name, root, args.rows, args.dim, args.batch, args.spill, args.seed)
            rows.append(r)
            print(f"{name:>8}: spill {r['spill_rows_per_s']:>10,} rows/s  read "
                  f"{r['read_rows_per_s']:>10,} rows/s  re-spill {r['respill_rows_per_s']:>10,}"
                  f" rows/s  {r['disk_bytes_per_row']:>7.1f} B/row on disk "
                  f"({r['disk_over_row']:.2f}x the row)  file 4 KiB reads "
                  f"{r['file_4k_reads_per_s']:,}/s", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"bench": "tier_engines", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
