"""``hetgmp bench partition --sweep``: placement on many id matrices, judged by its worst case.

One matrix hid issue 55's collapse: the capped full partition lost 30 points at the default
seed on a matrix generated the way a user would, and no benchmark here had such a matrix. The
sweep partitions every matrix of a grid with several METIS seeds, capped and uncapped, with
and without an incremental pass, at several worker counts, beside hash and the published
algorithm (``hetgmp-paper``, :mod:`bench.hetgmp_paper`), and reports the worst case and the
median of each comparison per shape.

Matrices (``--sweep-records`` records each, offline: every id placed, scored on the records
themselves, as ``--offline``):

* ``recipe``: issue 45's recipe (:func:`bench.matrices.recipe`), for each generator seed
  (``--sweep-generators``), numbered densely field by field (``dense``) or hashed as the
  decoder hashes (``hashed``), in generation order or shuffled;
* the synthetic shapes without drift: ``segments`` and ``user_item`` (one value a field),
  ``multi_hot`` and ``user_history`` (lists), hashed, for each generator seed.

Per matrix and worker count: hash (samples split in order); for each METIS seed
(``--sweep-seeds``): ``capped`` (the trainer's full partition: METIS on a sample within
``metis_edges``, and from ``compare_from`` workers the better of it and HET-GMP's algorithm),
``uncapped`` (``metis_edges`` 0), ``capped+pass`` (one incremental pass over every record after
``capped``); ``hetgmp-paper`` (its seed the METIS seed), scored with the trainer's routing and
with its own sample assignment (``hetgmp-paper-own``: where HET-GMP trains each sample).
Replicas: ``--replica-fraction`` of ``--replica-basis`` (1% of the window's rows by default,
HET-GMP's count), the same for both algorithms. Remote rows a sample, every global batch
routed by ``route`` (the routing the trainer chose on every stream measured at loopback
speeds; ``--route-rounds N`` scores batch-aware routing instead), against hash.

Summary, per shape: the worst and the median over its matrices, seeds and worker counts of
ours (``capped+pass``, what the trainer runs) against hash, of capped minus uncapped (points;
target: above -3 everywhere), and of ours minus the paper's algorithm (points; target: >= 0).
JSON rows per run, then ``{"bench": "partition-sweep", "rows": [...], "summary": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.matrices import recipe
from bench.memory import peak_mb, reset_peak
from hetgmp.partitioner import (
    FullPartitioner,
    IncrementalPartitioner,
    PartitionConfig,
    Placement,
    WindowGraph,
    routed_remote_rows,
)
from hetgmp.partitioner.measures import remote_rows
from hetgmp.runtime import fmix64
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

__all__ = ["Matrix", "add_flags", "check_flags", "main_sweep", "matrices", "run_sweep",
           "summarise"]

SHAPES = ("recipe", "segments", "user_item", "multi_hot", "user_history")
_HASH_SALT = np.uint64(0x51ED_2701_9A3C_55AB)


@dataclass(frozen=True)
class Matrix:
    """One id matrix of the grid (CSR: record ``i`` reads ``values[indptr[i]:indptr[i+1]]``)."""

    shape: str
    numbering: str
    order: str
    generator: int
    indptr: np.ndarray
    values: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.shape}/{self.numbering}/{self.order}/g{self.generator}"

    @property
    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        return self.indptr, self.values


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The sweep's flags on ``hetgmp bench partition``."""
    g = parser.add_argument_group("sweep (--sweep)")
    g.add_argument("--sweep", action="store_true",
                   help="partition a grid of matrices (shapes x numberings x orders x "
                        "generator seeds) with several METIS seeds, capped and uncapped, with "
                        "and without a pass, beside hash and the published algorithm; "
                        "summary: worst case and median per shape")
    g.add_argument("--sweep-records", type=int, default=200_000,
                   help="records of each matrix")
    g.add_argument("--sweep-shapes", default=",".join(SHAPES),
                   help=f"comma-separated shapes of the grid ({', '.join(SHAPES)})")
    g.add_argument("--sweep-generators", default="0,1",
                   help="generator seeds: each makes another matrix of every shape")
    g.add_argument("--sweep-seeds", default="0,1,2", help="METIS (and paper) seeds")
    g.add_argument("--sweep-workers", default="4,8,32", help="worker counts")
    g.add_argument("--sweep-uncapped", action=argparse.BooleanOptionalAction, default=True,
                   help="also partition uncapped (METIS on every edge: the slowest part)")


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse sweep flags that name nothing (a usage error before anything runs)."""
    try:
        lists = [_ints(x) for x in (args.sweep_generators, args.sweep_seeds,
                                    args.sweep_workers)]
    except ValueError:
        parser.error("--sweep-generators, --sweep-seeds and --sweep-workers take integers")
    shapes = [s.strip() for s in str(args.sweep_shapes).split(",") if s.strip()]
    if not shapes or any(s not in SHAPES for s in shapes):
        parser.error(f"--sweep-shapes: one or more of {', '.join(SHAPES)}")
    if args.sweep_records < 100 or not all(lists) or min(lists[2]) < 2:
        parser.error("--sweep-records >= 100, and at least one generator, seed and worker "
                     "count (>= 2)")


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def _hashed(values: np.ndarray) -> np.ndarray:
    """Ids as the decoder's hashing scatters them (64-bit, no order left)."""
    return (fmix64(values.astype(np.int64).view(np.uint64) ^ _HASH_SALT)
            .view(np.int64) & np.int64(2**63 - 1))


def matrices(args: argparse.Namespace) -> Iterator[Matrix]:
    """The grid's matrices, one at a time (each is large)."""
    n = args.sweep_records
    for shape in [s.strip() for s in str(args.sweep_shapes).split(",") if s.strip()]:
        if shape not in SHAPES:
            raise ValueError(f"--sweep-shapes: {shape!r} is not one of {', '.join(SHAPES)}")
        for gen in _ints(args.sweep_generators):
            if shape == "recipe":
                for order in ("generated", "shuffled"):
                    ids, _ = recipe(n, gen, order=order)
                    indptr = np.arange(n + 1, dtype=np.int64) * ids.shape[1]
                    yield Matrix(shape, "dense", order, gen, indptr, ids.reshape(-1))
                    if order == "shuffled":
                        yield Matrix(shape, "hashed", order, gen, indptr,
                                     _hashed(ids.reshape(-1)))
                continue
            stream = SyntheticStream(SyntheticConfig(seed=gen, shape=shape,  # type: ignore
                                                     drift_every=10**12))
            indptr, values = stream.sample_csr(stream.take(0, n))
            yield Matrix(shape, "hashed", "generated", gen, indptr, values)


def _hash_rate(m: Matrix, n: int, batch: int) -> float:
    """Remote rows a sample under hash, each global batch split over the workers in order."""
    hashed = Placement.hash(n)
    total, samples = 0, m.indptr.size - 1
    for lo in range(0, samples, batch):
        hi = min(lo + batch, samples)
        part = (m.indptr[lo:hi + 1] - m.indptr[lo], m.values[m.indptr[lo]:m.indptr[hi]])
        workers = np.arange(hi - lo) * n // max(hi - lo, 1)
        total += int(remote_rows(part, workers, hashed).sum())
    return total / max(samples, 1)


def _own_rate(m: Matrix, placement: Placement, worker: np.ndarray, batch: int) -> float:
    """Remote rows a sample with each sample on the worker the paper's algorithm gave it."""
    total, samples = 0, m.indptr.size - 1
    for lo in range(0, samples, batch):
        hi = min(lo + batch, samples)
        part = (m.indptr[lo:hi + 1] - m.indptr[lo], m.values[m.indptr[lo]:m.indptr[hi]])
        total += int(remote_rows(part, worker[lo:hi], placement).sum())
    return total / max(samples, 1)


def _runs(m: Matrix, n: int, seed: int, args: argparse.Namespace
          ) -> Iterator[tuple[str, Placement | tuple[Placement, np.ndarray], float, float]]:
    """(strategy, placement or (placement, own sample workers), seconds, peak MB) of every run
    of one matrix, worker count and seed."""
    config = PartitionConfig(num_workers=n, global_batch=args.global_batch, min_count=1,
                             replica_fraction=args.replica_fraction,
                             replica_basis=args.replica_basis, seed=seed)
    window = WindowGraph(m.indptr, m.values)

    def timed(fn: Any) -> tuple[Any, float, float]:
        reset_peak()
        began = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - began, peak_mb() or 0.0

    capped, s, mb = timed(lambda: FullPartitioner(config).partition(window, None))
    yield "capped", capped, s, mb
    if args.sweep_uncapped:
        uncapped, s, mb = timed(lambda: FullPartitioner(replace(config, metis_edges=0))
                                .partition(window, None))
        yield "uncapped", uncapped, s, mb
    passed, s, mb = timed(lambda: IncrementalPartitioner(config).partition(window, capped))
    yield "capped+pass", passed, s, mb
    paper = _paper()
    if paper is not None:
        result, s, mb = timed(lambda: paper(window, config))
        placement = result.with_replicas(config.replica_fraction, config.replica_basis)
        yield "hetgmp-paper", placement, s, mb
        yield "hetgmp-paper-own", (placement, result.sample_worker), s, mb


def _paper() -> Any:
    """The published algorithm's partition function, where the bench has it."""
    try:
        from hetgmp.partitioner.hetgmp import paper_partition
    except ImportError:  # pragma: no cover - the baseline ships with the bench
        return None
    return paper_partition


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run of the grid: JSON rows, printed one a line as they come."""
    rows: list[dict[str, Any]] = []
    print(f"{'matrix':<34} {'n':>3} {'seed':>4} {'strategy':>16} {'rr/sample':>9} "
          f"{'vs hash':>8} {'seconds':>7} {'MB':>6}", flush=True)
    for m in matrices(args):
        for n in _ints(args.sweep_workers):
            hash_rate = _hash_rate(m, n, args.global_batch)
            for seed in _ints(args.sweep_seeds):
                for strategy, what, seconds, mb in _runs(m, n, seed, args):
                    if isinstance(what, tuple):
                        rate = _own_rate(m, what[0], what[1], args.global_batch)
                    else:
                        rate = routed_remote_rows(m.csr, what, args.global_batch,
                                                  int(args.route_rounds)) / (m.indptr.size - 1)
                    reduction = 1.0 - rate / hash_rate
                    row: dict[str, Any] = {"matrix": m.name, "shape": m.shape, "numbering": m.numbering,
                           "order": m.order, "generator": m.generator, "workers": n,
                           "seed": seed, "strategy": strategy,
                           "routing": "own" if isinstance(what, tuple) else
                           (f"batch-aware {args.route_rounds}" if args.route_rounds
                            else "route"),
                           "remote_rows_per_sample": round(rate, 4),
                           "hash_remote_rows_per_sample": round(hash_rate, 4),
                           "reduction_vs_hash": round(reduction, 4),
                           "seconds": round(seconds, 2), "peak_mem_mb": round(mb, 1)}
                    rows.append(row)
                    print(f"{m.name:<34} {n:>3} {seed:>4} {strategy:>16} {rate:>9.3f} "
                          f"{-100 * reduction:>7.1f}% {seconds:>7.1f} "
                          f"{mb:>6.0f}", flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape: worst and median of ours against hash, capped - uncapped, ours - paper (in
    points of reduction against hash; worst = the lowest)."""
    out: dict[str, Any] = {}
    key = ("matrix", "workers", "seed")
    by_run: dict[tuple[Any, ...], dict[str, float]] = {}
    shape_of: dict[tuple[Any, ...], str] = {}
    for r in rows:
        k = tuple(r[x] for x in key)
        by_run.setdefault(k, {})[r["strategy"]] = 100.0 * float(r["reduction_vs_hash"])
        shape_of[k] = r["shape"]
    for shape in dict.fromkeys(shape_of.values()):
        runs = [(k, v) for k, v in by_run.items() if shape_of[k] == shape]
        figures: dict[str, list[tuple[float, str]]] = {"ours_vs_hash": [],
                                                       "capped_minus_uncapped": [],
                                                       "ours_minus_paper": []}
        for k, v in runs:
            where = f"{k[0]} n={k[1]} seed={k[2]}"
            if "capped+pass" in v:
                figures["ours_vs_hash"].append((v["capped+pass"], where))
            if "capped" in v and "uncapped" in v:
                figures["capped_minus_uncapped"].append((v["capped"] - v["uncapped"], where))
            paper = max((v[p] for p in ("hetgmp-paper", "hetgmp-paper-own") if p in v),
                        default=None)
            if paper is not None and "capped+pass" in v:
                figures["ours_minus_paper"].append((v["capped+pass"] - paper, where))
        out[shape] = {name: {"worst": round(min(f)[0], 2), "worst_at": min(f)[1],
                             "median": round(float(np.median([x for x, _ in f])), 2),
                             "runs": len(f)}
                      for name, f in figures.items() if f}
    return out


def main_sweep(args: argparse.Namespace) -> int:
    """Run the sweep and print its summary and the JSON line."""
    rows = run_sweep(args)
    summary = summarise(rows)
    print("worst case and median per shape (points of reduction against hash):", flush=True)
    for shape, figures in summary.items():
        for name, f in figures.items():
            print(f"  {shape:<13} {name:<22} worst {f['worst']:>7.2f} ({f['worst_at']})  "
                  f"median {f['median']:>7.2f}  runs {f['runs']}", flush=True)
    print(json.dumps({"bench": "partition-sweep", "rows": rows, "summary": summary}), flush=True)
    return 0
