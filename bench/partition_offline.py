"""HET-GMP's offline protocol of ``hetgmp bench partition --offline`` (see ``bench.partition``'s
docstring): one partition of all the records, scored on those same records.

Rows by strategy: ``hash``; ``static`` (our full partition, capped and uncapped);
``incremental`` (ours: passes over the records from the capped static placement);
``hetgmp-paper`` (HET-GMP's own algorithm as its paper describes it, ``bench.hetgmp_paper``:
random start, 5 alternating rounds, its replica ranking under the same budget), computed once
per worker count, its replicas chosen per budget.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from bench.memory import peak_mb, reset_peak
from bench.partition import ORACLE, PAPER, _oracle, _score
from bench.records import _Records
from hetgmp.partitioner import (
    FullPartitioner,
    IncrementalPartitioner,
    PartitionConfig,
    Placement,
    WindowGraph,
    plan_diff,
    row_imbalance,
)
from hetgmp.partitioner.hetgmp import PaperPartition, paper_partition

__all__ = ["run_offline"]


def _offline_row(ids: _Records, placement: Placement, graph: WindowGraph,
                 args: argparse.Namespace, strategy: str, basis: str, hash_rate: float,
                 seconds: float, label: str = "", peak: float | None = None
                 ) -> dict[str, object]:
    """Score an offline placement on its own records, print its line and return its row."""
    remote, samples, step_imb, _ = _score(ids, placement, args.global_batch,
                                          split_in_order=False, rounds=args.route_rounds)
    rate = remote / samples
    imb = max(step_imb, row_imbalance(placement, graph.indices))
    copies = int(placement.replica_counts().mean())
    n = placement.num_workers
    peak_text = "-" if peak is None else f"{peak:.0f}"
    print(f"{n:>7} {strategy:>12} {basis:>9} {copies:>15} {rate:9.3f} "
          f"{100 * (1 - rate / hash_rate):7.1f}% {imb:9.3f} {seconds:8.1f} {peak_text:>8}  "
          f"{label}", flush=True)
    return {"workers": n, "strategy": strategy, "replica_basis": basis,
            "remote_rows_per_sample": round(rate, 4),
            "reduction_vs_hash": round(1.0 - rate / hash_rate, 4), "imbalance": round(imb, 4),
            "seconds": round(seconds, 3), "replicas_per_worker": copies, "peak_mem_mb": peak}


def _paper(graph: WindowGraph, config: PartitionConfig) -> tuple[PaperPartition, float,
                                                                   float | None]:
    """HET-GMP's algorithm on the records: its result, seconds and peak memory."""
    reset_peak()
    began = time.perf_counter()
    result = paper_partition(graph, config)
    return result, time.perf_counter() - began, peak_mb()


def _paper_row(ids: _Records, graph: WindowGraph, args: argparse.Namespace,
               paper: tuple[PaperPartition, float, float | None], basis: str,
               hash_rate: float) -> dict[str, object]:
    """The paper's row of one budget: its owners with the replicas the budget buys."""
    result, seconds, peak = paper
    began = time.perf_counter()
    placement = result.with_replicas(args.replica_fraction, basis)
    seconds += time.perf_counter() - began
    costs = result.costs
    row = _offline_row(ids, placement, graph, args, PAPER, basis, hash_rate, seconds,
                       label=f"cost {costs[0]:.3g} -> {costs[-1]:.3g} in {len(costs) - 1} "
                             f"rounds", peak=peak)
    return {**row, "cost_by_round": [round(c, 1) for c in costs]}


def run_offline(ids: _Records, args: argparse.Namespace, segments: np.ndarray | None = None
                ) -> list[dict[str, object]]:
    """HET-GMP's protocol: one partition of all the records, scored on those same records.

    Runs the strategies of ``args.strategies``. With ``segments`` (``--oracle``), each budget
    also scores the generator's communities as a placement (``_oracle``), strategy
    ``segments``, before the partitioners' own.
    """
    graph = ids.graph()
    chosen = set(args.strategies)
    rows: list[dict[str, object]] = []
    print(f"{'workers':>7} {'strategy':>12} {'budget of':>9} {'mean replicas':>15} "
          f"{'rr/sample':>9} {'vs hash':>8} {'imbalance':>9} {'seconds':>8} {'peak MB':>8}")
    for n in args.worker_counts:
        hashed = Placement.hash(n)
        remote, samples, _, _ = _score(ids, hashed, args.global_batch, split_in_order=True)
        hash_rate = remote / samples
        rows.append({"workers": n, "strategy": "hash", "replica_basis": None,
                     "remote_rows_per_sample": round(hash_rate, 4), "reduction_vs_hash": 0.0,
                     "imbalance": 1.0, "seconds": 0.0, "replicas_per_worker": 0,
                     "peak_mem_mb": None})
        print(f"{n:>7} {'hash':>12} {'-':>9} {0:>15} {hash_rate:9.3f} {0.0:7.1f}% "
              f"{1.0:9.3f} {0.0:8.1f}", flush=True)
        seed = args.seed if args.metis_seed is None else args.metis_seed
        config = PartitionConfig(num_workers=n, global_batch=args.global_batch, seed=seed,
                                 min_count=1, replica_fraction=args.replica_fraction,
                                 route_rounds=args.route_rounds)
        # The paper's partition does not depend on the budget: once per worker count.
        paper = _paper(graph, config) if PAPER in chosen else None
        for basis in args.offline_bases:
            config = replace(config, replica_basis=basis)
            if segments is not None:
                began = time.perf_counter()
                oracle = _oracle(graph, segments, config)
                rows.append(_offline_row(ids, oracle, graph, args, ORACLE, basis, hash_rate,
                                         time.perf_counter() - began))
            if "static" in chosen:
                rows.extend(_ours(ids, graph, args, config, basis, hash_rate))
            if paper is not None:
                rows.append(_paper_row(ids, graph, args, paper, basis, hash_rate))
    return rows


def _ours(ids: _Records, graph: WindowGraph, args: argparse.Namespace, config: PartitionConfig,
          basis: str, hash_rate: float) -> list[dict[str, object]]:
    """Our rows of one budget: static capped and uncapped, then incremental passes."""
    rows: list[dict[str, object]] = []
    # The full partition capped (METIS sees a sample of at most metis_edges edges) and
    # uncapped (METIS sees them all), side by side: the cap must not cost quality.
    for capped in (True, False):
        reset_peak()
        began = time.perf_counter()
        cfg = config if capped else replace(config, metis_edges=0)
        placement = FullPartitioner(cfg).partition(graph, None)
        seconds = time.perf_counter() - began
        row = _offline_row(ids, placement, graph, args, "static", basis, hash_rate,
                           seconds, label="capped" if capped else "uncapped",
                           peak=peak_mb())
        rows.append({**row, "capped": capped})
    if "incremental" not in args.strategies:
        return rows
    # (The passes start from the last placement above, the uncapped one, as they always did.)
    refiner = IncrementalPartitioner(config, recent_fraction=1.0, recent_cap=None)
    moved, kept, seconds = 0, 0, 0.0
    peaks: list[float] = []
    for done in range(1, args.offline_passes + 1):
        reset_peak()
        began = time.perf_counter()
        repaired = refiner.partition(graph, placement)
        seconds += time.perf_counter() - began
        held = refiner.last_pass is not None and refiner.last_pass.kept_current
        kept += int(held)
        peak = peak_mb()
        peaks += [] if peak is None else [peak]
        moved += plan_diff(placement, repaired, args.row_bytes).rows_moved
        placement = repaired
        row = _offline_row(ids, placement, graph, args, "incremental", basis, hash_rate,
                           seconds, label=f"pass {done}" + (" kept" if held else ""),
                           peak=max(peaks) if peaks else None)
    if args.offline_passes:
        row.update(passes=args.offline_passes, rows_migrated=moved, kept_passes=kept,
                   capped=True)
        rows.append(row)
    return rows
