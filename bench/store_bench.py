"""Benchmark of one rank's embedding store, phase by phase: ``hetgmp bench store``.

Per step of one rank training on the synthetic stream (``--batch`` samples x 26 fields, for
each batch size given; the ids generated before the clock starts and copied to ``--device``
there too: the input pipeline's copy is not this benchmark's), as the one-rank training step
(:meth:`hetgmp.trainer.step.Trainer.step` through ``RowExchange``) drives the store:

* ``dedup``: the batch's distinct ids and each entry's position among them
  (:func:`hetgmp.trainer.embedding.unique_padded`, their count left on the device);
* ``lookup``: the store's rows of those ids, created on first use
  (:meth:`~hetgmp.trainer.embedding.EmbeddingStore.lookup_padded`: the step's one readback);
* ``gather``: each entry's row (``index_select`` by the inverse), what the model reads;
* ``scatter``: a gradient per entry summed per distinct id (``index_add_``), what the backward
  pass hands the store;
* ``apply``: the row optimizer's step on those rows (row-wise Adagrad,
  :meth:`~hetgmp.trainer.embedding.EmbeddingStore.apply`).

The store is :class:`hetgmp.trainer.embedding.EmbeddingStore` with its default settings (on a CPU with
its CPU-only shortcuts, as training there runs it). On CUDA the device is synchronised at each
phase's end. The first ``--warmup`` steps are not timed. ``rows_per_s`` is distinct ids a
second through the whole step, ``lookup_rows_per_s`` and ``apply_rows_per_s`` through those
phases alone. At the end the store is checked against the ids it was given (every distinct id
has a row, with one version per step that used it): a benchmark of a wrong store measures
nothing. The last line printed is the JSON summary ``{"bench": "store", "rows": [...]}``, a row
per batch size.

With ``--rows N[,N...]`` it measures instead how the store grows, a row per size (``--dim 16``
and Adagrad, as issue 46 asks): the store capped at ``max_rows = N`` is filled with N rows
(the timed batches' ids and filler ids, in bulk through ``put``), then the same timed steps
run (every id has its row, so lookup and apply alone are compared across sizes:
``lookup_apply_rows_per_s`` and its ratio to the first size), then ``--evict-rounds`` rounds
each bring N/32 new ids in and ``maintain`` evicts down to the low-water mark
(``evict_us_per_row``). ``overhead_bytes_per_row`` is ``store.nbytes / len(store)`` less the
row and its optimizer state; ``rows_after_maintain_max`` must never pass N (the cap),
``rows_peak`` is the most held within a step (N plus that step's new rows).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time

import numpy as np
import torch

from bench.devices import parse_device, synchronizer
from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig, initial_rows, unique_padded

__all__ = ["PHASES", "build_parser", "fill_rows", "main", "parse_args"]

PHASES = ("dedup", "lookup", "gather", "scatter", "apply")


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(prog="hetgmp bench store", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", default="8192",
                   help="samples a step, comma separated for several sizes (a row each)")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--dim", type=int, default=64, help="row width")
    p.add_argument("--device", default="cpu", help="torch device of the store")
    p.add_argument("--seed", type=int, default=0, help="stream seed")
    p.add_argument("--rows", default="",
                   help="store sizes, comma separated (e.g. 100000,10000000): measure how the "
                        "store grows instead (see above; empty = the phase benchmark)")
    p.add_argument("--evict-rounds", type=int, default=3,
                   help="with --rows: rounds of N/32 new ids past the cap, each evicted")
    p.add_argument("--tiers", action="store_true",
                   help="instead: the store with a disk tier against every row in memory "
                        "(bench/tiers.py; its own flags follow, see --tiers --help)")
    p.add_argument("--checkpoints", action="store_true",
                   help="instead: increments against full checkpoints of a large store "
                        "(bench/increments.py; its own flags follow, see --checkpoints --help)")
    p.add_argument("--engines", action="store_true",
                   help="instead: the disk tier's candidate engines on the tier's work "
                        "(bench/tier_engines.py; its own flags follow, see --engines --help)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.batch_sizes = [int(x) for x in args.batch.split(",") if x.strip()]
        args.sizes = [int(float(x)) for x in args.rows.split(",") if x.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    if args.sizes and (min(args.sizes) < 32 or args.evict_rounds < 1):
        parser.error("--rows sizes must be >= 32 and --evict-rounds >= 1")
    if not args.batch_sizes or min(args.batch_sizes + [args.steps, args.dim]) < 1 \
            or args.warmup < 0:
        parser.error("--batch, --steps and --dim must be positive, --warmup >= 0")
    args.torch_device = parse_device(parser, args.device)
    return args


def _run(batches: list[np.ndarray], args: argparse.Namespace
         ) -> tuple[dict[str, float], EmbeddingStore]:
    """Milliseconds a timed step by phase, and the store the steps left."""
    device = args.torch_device
    sync = synchronizer(device)
    store = EmbeddingStore(args.dim, StoreConfig(), device=device)
    inputs = [torch.from_numpy(b).to(device) for b in batches]
    grad_rng = torch.Generator(device="cpu").manual_seed(1)
    grads = [torch.randn((b.size, args.dim), generator=grad_rng).to(device) * 1e-3
             for b in batches[: min(len(batches), 4)]]
    totals = dict.fromkeys(PHASES, 0.0)
    sync()
    for step, ids in enumerate(inputs):
        clock: dict[str, float] = {}
        began = time.perf_counter()
        u = unique_padded(ids)
        padded, inverse, count = u.ids, u.inverse, u.n
        sync()
        clock["dedup"] = time.perf_counter()
        uniq, values, _, _ = store.lookup_padded(padded, count, step)  # the one readback
        sync()
        clock["lookup"] = time.perf_counter()
        rows = values.index_select(0, inverse)
        sync()
        clock["gather"] = time.perf_counter()
        summed = torch.zeros_like(values).index_add_(0, inverse, grads[step % len(grads)])
        sync()
        clock["scatter"] = time.perf_counter()
        store.apply(uniq, summed, torch.ones(uniq.numel(), dtype=torch.int64, device=device))
        sync()
        clock["apply"] = time.perf_counter()
        del rows
        if step >= args.warmup:
            last = began
            for phase in PHASES:
                totals[phase] += clock[phase] - last
                last = clock[phase]
    timed = len(inputs) - args.warmup
    return {p: 1000.0 * s / timed for p, s in totals.items()}, store


def _check(store: EmbeddingStore, batches: list[np.ndarray]) -> None:
    """The store holds a row for every distinct id given, updated once a step that used it."""
    ids, uses = np.unique(np.concatenate([np.unique(b) for b in batches]), return_counts=True)
    got, _, _, versions = store.export()
    if not (np.array_equal(got, ids) and np.array_equal(versions, uses)):
        raise RuntimeError(f"the store holds {got.size:,} rows ({int(versions.sum()):,} "
                           f"updates) for {ids.size:,} distinct ids ({int(uses.sum()):,} uses)")


def filler_ids(start: int, count: int) -> np.ndarray:
    """``count`` distinct non-negative int64 ids, spread over the whole id space: positions
    ``start..start+count`` times an odd constant modulo ``2**63`` (a bijection)."""
    pos = np.arange(start, start + count, dtype=np.uint64)
    return ((pos * np.uint64(0x9E3779B97F4A7C15)) & np.uint64(2**63 - 1)).astype(np.int64)


def fill_rows(store: EmbeddingStore, ids: np.ndarray, chunk: int = 1 << 22, *,
              seed: int | None = None, published: bool = False, rising: bool = False) -> None:
    """Install rows of ``ids`` (distinct, none in the store yet) in bulk (initial values, fresh
    state, version 0); ``seed``: values a function of (seed, id), the same in every store and
    order (else drawn at random, faster); ``rising``: each chunk counts as used one step after
    the one before (with a cap, the last chunks are the ones kept in memory), else all at 0."""
    width = store.config.state_width
    for n, at in enumerate(range(0, ids.size, chunk)):
        part = ids[at:at + chunk]
        if seed is None:
            values = torch.empty((part.size, store.dim)).uniform_(-0.05, 0.05)
        else:
            values = torch.from_numpy(initial_rows(part, store.dim, seed, 0.05))
        state = torch.zeros((part.size, width))
        store.put(torch.from_numpy(part), values.to(store.dtype), state,
                  torch.zeros(part.size, dtype=torch.int64), n if rising else 0,
                  published=published, new=True)


def _grown(batches: list[np.ndarray], size: int, args: argparse.Namespace) -> dict[str, object]:
    """One row of the ``--rows`` protocol for a store of ``size`` rows."""
    resident = np.unique(np.concatenate(batches))
    if resident.size > size:
        raise SystemExit(f"--rows {size:,}: the timed batches hold {resident.size:,} distinct "
                         f"ids; give a smaller --batch or fewer --steps")
    store = EmbeddingStore(args.dim, StoreConfig(max_rows=size), device=args.torch_device)
    began = time.perf_counter()
    fill_rows(store, np.concatenate([resident, filler_ids(0, size - resident.size)]))
    fill_s = time.perf_counter() - began
    overhead_full = store.nbytes / len(store) - 4 * (args.dim + store.config.state_width)
    grads = torch.randn((max(b.size for b in batches), args.dim),
                        generator=torch.Generator().manual_seed(1)) * 1e-3
    spent = 0.0
    rows = 0
    for step, ids in enumerate(batches, start=1):
        flat = torch.from_numpy(ids)
        uniq, inverse = torch.unique(flat, return_inverse=True)
        began = time.perf_counter()
        values, _ = store.lookup(uniq, step)
        summed = torch.zeros_like(values).index_add_(0, inverse, grads[:flat.numel()])
        store.apply(uniq, summed, torch.ones(uniq.numel(), dtype=torch.int64))
        if step > args.warmup:
            spent += time.perf_counter() - began
            rows += uniq.numel()
    if len(store) != size or store.stats.created:
        raise RuntimeError(f"the timed steps changed the store: {len(store):,} rows, "
                           f"{store.stats.created:,} created")
    evicted, evict_s, after_max, peak = 0, 0.0, 0, size
    new = max(1, size // 32)
    for r in range(args.evict_rounds):
        fresh = torch.from_numpy(filler_ids(size + r * new, new))
        step = len(batches) + 1 + r
        values, _ = store.lookup(fresh, step)
        store.apply(fresh, torch.zeros_like(values), torch.ones(new, dtype=torch.int64))
        peak = max(peak, len(store))
        began = time.perf_counter()
        evicted += store.maintain(step) if store.over_cap else 0
        evict_s += time.perf_counter() - began
        after_max = max(after_max, len(store))
    if after_max > size:
        raise RuntimeError(f"the store held {after_max:,} rows after maintain, cap {size:,}")
    return {"rows": size, "dim": args.dim, "fill_s": round(fill_s, 2),
            "distinct_ids_per_step": round(rows / max(1, args.steps)),
            "lookup_apply_rows_per_s": round(rows / max(spent, 1e-9)),
            "overhead_bytes_per_row": round(overhead_full, 1),
            "overhead_bytes_per_row_after_evict":
                round(store.nbytes / len(store) - 4 * (args.dim + store.config.state_width), 1),
            "store_mb": round(store.nbytes / 2**20),
            "evicted": evicted, "evict_us_per_row": round(1e6 * evict_s / max(1, evicted), 3),
            "rows_after_maintain_max": after_max, "rows_peak": peak}


def grow_main(args: argparse.Namespace) -> int:
    """The ``--rows`` protocol; the last printed line is the JSON summary."""
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=args.seed))
    size = args.batch_sizes[0]
    total = args.warmup + args.steps
    flat = stream.feature_ids(0, total * size)
    batches = [np.ascontiguousarray(flat[i * size:(i + 1) * size]).reshape(-1)
               for i in range(total)]
    print(f"the store at {', '.join(f'{n:,}' for n in args.sizes)} rows (capped there), dim "
          f"{args.dim}, Adagrad: {args.steps} timed steps of {size} samples every row resident, "
          f"then {args.evict_rounds} rounds of N/32 new ids evicted", flush=True)
    rows: list[dict[str, object]] = []
    first = 0.0
    for n in args.sizes:
        row = _grown(batches, n, args)
        rate = float(row["lookup_apply_rows_per_s"])  # type: ignore[arg-type]
        first = first or rate
        row["lookup_apply_vs_first"] = round(rate / first, 3)
        row["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        rows.append(row)
        print(f"  {n:>12,} rows: {row['overhead_bytes_per_row']:5.1f} B a row beyond row and "
              f"state ({row['overhead_bytes_per_row_after_evict']:.1f} after eviction), "
              f"lookup+apply {row['lookup_apply_rows_per_s']:>10,} rows/s "
              f"({row['lookup_apply_vs_first']:.2f}x the first), eviction "
              f"{row['evict_us_per_row']:.2f} us a row, most rows after maintain "
              f"{row['rows_after_maintain_max']:,} (peak {row['rows_peak']:,}), filled in "
              f"{row['fill_s']} s", flush=True)
        gc.collect()
    print(json.dumps({"bench": "store", "mode": "rows", "rows": rows}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if "--checkpoints" in argv:
        from bench import increments

        return increments.main([a for a in argv if a != "--checkpoints"])
    if "--engines" in argv:
        from bench import tier_engines

        return tier_engines.main([a for a in argv if a != "--engines"])
    if "--tiers" in argv:
        from bench import tiers

        return tiers.main([a for a in argv if a != "--tiers"])
    args = parse_args(argv)
    if args.sizes:
        return grow_main(args)
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=args.seed))
    total = args.warmup + args.steps
    print(f"one rank's embedding store: {total} steps a batch size, the first {args.warmup} "
          f"untimed, dim {args.dim}, float32, on {args.torch_device}, torch threads "
          f"{torch.get_num_threads()}")
    rows: list[dict[str, object]] = []
    for size in args.batch_sizes:
        flat = stream.feature_ids(0, total * size)
        batches = [np.ascontiguousarray(flat[i * size:(i + 1) * size]).reshape(-1)
                   for i in range(total)]
        distinct = float(np.mean([np.unique(b).size for b in batches[args.warmup:]]))
        ms, store = _run(batches, args)
        _check(store, batches)
        step_ms = sum(ms.values())
        row = {"device": str(args.torch_device), "global_batch": size,
               "fields": int(flat.shape[1]), "distinct_ids_per_step": round(distinct),
               "rows_in_store": len(store),
               "ms_by_phase": {k: round(v, 3) for k, v in ms.items()},
               "ms_per_step": round(step_ms, 3),
               "samples_per_s": round(1000.0 * size / step_ms),
               "rows_per_s": round(1000.0 * distinct / step_ms),
               "lookup_rows_per_s": round(1000.0 * distinct / max(ms["lookup"], 1e-9)),
               "apply_rows_per_s": round(1000.0 * distinct / max(ms["apply"], 1e-9))}
        rows.append(row)
        phases = "  ".join(f"{k} {v:6.2f}" for k, v in ms.items())
        print(f"  batch {size:>6} ({distinct:>9,.0f} distinct ids): {step_ms:7.2f} ms a step, "
              f"{row['rows_per_s']:>10,} rows/s ({row['samples_per_s']:>9,} samples/s)  "
              f"ms {phases}", flush=True)
    print(json.dumps({"bench": "store", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
