"""Benchmark of the id index designs: ``trainer.embedding.device_index.DeviceIndex`` (each
design) against the numpy ``partitioner.IdIndex`` it would replace on a GPU, in one run.

Protocol, per table size ``E`` (``--entries``) and design:

* ``E`` distinct random 63-bit ids (values 0..E-1) are loaded with ``rebuild``.
* Lookups: ``--reps`` batches of ``--batch`` ids, half drawn (with repeats) from the stored ids
  and half fresh random ids (absent), shuffled; ``find`` on each.
* Churn at a constant size: ``--reps`` times, ``insert`` a batch of fresh ids, then ``remove``
  a batch of distinct stored ids; the two are timed apart. Growth, compactions and rehashes that
  fall in that window are part of the figures, as they would be in training.
* Every design sees the same ids; one untimed call of each kind goes first. Times are wall
  clock; on CUDA the device is synchronised before each clock read.

``lookup_per_s`` etc. are ids per second; ``nbytes_per_entry`` is the index's bytes over its
entries after the churn. The last line printed is the JSON summary ``{"bench": "index",
"rows": [...]}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from bench.devices import parse_device, synchronizer
from partitioner import IdIndex
from trainer.embedding.device_index import DESIGNS, DeviceIndex

__all__ = ["BASELINE", "build_parser", "main", "parse_args"]

BASELINE = "idindex"  # the numpy index, host-side, as the store uses it today


class _Index(Protocol):
    """The calls the benchmark makes, on tensors or numpy arrays alike."""

    @property
    def size(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def find(self, ids: Any) -> Any: ...

    def insert(self, ids: Any, values: Any) -> None: ...

    def remove(self, ids: Any) -> Any: ...

    def rebuild(self, ids: Any, values: Any) -> None: ...


@dataclass(frozen=True)
class _Workload:
    """The ids of one table size, shared by every design (numpy, int64)."""

    keys: np.ndarray  # stored at the start
    lookups: list[np.ndarray]  # reps + 1 batches (the first is the warm-up)
    fresh: list[np.ndarray]  # reps + 1 batches of ids never stored
    gone: list[np.ndarray]  # reps + 1 batches of distinct stored ids, disjoint


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(prog="python -m bench.index_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", default="1000000,4000000", help="table sizes, comma separated")
    p.add_argument("--batch", type=int, default=65_536, help="ids per call")
    p.add_argument("--reps", type=int, default=12, help="timed calls of each kind")
    p.add_argument("--designs", default=",".join((*DESIGNS, BASELINE)),
                   help=f"from {','.join((*DESIGNS, BASELINE))}")
    p.add_argument("--device", default="cpu", help="torch device of the DeviceIndex designs")
    p.add_argument("--seed", type=int, default=0, help="seed of the ids")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.sizes = [int(x) for x in args.entries.split(",") if x.strip()]
    except ValueError:
        p.error(f"--entries wants integers, got {args.entries!r}")
    args.design_list = [d for d in args.designs.split(",") if d]
    bad = [d for d in args.design_list if d not in (*DESIGNS, BASELINE)]
    if bad or not args.design_list:
        p.error(f"--designs from {','.join((*DESIGNS, BASELINE))}, got {bad or 'none'}")
    if not args.sizes or min(args.sizes) < 1 or args.batch < 2 or args.reps < 1:
        p.error("--entries, --batch and --reps must be positive (--batch >= 2)")
    if (args.reps + 1) * args.batch > min(args.sizes):
        p.error("--entries must hold (reps + 1) * batch ids to remove")
    args.torch_device = parse_device(p, args.device)
    return args


def _workload(entries: int, batch: int, reps: int, seed: int) -> _Workload:
    rng = np.random.default_rng(seed)
    need = entries + (reps + 1) * batch
    ids = np.unique(rng.integers(0, 2**63 - 1, size=need + need // 1000 + 16, dtype=np.int64))
    rng.shuffle(ids)  # np.unique sorts: shuffle so that stored and fresh ids mix
    keys, rest = ids[:entries], ids[entries:need]
    fresh = [rest[i * batch:(i + 1) * batch] for i in range(reps + 1)]
    order = rng.permutation(entries)
    gone = [keys[order[i * batch:(i + 1) * batch]] for i in range(reps + 1)]
    lookups = []
    for _ in range(reps + 1):
        half = batch // 2
        present = keys[rng.integers(0, entries, size=half)]
        absent = rng.integers(0, 2**63 - 1, size=batch - half, dtype=np.int64)
        lookups.append(rng.permutation(np.concatenate([present, absent])))
    return _Workload(keys, lookups, fresh, gone)


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(a).to(device)


def _setup(design: str, device: torch.device) -> tuple[_Index, Callable[[np.ndarray], Any], str]:
    """(an empty index of the design, how its inputs are made from numpy, where it runs)."""
    if design == BASELINE:
        return IdIndex(), np.asarray, "host"
    index = DeviceIndex(device=device, design=design)  # type: ignore[arg-type]
    return index, functools.partial(_to_device, device=device), str(device)


def _timed(calls: list[Callable[[], object]], sync: Callable[[], None]) -> float:
    """Seconds the calls after the first (a warm-up) take in all."""
    calls[0]()
    sync()
    began = time.perf_counter()
    for call in calls[1:]:
        call()
    sync()
    return time.perf_counter() - began


def _measure(design: str, work: _Workload, device: torch.device) -> dict[str, Any]:
    index, conv, where = _setup(design, device)
    sync = synchronizer(device)
    # Inputs go to the device before the clock starts: moving them is the caller's cost.
    lookups = [conv(a) for a in work.lookups]
    fresh = [conv(a) for a in work.fresh]
    gone = [conv(a) for a in work.gone]
    offset = work.keys.size
    began = time.perf_counter()
    index.rebuild(conv(work.keys), conv(np.arange(work.keys.size, dtype=np.int64)))
    sync()
    build_s = time.perf_counter() - began
    batch = work.lookups[0].size
    reps = len(work.lookups) - 1
    expect = np.isin(work.lookups[1], work.keys)
    got = index.find(lookups[1])
    found = np.asarray(got.cpu() if isinstance(got, torch.Tensor) else got) >= 0
    if not np.array_equal(found, expect):  # a benchmark of a wrong index measures nothing
        raise RuntimeError(f"{design}: lookups disagree with the stored ids")
    lookup_s = _timed([functools.partial(index.find, q) for q in lookups], sync)
    insert_s = remove_s = 0.0
    index.insert(fresh[0], conv(np.arange(offset, offset + batch, dtype=np.int64)))
    index.remove(gone[0])
    sync()
    for i in range(1, reps + 1):
        values = conv(np.arange(offset + i * batch, offset + (i + 1) * batch, dtype=np.int64))
        sync()
        began = time.perf_counter()
        index.insert(fresh[i], values)
        sync()
        insert_s += time.perf_counter() - began
        began = time.perf_counter()
        index.remove(gone[i])
        sync()
        remove_s += time.perf_counter() - began
    if index.size != work.keys.size:
        raise RuntimeError(f"{design}: size {index.size} after the churn, not {work.keys.size}")
    return {"design": design, "device": where, "entries": int(work.keys.size), "batch": batch,
            "lookup_per_s": round(reps * batch / lookup_s),
            "insert_per_s": round(reps * batch / insert_s),
            "remove_per_s": round(reps * batch / remove_s),
            "nbytes_per_entry": round(index.nbytes / index.size, 2),
            "build_s": round(build_s, 3)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    args = parse_args(argv)
    print(f"id index: batches of {args.batch} ids (~50% present), {args.reps} timed calls "
          f"each, DeviceIndex on {args.torch_device}, torch threads {torch.get_num_threads()}")
    rows = []
    for entries in args.sizes:
        work = _workload(entries, args.batch, args.reps, args.seed)
        for design in args.design_list:
            row = _measure(design, work, args.torch_device)
            rows.append(row)
            print(f"  {entries:>9,} {design:>8} {row['device']:>5}: lookup "
                  f"{row['lookup_per_s'] / 1e6:6.2f} M/s, insert {row['insert_per_s'] / 1e6:6.2f}"
                  f" M/s, remove {row['remove_per_s'] / 1e6:6.2f} M/s, "
                  f"{row['nbytes_per_entry']:5.1f} B/entry, build {row['build_s']:.2f} s",
                  flush=True)
    print(json.dumps({"bench": "index", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
