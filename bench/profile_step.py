"""Where one rank's training step spends its time, op by op: ``hetgmp bench profile``.

One rank, one thread, the synthetic stream of ``--shape``; ``--warmup`` untimed steps, then
``--steps`` timed by phase (route, read, compute, write, dense), then ``--profile-steps`` under
``torch.profiler`` (CPU), whose ops are printed by self CPU time. The list path's profile in
issue 54's closing note came from this (``--shape user_history`` and ``multi_hot``, DeepFM dim
64, hidden 256,128, batch 8,192). The last line is a JSON summary: samples/s, values a sample,
seconds a step by phase and the top ops.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic_config import SHAPES, SyntheticConfig
from hetgmp.trainer.dist import PHASES, LocalComm
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import Bags, ModelConfig
from hetgmp.trainer.sources import SyntheticSpec, open_source
from hetgmp.trainer.step import TrainConfig, Trainer

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hetgmp bench profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="user_history", choices=SHAPES, help="synthetic shape")
    p.add_argument("--model", default="deepfm", help="a built-in model")
    p.add_argument("--embed-dim", type=int, default=64, help="embedding dimension")
    p.add_argument("--hidden", default="256,128", help="hidden layer sizes")
    p.add_argument("--global-batch", type=int, default=8192, help="samples a step")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--steps", type=int, default=6, help="steps timed by phase")
    p.add_argument("--profile-steps", type=int, default=2, help="steps under the profiler")
    p.add_argument("--rows", type=int, default=25, help="ops printed")
    p.add_argument("--seed", type=int, default=1, help="stream seed")
    args = p.parse_args(argv)
    if min(args.embed_dim, args.global_batch, args.steps, args.profile_steps, args.rows) < 1 \
            or args.warmup < 0:
        p.error("sizes and step counts must be positive (--warmup >= 0)")
    torch.set_num_threads(1)
    b = args.global_batch
    total = args.warmup + args.steps + args.profile_steps
    source = open_source(SyntheticSpec(SyntheticConfig(seed=args.seed, shape=args.shape), 0,
                                       b * total), b, 0, 1)
    batches = [source.next_batch() for _ in range(total)]
    schema = source.schema
    model = ModelConfig(model=args.model, embed_dim=args.embed_dim,
                        hidden=tuple(int(x) for x in args.hidden.split(",") if x.strip()))
    trainer = Trainer(LocalComm(), Placement.hash(1), len(schema.sparse), len(schema.dense),
                      model=model, store=StoreConfig(optimizer="adagrad", lr=0.05),
                      train=TrainConfig(global_batch=b, log_every=0), bags=Bags.of(schema))
    for batch in batches[:args.warmup]:
        trainer.step(batch)
    trainer.finish_step()
    timed = batches[args.warmup:args.warmup + args.steps]
    phases = np.zeros(len(PHASES))
    began = time.perf_counter()
    for batch in timed:
        counters = trainer.step(batch)
        assert counters is not None  # None only when every rank's source is exhausted
        phases += counters.seconds
    trainer.finish_step()
    took = time.perf_counter() - began
    values = sum(batch.values.size for batch in timed) / (len(timed) * b)
    by_phase = {k: round(float(v) / len(timed), 4) for k, v in zip(PHASES, phases)}
    print(f"== profile: {args.shape}, {args.model} dim {args.embed_dim}, hidden {args.hidden}, "
          f"batch {b:,}, 1 rank, 1 thread: {len(timed) * b / took:,.0f} samples/s, "
          f"{values:.1f} values a sample; s a step by phase {by_phase}", flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[args.warmup + args.steps:]:
            trainer.step(batch)
        trainer.finish_step()
    averages = prof.key_averages()
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.rows]
    print(json.dumps({"bench": "profile", "shape": args.shape, "model": args.model,
                      "samples_per_s": round(len(timed) * b / took),
                      "values_per_sample": round(values, 1), "seconds_by_phase": by_phase,
                      "top_ops_ms": {e.key: round(e.self_cpu_time_total / 1000, 1)
                                     for e in top}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
