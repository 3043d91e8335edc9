"""One rank's training speed against the model alone: ``hetgmp bench gpu`` (runs on a CPU too).

One rank, DeepFM, embedding dim 64, hidden 256,128, float32, the in-memory synthetic source
(batches generated before the clock starts), for each global batch (``--batches``, default
8,192 and 65,536), in one run:

* ``trainer``: the trainer's step (:meth:`hetgmp.trainer.step.Trainer.step`): the batch copied to the
  rank's device once, its ids deduplicated there (``trainer.embedding.dedup``), the rows read,
  created and updated by the store on the device (``trainer.embedding.EmbeddingStore``), and
  the host waiting once a step (the step's counts, with the last step's loss);
* ``model_only``: the model's forward and backward alone on each batch's rows, gathered into
  one tensor on the device before that step's clock starts, with the dense optimizer's step:
  the ceiling the embedding path is measured against.

With both paths, the trainer's row carries ``trainer_over_model_only``, its samples/s over the
model's alone at that batch (1 = the embedding path costs nothing). The two run one after the
other, each timed as it runs in training (the trainer's steps back to back, so that on CUDA a
step's host work overlaps the last step's device work); on a shared machine the ratio moves
with the machine's load.

``ms_by_phase`` is the trainer's own per-step timing (route, read, compute, write, dense; on
CUDA each phase ends where the host reached, so queued work shows in the phase that waits for
it: a step's queued work is waited for by the next step's one readback, its counts with this
step's loss, in the next step's read phase); ``syncs_per_step`` counts the host's waits for
the device (``trainer.step.syncs``), the benchmark's own excluded, over 2 untimed steps after the
timed ones: on CUDA what torch reports under ``set_sync_debug_mode("warn")``, on a CPU the
audit of the operations that would wait on CUDA (with the store's CPU-only shortcuts off);
``peak_mem_mb`` is ``torch.cuda.max_memory_allocated`` (CUDA) or the process's resident
high-water mark (CPU; reset before each row where Linux allows). The last line printed is the JSON summary
``{"bench": "gpu", "rows": [{"path", "device", "global_batch", "samples_per_s", "ms_by_phase",
"syncs_per_step", "peak_mem_mb"[, "trainer_over_model_only"]}, ...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import replace

import numpy as np
import torch

from bench.devices import parse_device, synchronizer
from bench.memory import peak_mb, reset_peak
from hetgmp.partitioner import Placement
from hetgmp.streaming import ClickBatch, SyntheticStream
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import PHASES
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.model import Features, ModelConfig
from hetgmp.trainer.sources import synthetic_batch
from hetgmp.trainer.step import SyncCounter, TrainConfig, Trainer

__all__ = ["PATHS", "build_parser", "main", "parse_args"]

PATHS = ("trainer", "model_only")
MODEL = ModelConfig(model="deepfm", embed_dim=64, hidden=(256, 128))


def _model(args: argparse.Namespace) -> ModelConfig:
    return replace(MODEL, autocast=args.autocast, compile=args.compile)


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(prog="hetgmp bench gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device of the rank (default: cuda where there is one)")
    p.add_argument("--batches", default="8192,65536", help="global batch sizes, comma separated")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per row (default 30 on CUDA, 4 on a CPU)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--paths", default=",".join(PATHS), help="paths to run, comma separated")
    p.add_argument("--autocast", choices=["off", "bf16"], default="off",
                   help="the model's forward under bf16 autocast (every path; default float32)")
    p.add_argument("--compile", choices=["off", "on"], default="off",
                   help="the model's training forward and backward through torch.compile "
                        "(every path; compiled during the untimed steps)")
    p.add_argument("--seed", type=int, default=0, help="stream seed")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.batch_sizes = [int(x) for x in args.batches.split(",") if x.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    args.torch_device = parse_device(parser, args.device)
    args.path_list = [x for x in args.paths.split(",") if x]
    if not args.path_list or set(args.path_list) - set(PATHS):
        parser.error(f"--paths takes some of {','.join(PATHS)}")
    if args.steps is None:
        args.steps = 30 if args.torch_device.type == "cuda" else 4
    if args.steps < 1 or args.warmup < 0 or not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--steps and the batch sizes must be positive, --warmup >= 0")
    return args


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak()


def _peak_mb(device: torch.device) -> float | None:
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return peak_mb()


# The steps whose waits are counted (trainer.step.syncs), after the timed ones: the CPU audit
# routes every operator through Python, and on CUDA each wait counted raises a Python warning,
# which would slow the path with more waits; neither may run under the clock.
AUDIT_STEPS = 2


def _trainer(batches: list[ClickBatch], args: argparse.Namespace) -> Trainer:
    """A rank warmed up on the untimed batches."""
    trainer = Trainer(LocalComm(args.torch_device), Placement.hash(1), batches[0].ids.shape[1],
                      batches[0].dense.shape[1], model=_model(args),
                      train=TrainConfig(global_batch=len(batches[0])))
    for batch in batches[:args.warmup]:
        trainer.step(batch)
    trainer.finish_step()
    return trainer


def _audited_waits(trainer: Trainer, audited: list[ClickBatch]) -> int:
    """Waits counted (trainer.step.syncs) over the batches after the timed ones."""
    trainer.store.cpu_shortcuts = False  # count the path CUDA takes
    with SyncCounter(trainer.comm.device) as syncs:
        for batch in audited:
            trainer.step(batch)
    return syncs.count


def _row(path: str, seconds: np.ndarray, wall: float, steps: int, batch: int, waits: float,
         peak: float | None) -> dict[str, object]:
    return {"path": path, "ms_by_phase": {p: round(1000 * s / steps, 3)
                                          for p, s in zip(PHASES, seconds)},
            "samples_per_s": round(steps * batch / wall), "syncs_per_step": round(waits, 2),
            "peak_mem_mb": peak}


def _trainer_row(batches: list[ClickBatch], args: argparse.Namespace) -> dict[str, object]:
    device = args.torch_device
    sync = synchronizer(device)
    trainer = _trainer(batches, args)
    timed, audited = _split(batches, args)
    sync()
    _reset_peak(device)
    seconds = np.zeros(len(PHASES))
    began = time.perf_counter()
    for batch in timed:
        c = trainer.step(batch)
        assert c is not None
        seconds += c.seconds
    trainer.finish_step()
    sync()
    wall = time.perf_counter() - began
    peak = _peak_mb(device)
    waits = _audited_waits(trainer, audited) / len(audited)
    return _row("trainer", seconds, wall, len(timed), len(batches[0]), waits, peak)


def _split(batches: list[ClickBatch], args: argparse.Namespace
           ) -> tuple[list[ClickBatch], list[ClickBatch]]:
    """The timed batches and the counted ones after them."""
    end = len(batches) - AUDIT_STEPS
    return batches[args.warmup:end], batches[end:]


def _model_only_row(batches: list[ClickBatch], args: argparse.Namespace) -> dict[str, object]:
    """Forward, backward and the dense step on each batch's rows, gathered before its clock
    starts (one batch's rows at a time, as the trainer holds them)."""
    device = args.torch_device
    sync = synchronizer(device)
    trainer = Trainer(LocalComm(device), Placement.hash(1), batches[0].ids.shape[1],
                      batches[0].dense.shape[1], model=_model(args),
                      train=TrainConfig(global_batch=len(batches[0])))
    model, loss_fn, params = trainer.train_forward, trainer.loss_fn, trainer.dense.params

    def gather(batch: ClickBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        uniq, inverse = np.unique(batch.ids, return_inverse=True)
        rows = trainer.store.peek(uniq)[torch.from_numpy(inverse.reshape(-1)).to(device)]
        return (rows.view(*batch.ids.shape, MODEL.row_dim), torch.from_numpy(batch.dense).to(device),
                torch.from_numpy(batch.labels).to(device))

    def step(emb: torch.Tensor, dense: torch.Tensor, labels: torch.Tensor) -> None:
        emb = emb.detach().requires_grad_(True)
        with trainer.model_autocast():
            logits = model(Features(trainer.spec.pooled, emb, dense))
        loss = loss_fn(logits.float(), labels) / labels.numel()
        grads = torch.autograd.grad(loss, [emb, *params], allow_unused=True)
        flat = torch.cat(trainer.dense.flat_grads(grads[1:]))
        trainer.optimizer.step(trainer.dense.flat, flat)

    for batch in batches[:args.warmup]:
        step(*gather(batch))
    sync()
    _reset_peak(device)
    timed, audited = _split(batches, args)
    wall, count = 0.0, 0
    for i, batch in enumerate(timed + audited):
        counted, clocked = i >= len(timed), i < len(timed)
        item = gather(batch)
        sync()
        # The model's waits only, not the gather's, counted after the timed steps.
        syncs = SyncCounter(device)
        began = time.perf_counter()
        with syncs if counted else contextlib.nullcontext():
            step(*item)
        count += syncs.count
        sync()  # the bench's own wait: timed, not counted
        if clocked:
            wall += time.perf_counter() - began
    steps = len(timed)
    return {"path": "model_only", "ms_by_phase": {"compute": round(1000 * wall / steps, 3)},
            "samples_per_s": round(steps * len(batches[0]) / wall),
            "syncs_per_step": round(count / len(audited), 2),
            "peak_mem_mb": _peak_mb(device)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    args = parse_args(argv)
    stream = SyntheticStream(SyntheticConfig(seed=args.seed))
    print(f"one rank, DeepFM dim {MODEL.embed_dim}, hidden {MODEL.hidden}, float32 "
          f"(autocast {args.autocast}, compile {args.compile}), on "
          f"{args.torch_device} (torch {torch.__version__}, {torch.get_num_threads()} threads); "
          f"{args.warmup} untimed + {args.steps} timed steps per row")
    rows: list[dict[str, object]] = []
    for size in args.batch_sizes:
        total = args.warmup + args.steps + AUDIT_STEPS
        batches = [synthetic_batch(stream, i * size, size) for i in range(total)]
        by_path: dict[str, dict[str, object]] = {}
        for path in args.path_list:
            row = _model_only_row(batches, args) if path == "model_only" else \
                _trainer_row(batches, args)
            row.update(device=str(args.torch_device), global_batch=size, autocast=args.autocast,
                       compile=args.compile)
            rows.append(row)
            by_path[path] = row
            phases = "  ".join(f"{k} {v:7.2f}" for k, v in row["ms_by_phase"].items())  # type: ignore[attr-defined]
            syncs = row["syncs_per_step"]
            print(f"  batch {size:>6} {path:>10}: {row['samples_per_s']:>10,} samples/s  "
                  f"ms {phases}  syncs/step {'-' if syncs is None else syncs}  "
                  f"peak {row['peak_mem_mb']} MB", flush=True)
        if len(by_path) == len(PATHS):
            # The share of the model's own speed the whole step keeps (1 = the embedding path
            # costs nothing).
            ratio = round(float(by_path["trainer"]["samples_per_s"])  # type: ignore[arg-type]
                          / float(by_path["model_only"]["samples_per_s"]), 3)  # type: ignore[arg-type]
            by_path["trainer"]["trainer_over_model_only"] = ratio
            print(f"  batch {size:>6}: trainer over model_only {ratio:.3f}x")
    print(json.dumps({"bench": "gpu", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
