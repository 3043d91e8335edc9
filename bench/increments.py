"""Checkpoints that grow with what changed (issue 57): ``hetgmp bench store --checkpoints``.

One CPU rank's store of ``--table-rows`` rows of ``--dim`` with row-wise Adagrad (all in memory,
or ``--memory-rows`` of them with the rest in the disk tier) is checkpointed in full, the way
``hetgmp train`` writes one (:mod:`hetgmp.trainer.checkpoint`: the rank's rows, the dense part
and the placement, each file's SHA-256 in the manifest). Then, ``--rounds`` times,
``--changed-rows`` distinct rows drawn at random take an update (lookup + apply, as a step does)
and two checkpoints of that state are written: an increment of the checkpoint before (the rows
changed since) and, in another directory, a full one.

Figures per round: seconds and bytes of each and their ratios (target at 10^8 rows with 10^6
changed: bytes <= 0.05x), and the seconds to read each back (``load_rows``: the increment's
whole chain, base first). What the chain restores must equal what the full checkpoint restores,
bit for bit (ids, values, optimizer state, versions), or the benchmark fails. The last line is
the JSON summary ``{"bench": "checkpoints", "rows": [...]}``.

The issue's size is ``--table-rows 1e8 --memory-rows 1e7 --changed-rows 1e6 --rounds 1``
(about 60 GB of disk: the tier and a full checkpoint). Past ``--compare-rows`` rows (2e7) no
reference full checkpoint is written a round (it would take as much disk again, and reading
either back whole as much memory): the increment is set against the first full checkpoint (the
same rows then), and what the chain restores, read a file at a time as a resume reads it, is
checked against the store's own rows by an order-free fingerprint (the count, and a sum over
rows of a 64-bit hash of each row's id, bits and version).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.store_bench import fill_rows
from hetgmp.partitioner import Placement
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig

__all__ = ["main"]


def write(root: Path, store: EmbeddingStore, step: int, parent: ckpt.Manifest | None,
          part_rows: int) -> tuple[ckpt.Manifest, float, int]:
    """A one-rank checkpoint of ``store`` (an increment of ``parent``, or full, its disk rows
    ``part_rows`` a file): its manifest, seconds and bytes (every file of its directory)."""
    began = time.perf_counter()
    base = None if parent is None else ckpt.Base(parent.path.name, parent.digest(),
                                                 parent.depth + 1)
    directory = ckpt.new_step_dir(root, step)
    directory.mkdir(parents=True)
    parts, removed = store.saved_rows(full=base is None, part_rows=part_rows)
    ckpt.save_rows(directory, 0, parts, removed=None if base is None else removed)
    ckpt.save_dense(directory, {"flat": np.zeros(1000, np.float32)})
    ckpt.save_placement(directory, Placement.hash(1))
    manifest = ckpt.write_manifest(directory, step=step, world=1, placement_version=0,
                                   records=step, offsets={}, topic=None, extra={}, base=base)
    seconds = time.perf_counter() - began
    return manifest, seconds, sum(f.stat().st_size for f in directory.iterdir())


def _loaded(manifest: ckpt.Manifest) -> tuple[tuple[np.ndarray, ...], float]:
    began = time.perf_counter()
    rows = ckpt.load_rows(manifest)
    return rows, time.perf_counter() - began


def fingerprint(parts: Iterable[tuple[np.ndarray, Any, Any, np.ndarray]]) -> tuple[int, int]:
    """(rows, an order-free digest of them): the wrapping sum over rows of a hash of the id,
    the bits of value and state, and the version."""
    weights: np.ndarray | None = None
    count, total = 0, np.uint64(0)
    with np.errstate(over="ignore"):
        for ids, values, state, versions in parts:
            v, st = (np.asarray(x.numpy() if isinstance(x, torch.Tensor) else x)
                     for x in (values, state))
            bits = np.concatenate([np.ascontiguousarray(v).view(np.uint32),
                                   np.ascontiguousarray(st).view(np.uint32)], axis=1)
            if weights is None:
                drawn = np.random.default_rng(1).integers(1, 2**63, bits.shape[1],
                                                          dtype=np.uint64)
                weights = np.bitwise_or(drawn, np.uint64(1))
            h = (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
            h ^= np.asarray(ids, np.int64).view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            h += np.asarray(versions, np.int64).view(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
            h ^= h >> np.uint64(29)
            total += h.sum(dtype=np.uint64)
            count += int(np.asarray(ids).size)
    return count, int(total)


def _timed_fingerprint(parts: Iterable[tuple[np.ndarray, Any, Any, np.ndarray]]
                       ) -> tuple[tuple[int, int], float]:
    began = time.perf_counter()
    return fingerprint(parts), time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetgmp bench store --checkpoints", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table-rows", type=float, default=1e7, help="rows of the table")
    p.add_argument("--changed-rows", type=float, default=1e5,
                   help="distinct rows updated between two checkpoints")
    p.add_argument("--memory-rows", type=float, default=0,
                   help="rows kept in memory, the rest in the disk tier (0: all in memory)")
    p.add_argument("--dim", type=int, default=64, help="row width (float32)")
    p.add_argument("--rounds", type=int, default=3, help="increments written")
    p.add_argument("--part-rows", type=int, default=1 << 21,
                   help="disk rows a file of a full checkpoint (the memory it needs)")
    p.add_argument("--dir", default="", help="where checkpoints (and the tier) go (default: "
                   "$TMPDIR; removed at the end)")
    p.add_argument("--compare-rows", type=float, default=2e7,
                   help="largest table given a reference full checkpoint a round (past it: "
                        "the first full checkpoint, and fingerprints)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    table, changed, memory = int(args.table_rows), int(args.changed_rows), int(args.memory_rows)
    if not 0 < changed <= table or not 0 <= memory < table or args.rounds < 1:
        p.error("need 0 < --changed-rows <= --table-rows, 0 <= --memory-rows < --table-rows "
                "and --rounds >= 1")
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir or None))
    try:
        return _run(args, table, changed, memory, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, table: int, changed: int, memory: int, work: Path) -> int:
    rng = np.random.default_rng(args.seed)
    ids = np.arange(table, dtype=np.int64) * 7919 + 11
    config = StoreConfig(max_rows=memory, disk_dir=str(work / "tier")) if memory \
        else StoreConfig()
    store = EmbeddingStore(args.dim, config)
    print(f"== checkpoints: {table:,} rows of {args.dim} + Adagrad"
          + (f" ({memory:,} in memory, the rest on disk)" if memory else " in memory")
          + f", {changed:,} rows changed between checkpoints ({work})", flush=True)
    fill_rows(store, ids, 1 << 20, seed=7, published=True)
    parent, full_s, full_bytes = write(work / "chain", store, 0, None, args.part_rows)
    print(f"full checkpoint: {full_bytes / 2**20:,.1f} MB in {full_s:.1f} s", flush=True)
    gen = torch.Generator().manual_seed(args.seed)
    out = []
    for r in range(1, args.rounds + 1):
        touched = np.sort(rng.choice(ids, changed, replace=False))
        store.lookup(touched, r)
        store.apply(touched, torch.randn((changed, args.dim), generator=gen) * 1e-3,
                    np.ones(changed, np.int64))
        if store.over_cap:
            store.maintain(r)
        parent, inc_s, inc_bytes = write(work / "chain", store, r, parent, args.part_rows)
        compared = table <= args.compare_rows
        if compared:
            reference, ref_s, ref_bytes = write(work / f"full-{r}", store, r, None,
                                                args.part_rows)
            got, inc_load = _loaded(parent)
            want, ref_load = _loaded(reference)
            same = all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
            shutil.rmtree(reference.path.parent)
        else:  # against the first full checkpoint; the chain streamed against the store
            ref_s, ref_bytes = full_s, full_bytes
            got_fp, inc_load = _timed_fingerprint(ckpt.iter_rows(parent))
            # (nothing changed since the increment: the marks this clears are clear)
            want_fp, ref_load = _timed_fingerprint(store.saved_rows(True, args.part_rows)[0])
            same = got_fp == want_fp
        if not same:
            raise SystemExit(f"round {r}: the chain restores other rows than the store holds "
                             "(its full checkpoint): the increments are wrong")
        row = {"round": r, "table_rows": table, "changed_rows": changed,
               "memory_rows": memory or table, "depth": parent.depth,
               "increment_bytes": inc_bytes, "full_bytes": ref_bytes,
               "bytes_ratio": round(inc_bytes / ref_bytes, 4),
               "increment_s": round(inc_s, 3), "full_s": round(ref_s, 3),
               "seconds_ratio": round(inc_s / ref_s, 4),
               "restore_chain_s": round(inc_load, 2),
               # the reference read back: the full checkpoint's, or (past --compare-rows) the
               # store's own rows
               ("restore_full_s" if compared else "read_store_s"): round(ref_load, 2)}
        out.append(row)
        print(f"round {r}: increment {inc_bytes / 2**20:,.1f} MB in {inc_s:.2f} s, full "
              f"{ref_bytes / 2**20:,.1f} MB in {ref_s:.2f} s ({row['bytes_ratio']:.4f}x the "
              f"bytes, {row['seconds_ratio']:.3f}x the time); restore: chain of "
              f"{parent.depth + 1} {inc_load:.1f} s, "
              f"{'full' if compared else 'the store read'} {ref_load:.1f} s; equal", flush=True)
    store.close()
    print(json.dumps({"bench": "checkpoints", "rows": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
