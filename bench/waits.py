"""Host waits for the device a training step, by number of ranks: ``hetgmp bench waits``.

The yardstick of issue 26's "at most one small device-to-host copy a step". Rank 0's steps of
:meth:`~hetgmp.trainer.step.Trainer.step` are counted by
:class:`~hetgmp.trainer.step.syncs.SyncCounter`: on CUDA
what torch reports, on a CPU the audit of the operations that would wait on CUDA (it does not
see copies in; the store's CPU-only shortcuts, ``EmbeddingStore.cpu_shortcuts``, are off so
that it counts the path CUDA takes). Ranks beyond one are threads of this process
(``ThreadComm``), on hash placement, each reading the synthetic stream; DeepFM dim 16,
float32. Nothing is timed. The last line printed is the JSON summary ``{"bench": "waits",
"rows": [{"workers", "device", "waits_per_step", "by_operation"}, ...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from bench.devices import parse_device
from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import LocalComm, ThreadComm, run_threads
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.step import SyncCounter, TrainConfig, Trainer
from hetgmp.trainer.testing import StreamSource

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(prog="hetgmp bench waits", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,2", help="rank counts, comma separated")
    p.add_argument("--batch", type=int, default=512, help="global batch")
    p.add_argument("--steps", type=int, default=8, help="counted steps (after 3 uncounted)")
    p.add_argument("--device", default="cpu", help="torch device (one rank only on cuda)")
    return p


def _rank(comm: LocalComm | ThreadComm, task: dict[str, Any]) -> dict[str, Any]:
    syn = SyntheticConfig()
    trainer = Trainer(comm, Placement.hash(comm.world), len(syn.schema.sparse),
                      len(syn.schema.dense), model=ModelConfig(model="deepfm", embed_dim=16),
                      train=TrainConfig(global_batch=task["batch"], log_every=0))
    trainer.store.cpu_shortcuts = False  # count the path CUDA takes
    source = StreamSource(syn, task["batch"] // comm.world, 3 + task["steps"])
    for _ in range(3):
        trainer.step(source.next_batch())
    counter = SyncCounter(comm.device)
    with counter if comm.rank == 0 else contextlib.nullcontext():
        for _ in range(task["steps"]):
            trainer.step(source.next_batch())
    return {"waits_per_step": round(counter.count / task["steps"], 2),
            "by_operation": dict(sorted(counter.seen.items()))}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    device = parse_device(parser, args.device)
    try:
        workers = [int(w) for w in args.workers.split(",") if w]
    except ValueError as exc:
        parser.error(str(exc))
    if not workers or min(workers) < 1:
        parser.error("--workers takes positive counts")
    if args.steps < 1 or args.batch < max(workers):
        parser.error("--steps must be positive and --batch at least one sample a rank")
    if device.type == "cuda" and max(workers) > 1:
        parser.error("on cuda one rank only (ranks as threads share the one device)")
    rows = []
    task = {"batch": args.batch, "steps": args.steps}
    for world in workers:
        got = _rank(LocalComm(device), task) if world == 1 else run_threads(_rank, task, world)[0]
        rows.append({"workers": world, "device": str(device), **got})
        ops = ", ".join(f"{k} {v / args.steps:g}" for k, v in got["by_operation"].items())
        print(f"  {world} rank(s): {got['waits_per_step']:5.2f} waits a step"
              + (f"  ({ops})" if ops else ""), flush=True)
    print(json.dumps({"bench": "waits", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
