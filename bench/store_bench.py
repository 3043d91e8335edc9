"""Benchmark of one rank's embedding path: the host store against the device store, in one run.

``hetgmp bench store``. Per step of one rank training on the synthetic stream (``--batch``
samples x 26 fields, the same ids for every variant, generated before the clock starts):

* ``dedup``: the batch's distinct ids and each entry's position among them (host: ``np.unique``
  on the ids in host memory; device: ``trainer.embedding.dedup.unique_padded`` on the ids on
  the device, their count left there);
* ``lookup``: the store's rows of those ids (rows created on first use); on the device as the
  device step makes it, ``lookup_padded`` (one readback);
* ``gather``: each entry's row (``index_select`` by the inverse), what the model reads;
* ``scatter``: a gradient per entry summed per distinct id (``index_add_``), what the backward
  pass hands the store;
* ``apply``: the row optimizer's step on those rows (row-wise Adagrad).

Variants: ``host`` (``EmbeddingStore``: numpy index and metadata, rows on ``--device``) and
``device`` with each ``DeviceIndex`` design (``DeviceStore``: everything on ``--device``). The
batch's ids start where the source leaves them: on the host for ``host``, on the device for
``device`` (the input pipeline's copy is not this benchmark's). On CUDA the device is
synchronised at each phase's end. The first ``--warmup`` steps are not timed; every variant's
rows are compared with the host store's at the end (a benchmark of a wrong store measures
nothing). The last line printed is the JSON summary ``{"bench": "store", "rows": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from bench.devices import parse_device, synchronizer
from trainer.embedding import EmbeddingStore
from trainer.embedding.dedup import unique_padded
from trainer.embedding.device_index import DESIGNS
from trainer.embedding.device_store import DeviceStore
from trainer.types import StoreConfig

__all__ = ["build_parser", "main", "parse_args"]

PHASES = ("dedup", "lookup", "gather", "scatter", "apply")


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(prog="hetgmp bench store", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8192, help="samples a step")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--dim", type=int, default=64, help="row width")
    p.add_argument("--designs", default=",".join(DESIGNS),
                   help="DeviceIndex designs of the device store, comma separated")
    p.add_argument("--device", default="cpu", help="torch device of the rows (both stores)")
    p.add_argument("--seed", type=int, default=0, help="stream seed")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.design_list = [d for d in args.designs.split(",") if d]
    unknown = sorted(set(args.design_list) - set(DESIGNS))
    if unknown:
        parser.error(f"unknown designs {unknown}; choose from {','.join(DESIGNS)}")
    if min(args.batch, args.steps, args.dim) < 1 or args.warmup < 0:
        parser.error("--batch, --steps and --dim must be positive, --warmup >= 0")
    args.torch_device = parse_device(parser, args.device)
    return args


def _run(variant: str, batches: list[np.ndarray], args: argparse.Namespace
         ) -> tuple[dict[str, float], EmbeddingStore | DeviceStore]:
    device = args.torch_device
    sync = synchronizer(device)
    config = StoreConfig()
    store: EmbeddingStore | DeviceStore
    if variant == "host":
        store = EmbeddingStore(args.dim, config, device=device)
        inputs: list[object] = list(batches)
    else:
        store = DeviceStore(args.dim, config, device=device, design=variant)  # type: ignore[arg-type]
        inputs = [torch.from_numpy(b).to(device) for b in batches]
    grad_rng = torch.Generator(device="cpu").manual_seed(1)
    grads = [torch.randn((b.size, args.dim), generator=grad_rng).to(device) * 1e-3
             for b in batches[: min(len(batches), 4)]]
    totals = dict.fromkeys(PHASES, 0.0)
    sync()
    for step, ids in enumerate(inputs):
        clock: dict[str, float] = {}
        began = time.perf_counter()
        if isinstance(ids, np.ndarray):
            uniq_np, inverse_np = np.unique(ids, return_inverse=True)
            uniq: np.ndarray | torch.Tensor = uniq_np
            inverse = torch.from_numpy(inverse_np.reshape(-1)).to(device)
        else:
            assert isinstance(ids, torch.Tensor)
            padded, inverse, count = unique_padded(ids)
        sync()
        clock["dedup"] = time.perf_counter()
        if isinstance(store, DeviceStore):  # as the device step does it: one readback
            uniq, values, _, _ = store.lookup_padded(padded, count, step)
        else:
            values, _ = store.lookup(uniq, step)  # type: ignore[arg-type]
        sync()
        clock["lookup"] = time.perf_counter()
        rows = values.index_select(0, inverse)
        sync()
        clock["gather"] = time.perf_counter()
        summed = torch.zeros_like(values).index_add_(0, inverse, grads[step % len(grads)])
        sync()
        clock["scatter"] = time.perf_counter()
        n = int(values.shape[0])
        counts = np.ones(n, np.int64) if variant == "host" else torch.ones(n, dtype=torch.int64,
                                                                           device=device)
        store.apply(uniq, summed, counts)  # type: ignore[arg-type]
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


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    args = parse_args(argv)
    from streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=args.seed))
    total = args.warmup + args.steps
    flat = stream.feature_ids(0, total * args.batch)
    batches = [np.ascontiguousarray(flat[i * args.batch:(i + 1) * args.batch]).reshape(-1)
               for i in range(total)]
    distinct = float(np.mean([np.unique(b).size for b in batches]))
    print(f"one rank's embedding path: {total} steps of {args.batch} samples x "
          f"{flat.shape[1]} fields ({distinct:,.0f} distinct ids a step), dim {args.dim}, "
          f"float32, rows on {args.torch_device}, torch threads {torch.get_num_threads()}; "
          f"{args.warmup} untimed steps first")
    rows: list[dict[str, object]] = []
    reference = None
    for variant in ["host", *args.design_list]:
        ms, store = _run(variant, batches, args)
        ids, values, _, versions = store.export()
        if reference is None:
            reference = (np.asarray(ids), values.cpu(), np.asarray(versions))
        elif not (np.array_equal(ids, reference[0]) and torch.equal(values.cpu(), reference[1])
                  and np.array_equal(versions, reference[2])):
            raise RuntimeError(f"{variant}: the store's rows differ from the host store's")
        step_ms = sum(ms.values())
        row = {"store": "host" if variant == "host" else "device",
               "design": None if variant == "host" else variant,
               "device": str(args.torch_device), "global_batch": args.batch,
               "distinct_ids_per_step": round(distinct),
               "ms_by_phase": {k: round(v, 3) for k, v in ms.items()},
               "ms_per_step": round(step_ms, 3),
               "samples_per_s": round(1000.0 * args.batch / step_ms)}
        rows.append(row)
        phases = "  ".join(f"{k} {v:6.2f}" for k, v in ms.items())
        print(f"  {variant:>7}: {step_ms:7.2f} ms a step ({row['samples_per_s']:>9,} samples/s)"
              f"  {phases}", flush=True)
    host_ms = float(rows[0]["ms_per_step"])  # type: ignore[arg-type]
    for row in rows[1:]:
        row["vs_host"] = round(host_ms / float(row["ms_per_step"]), 3)  # type: ignore[arg-type]
        print(f"  {row['design']:>7} over host: {row['vs_host']:.2f}x")
    print(json.dumps({"bench": "store", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
