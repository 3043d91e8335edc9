"""Scale curve of the partitioners: ``hetgmp bench partition --scale``.

For each window size W (``--scale-windows``, default 200k, 1M and 4M samples: 5.2M to 104M
edges at the segments shape's 26 fields), on the synthetic stream (``--shape``, drifting):

* ``full``: one ``FullPartitioner`` partition of the first W records (from hash).
* ``incremental``: ``--scale-passes`` passes of the ``IncrementalPartitioner`` after it, each
  after ``--period-records`` (P) new records: the window slides by P and carries its stream
  position, so a pass looks at the P new samples (the trainer's setting), not at the window.

Every placement is scored on the P records after its window (remote rows per sample, routed
with ``partitioner.route``, as in the rolling protocol), against hash on the same records.
``seconds`` is the partition's time, ``peak_mem_mb`` the resident high-water mark of the
process that ran it (one process per window size, reset before each partition): the
interpreter, the pages of the window's records it reads (``8 x fields`` bytes a sample,
memory-mapped from a file the run writes) and the partitioner's own work.
``new_samples`` is what a pass looked at: the P new samples, or the least share of the window
a pass takes (a quarter of it, at most 65,536 samples), whichever is more. ``seconds_per_1k_new``
divides a pass's time by it: the issue asks for it to stay within a factor of 2 across the
curve. The first pass after the full partition also summarises the window's distinct ids once
(``partitioner.window_ids``), a cost of the window, not of the pass: ``seconds`` is the mean of
the passes after it, ``first_pass_seconds`` and ``pass_seconds`` say what every pass took.

The records are generated once, in slices (the generator's peak is about 1 GB a slice whatever
W), and saved as one int64 id matrix to a temporary file (``8 x fields`` bytes a record).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Literal, cast

import numpy as np

from bench.memory import peak_mb, reset_peak
from bench.partition import _Records, _score
from hetgmp.partitioner import IncrementalPartitioner, PartitionConfig, Placement, WindowGraph

__all__ = ["run"]

Shape = Literal["segments", "user_item"]
_GENERATE_SLICE = 250_000


def _generate(shape: str, seed: int, records: int) -> np.ndarray:
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=seed, shape=cast(Shape, shape)))
    first = stream.block_ids(stream.take(0, min(records, _GENERATE_SLICE)))
    ids = np.empty((records, first.shape[1]), dtype=np.int64)
    ids[:first.shape[0]] = first
    for lo in range(first.shape[0], records, _GENERATE_SLICE):
        count = min(_GENERATE_SLICE, records - lo)
        ids[lo:lo + count] = stream.block_ids(stream.take(lo, count))
    return ids


def _row(strategy: str, window: int, fields: int, n: int, seconds: float, peak: float | None,
         rate: float, hash_rate: float, new: int | None, passes: int) -> dict[str, object]:
    row: dict[str, object] = {
        "strategy": strategy, "workers": n, "window": window, "edges": window * fields,
        "seconds": round(seconds, 3), "peak_mem_mb": peak,
        "remote_rows_per_sample": round(rate, 4), "hash_remote_rows_per_sample": round(hash_rate, 4),
        "reduction_vs_hash": round(1.0 - rate / hash_rate, 4) if hash_rate else 0.0}
    if new is not None:
        row.update(new_samples=new, passes=passes,
                   seconds_per_1k_new=round(1000.0 * seconds / max(new, 1), 4))
    return row


def _one_window(ids: np.ndarray, w: int, args: argparse.Namespace, n: int
                ) -> list[dict[str, object]]:
    p, fields = args.period_records, ids.shape[1]
    config = PartitionConfig(num_workers=n, global_batch=args.global_batch, seed=args.seed,
                             replica_fraction=args.replica_fraction,
                             replica_basis=args.replica_basis,
                             route_rounds=args.route_rounds)

    def scored(placement: Placement, end: int) -> tuple[float, float]:
        records = _Records.of_dense(ids[end:end + p])
        hashed, samples, _, _ = _score(records, Placement.hash(n), args.global_batch,
                                       split_in_order=True)
        remote, _, _, _ = _score(records, placement, args.global_batch, split_in_order=False)
        return remote / samples, hashed / samples

    refiner = IncrementalPartitioner(config)
    reset_peak()
    began = time.perf_counter()
    placement = refiner.partition(WindowGraph.from_dense(ids[:w], start=0), None)
    seconds, peak = time.perf_counter() - began, peak_mb()
    rate, hash_rate = scored(placement, w)
    rows = [_row("full", w, fields, n, seconds, peak, rate, hash_rate, None, 0)]
    _print(rows[-1])
    times, peaks, rates, hashes, looked = [], [], [], [], []
    for k in range(1, args.scale_passes + 1):
        lo = k * p
        window = WindowGraph.from_dense(ids[lo:lo + w], start=lo)
        reset_peak()
        began = time.perf_counter()
        placement = refiner.partition(window, placement)
        times.append(time.perf_counter() - began)
        peaks.append(peak_mb())
        report = refiner.last_pass
        looked.append(p if report is None else report.new_samples)
        rate, hash_rate = scored(placement, lo + w)
        rates.append(rate)
        hashes.append(hash_rate)
        print(f"{'':>10} pass {k}: {times[-1]:.2f} s over {looked[-1]} samples, {rate:.3f} "
              f"remote rows a sample (hash {hash_rate:.3f})", flush=True)
    if args.scale_passes:
        known = [x for x in peaks if x is not None]
        # Steady state: the passes after the first, which also summarised the window's ids.
        steady = times[1:] or times
        rows.append(_row("incremental", w, fields, n, float(np.mean(steady)),
                         max(known) if known else None, float(np.mean(rates)),
                         float(np.mean(hashes)), int(np.mean(looked)), args.scale_passes))
        rows[-1].update(pass_seconds=[round(t, 3) for t in times],
                        first_pass_seconds=round(times[0], 3))
        _print(rows[-1])
    # Whether METIS saw a sample of the window (the full partition, and the passes after it).
    capped = bool(config.metis_edges) and w * fields > config.metis_edges
    for row in rows:
        row.update(capped=capped, shape=args.shape)
    return rows


def _print(row: dict[str, object]) -> None:
    peak = row["peak_mem_mb"]
    per_1k = row.get("seconds_per_1k_new")
    print(f"{row['window']:>10} {row['edges']:>12} {row['strategy']:>12} {row['seconds']:>9.2f} "
          f"{'-' if peak is None else f'{peak:.0f}':>9} {row['remote_rows_per_sample']:>9.3f} "
          f"{100 * float(str(row['reduction_vs_hash'])):>7.1f}% "
          f"{'-' if per_1k is None else f'{per_1k:.3f}':>8}", flush=True)


def _measure(path: str, w: int, args: argparse.Namespace, n: int) -> list[dict[str, object]]:
    """One window size in a process of its own (see ``run``)."""
    ids = np.load(path, mmap_mode="r")
    return _one_window(ids, w, args, n)


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    """Run the curve for every window size and worker count; returns the JSON rows.

    The ids are generated once and saved; each (workers, window) runs in a fresh process that
    maps the file, so its peak memory is the interpreter, the pages of the records it reads and
    the partitioner's own work, not the other windows' records or the generator's leftovers.
    """
    windows = sorted(args.scale_windows)
    records = windows[-1] + (args.scale_passes + 1) * args.period_records
    began = time.perf_counter()
    ids = _generate(args.shape, args.seed, records)
    fields, size = ids.shape[1], ids.nbytes
    print(f"scale curve: {records} records x {fields} fields ({size / 2**20:.0f} MB "
          f"of ids) generated in {time.perf_counter() - began:.1f} s; windows "
          f"{', '.join(str(w) for w in windows)}; {args.scale_passes} incremental passes of "
          f"{args.period_records} new samples each; scored on the next {args.period_records}")
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="hetgmp-scale-") as tmp:
        path = str(Path(tmp) / "ids.npy")
        np.save(path, ids)
        del ids
        spawn = mp.get_context("spawn")
        for n in args.worker_counts:
            print(f"\n== {n} workers ==\n{'window':>10} {'edges':>12} {'strategy':>12} "
                  f"{'seconds':>9} {'peak MB':>9} {'rr/sample':>9} {'vs hash':>8} "
                  f"{'s/1k new':>8}", flush=True)
            for w in windows:
                with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                    rows.extend(pool.submit(_measure, path, w, args, n).result())
    return rows
