"""``hetgmp bench batch``: what a larger global batch costs in held-out AUC, under no scaling
rule, the vision rules and CowClip's (``--batch-scaling``), and what it costs in freshness.

Protocol (every run of a shape on the same records and the same model):

* Records ``0 .. T-1`` of a synthetic shape (``segments``, ``user_item``) are trained on,
  ``--passes`` times in order (the same passes at every batch), in global batches of each size
  of ``--batches``; records ``T .. T+H-1`` are held out and scored once training ends (AUC,
  log-loss, from the owners' rows after pending replica updates are pushed). With a fixed
  number of records a batch of ``B`` trains ``passes * T / B`` steps: 131,072 over 4M records
  is 32 steps, 1,024 is 4,096. That is the comparison a stream forces (the records come once; a
  larger batch means fewer, larger steps), and the paper's (a fixed number of epochs at every
  batch). One pass is the default: over two passes of 2M ``segments`` records batch 1,024 fell
  from 0.8083 to 0.8038 (it overfits) while 65,536 rose to 0.8057, a comparison that says more
  about the passes than about a rule.
* Rules (``trainer.step.config``), each from the same values at ``--base-batch`` (1,024):
  ``none`` (settings as given at every batch), ``sqrt`` and ``linear`` (every learning rate
  times ``sqrt(k)`` or ``k``, warmed up), ``cowclip`` (embedding lr unchanged, embedding L2
  times ``k``, dense lr times ``sqrt(k)`` warmed up, CowClip on). The base values: row-wise
  Adagrad at ``--store-lr``, Adam at ``--dense-lr``, L2 ``--store-l2``; the clip's ratio and
  bound ``--clip-ratio``, ``--clip-min``.
* 1 rank in this process (one thread); ``--dist-batches`` and ``--dist-rules`` again at
  ``--workers`` ranks with the graph placement (fitted to the records trained, replicas 5% of
  the rows a rank touches) at staleness ``--staleness``.
* samples/s: samples trained over the wall time of the training loop (batches are made before
  the clock starts). Freshness: a stream of ``--stream-rate`` records/s fills a batch of ``B``
  in ``B / rate`` seconds, so a record waits ``B / (2 rate)`` on average for its batch
  (``fill_wait_mean_s``) and the first record of a batch ``B / rate`` (``fill_wait_max_s``);
  then the step itself (``step_s``, ``B`` over the samples/s measured). Their sum is the
  least append-to-applied latency that batch allows at that rate (``freshness_floor_s``).
* ``--clip-cost``: samples/s of one batch size with the clip and without (the rest equal),
  alternating ``--repeats`` times, on ``--device``.

The last line printed is the JSON summary ``{"bench": "batch", "rows": [...]}``; each row has
``shape``, ``batch``, ``scaling``, ``ranks``, ``auc``, ``logloss``, ``samples_per_s`` and the
settings the rule set.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from hetgmp.partitioner import Placement
from hetgmp.streaming import ClickBatch
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.comm import Comm
from hetgmp.trainer.dist.launcher import launch, resolve_device
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import Bags, ModelConfig
from hetgmp.trainer.run import graph_placement
from hetgmp.trainer.run.evaluation import score_heldout
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.sources.synthetic import shard_bounds, synthetic_batch
from hetgmp.trainer.step import TrainConfig, Trainer, scaled

__all__ = ["build_parser", "main", "parse_args"]

RULES = ("none", "sqrt", "linear", "cowclip")
# Records generated at a time: every batch size of the protocol divides it.
_CHUNK = 131_072


@dataclass(frozen=True)
class _Task:
    """One training run (picklable: it travels to spawned ranks)."""

    syn: SyntheticConfig
    records: int
    heldout: int
    passes: int
    model: ModelConfig
    store: StoreConfig
    train: TrainConfig
    placement: Placement | None = None
    device: str = "cpu"


@functools.lru_cache(maxsize=1)
def _records(syn: SyntheticConfig, records: int) -> tuple[ClickBatch, ...]:
    """Records ``0 .. records-1`` in chunks (kept for the next run of the same shape)."""
    stream = SyntheticStream(syn)
    return tuple(synthetic_batch(stream, lo, min(_CHUNK, records - lo))
                 for lo in range(0, records, _CHUNK))


def _batches(task: _Task, rank: int, world: int) -> list[ClickBatch]:
    """This rank's share of every global batch of one pass."""
    size = task.train.global_batch
    out = []
    for chunk in _records(task.syn, task.records):
        for lo in range(0, len(chunk), size):
            n = min(size, len(chunk) - lo)
            a, b = shard_bounds(n, rank, world)
            out.append(chunk.take(slice(lo + a, lo + b)))
    return out


def _train(comm: Comm, task: _Task) -> dict[str, Any]:
    """Train ``task`` on this rank; the held-out figures and the loop's time (collective)."""
    schema = task.syn.schema
    placement = task.placement or Placement.hash(comm.world)
    trainer = Trainer(comm, placement, len(schema.sparse), len(schema.dense), model=task.model,
                      store=task.store, train=task.train, bags=Bags.of(schema))
    batches = _batches(task, comm.rank, comm.world)
    comm.barrier()
    began = time.perf_counter()
    samples = steps = 0
    for _ in range(task.passes):
        for batch in batches:
            c = trainer.step(batch)
            if c is not None:
                samples += c.global_samples
                steps += 1
    trainer.finish_step()
    comm.barrier()
    seconds = comm.broadcast_object(time.perf_counter() - began)
    trainer.flush()
    auc, logloss = score_heldout(trainer, SyntheticSpec(task.syn, task.records, task.heldout),
                                 comm)
    return {"auc": auc, "logloss": logloss, "samples": samples, "steps": steps,
            "seconds": seconds, "max_staleness": trainer.totals.max_staleness,
            "scaling": trainer.scaling.record(),
            "clipped_share": trainer.store.optimizer.clipped_share}


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(
        prog="hetgmp bench batch",
        description="Held-out AUC and log-loss, samples/s and the freshness a batch allows, "
                    "for global batches from 1,024 to 131,072 under no scaling rule, the "
                    "vision rules (sqrt, linear) and CowClip's.")
    p.add_argument("--shape", default="segments,user_item",
                   help="synthetic shapes, comma separated (each trained at every batch and rule)")
    p.add_argument("--records", type=int, default=4_194_304,
                   help="records trained a pass (T; 32 batches of 131,072)")
    p.add_argument("--passes", type=int, default=1, help="passes over the records (every batch)")
    p.add_argument("--heldout", type=int, default=100_000, help="held-out records (H)")
    p.add_argument("--batches", default="1024,8192,65536,131072", help="global batches")
    p.add_argument("--rules", default=",".join(RULES), help="scaling rules, comma separated")
    p.add_argument("--base-batch", type=int, default=1024,
                   help="the batch the learning rates and L2 below are set for")
    p.add_argument("--store-lr", type=float, default=StoreConfig.lr,
                   help="row-wise Adagrad's learning rate at the base batch")
    p.add_argument("--store-l2", type=float, default=1e-4,
                   help="embedding L2 lambda at the base batch (per occurrence, see "
                        "hetgmp.trainer.embedding.optimizer)")
    p.add_argument("--dense-lr", type=float, default=TrainConfig.dense_lr,
                   help="Adam's learning rate at the base batch")
    p.add_argument("--clip-ratio", type=float, default=StoreConfig.clip_ratio, help="CowClip's r")
    p.add_argument("--clip-min", type=float, default=StoreConfig.clip_min, help="CowClip's zeta")
    p.add_argument("--store-init-scale", type=float, default=StoreConfig.init_scale,
                   help="initial rows uniform in [-scale, scale) (CowClip's paper starts rows "
                        "near zero, std 1e-4: the clip binds only on small rows)")
    p.add_argument("--scaling-warmup", type=int, default=TrainConfig.scaling_warmup,
                   help="records a rule warms its scaled learning rates up over")
    p.add_argument("--users", type=int, default=SyntheticConfig.users,
                   help="user_item: users (more: a longer tail of rare ids)")
    p.add_argument("--items", type=int, default=SyntheticConfig.items,
                   help="user_item: items (more: a longer tail of rare ids)")
    p.add_argument("--model", default="deepfm", choices=["widedeep", "deepfm", "dcn", "dcnv2"])
    p.add_argument("--embed-dim", type=int, default=16, help="embedding dimension")
    p.add_argument("--hidden", default="128,64", help="hidden layer sizes")
    p.add_argument("--workers", type=int, default=2, help="ranks of the distributed runs")
    p.add_argument("--staleness", type=int, default=10, help="bound s of the distributed runs")
    p.add_argument("--dist-batches", default="1024,65536",
                   help="batches also trained at --workers ranks (empty: none)")
    p.add_argument("--dist-rules", default="none,cowclip", help="rules of the distributed runs")
    p.add_argument("--stream-rate", type=float, default=20_000.0,
                   help="records/s of the stream the freshness figures assume")
    p.add_argument("--clip-cost", type=int, default=0,
                   help="also time this batch with the clip and without (0: skip)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of --clip-cost")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the runs train (one thread a rank on cpu)")
    p.add_argument("--seed", type=int, default=0, help="stream and model seed")
    p.add_argument("--quick", action="store_true",
                   help="CI-sized run: T = 262,144, H = 20k, batches 1,024 and 65,536, one "
                        "shape, no distributed runs")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.heldout, args.batches = 262_144, 20_000, "1024,65536"
        args.shape, args.dist_batches = args.shape.split(",")[0], ""
    split = lambda text: [x.strip() for x in str(text).split(",") if x.strip()]  # noqa: E731
    args.shapes, args.rule_list = split(args.shape), split(args.rules)
    args.dist_rule_list = split(args.dist_rules)
    try:
        args.batch_list = [int(x) for x in split(args.batches)]
        args.dist_batch_list = [int(x) for x in split(args.dist_batches)]
    except ValueError:
        p.error("--batches and --dist-batches: integers, comma separated")
    if any(r not in RULES for r in args.rule_list + args.dist_rule_list):
        p.error(f"--rules, --dist-rules: among {', '.join(RULES)}")
    if any(s not in ("segments", "user_item", "multi_hot", "user_history") for s in args.shapes):
        p.error("--shape: synthetic shapes")
    if args.records < 1 or args.passes < 1 or args.heldout < 1 or args.stream_rate <= 0:
        p.error("--records, --passes, --heldout and --stream-rate must be positive")
    try:
        resolve_device(args.device, max(1, args.workers if args.dist_batch_list else 1))
    except ValueError as exc:
        p.error(str(exc))
    return args


def _settings(args: argparse.Namespace, shape: str
              ) -> tuple[SyntheticConfig, ModelConfig, StoreConfig, TrainConfig]:
    syn = SyntheticConfig(seed=args.seed, shape=shape,  # type: ignore[arg-type]
                          users=args.users, items=args.items)
    model = ModelConfig(model=args.model, embed_dim=args.embed_dim, seed=args.seed,
                        hidden=tuple(int(x) for x in args.hidden.split(",") if x.strip()))
    store = StoreConfig(lr=args.store_lr, l2=args.store_l2, clip_ratio=args.clip_ratio,
                        clip_min=args.clip_min, init_scale=args.store_init_scale, seed=args.seed)
    train = TrainConfig(dense_lr=args.dense_lr, base_batch=args.base_batch,
                        scaling_warmup=args.scaling_warmup, log_every=0, placement="hash",
                        route="off", replica_fraction=0.05, replica_basis="touched")
    return syn, model, store, train


def _row(args: argparse.Namespace, shape: str, batch: int, rule: str, ranks: int,
         out: dict[str, Any]) -> dict[str, Any]:
    speed = out["samples"] / max(out["seconds"], 1e-9)
    step_s = batch / max(speed, 1e-9)
    fill = batch / args.stream_rate
    rec = out["scaling"]
    return {"shape": shape, "batch": batch, "scaling": rule, "ranks": ranks,
            "staleness": args.staleness if ranks > 1 else 0,
            "auc": round(float(out["auc"]), 5), "logloss": round(float(out["logloss"]), 5),
            "samples_per_s": round(speed, 1), "steps": out["steps"], "passes": args.passes,
            "records": args.records, "seconds": round(out["seconds"], 2),
            "max_staleness": out["max_staleness"],
            "store_lr": rec["store_lr"], "store_l2": rec["store_l2"], "dense_lr": rec["dense_lr"],
            "warmup_steps": rec["warmup_steps"], "clip": rec["clip"],
            "clipped_share": round(out["clipped_share"], 4) if rec["clip"] != "none" else None,
            "stream_rate": args.stream_rate, "fill_wait_mean_s": round(fill / 2, 3),
            "fill_wait_max_s": round(fill, 3), "step_s": round(step_s, 3),
            "freshness_floor_s": round(fill + step_s, 3)}


def _print(row: dict[str, Any]) -> None:
    print(f"{row['shape']:>9} {row['ranks']}r batch {row['batch']:>7,} {row['scaling']:>7}: "
          f"AUC {row['auc']:.4f}  log-loss {row['logloss']:.4f}  "
          f"{row['samples_per_s']:>9,.0f} samples/s  {row['steps']:>5} steps  "
          f"lr {row['store_lr']:g}/{row['dense_lr']:g} L2 {row['store_l2']:g} "
          f"clip {row['clip']}{_share(row['clipped_share'])}  "
          f"fill {row['fill_wait_mean_s']:.2f}/{row['fill_wait_max_s']:.2f} s "
          f"+ step {row['step_s']:.2f} s", flush=True)


def _share(share: float | None) -> str:
    return "" if share is None else f" ({100 * share:.1f}% clipped)"


def _run(args: argparse.Namespace, task: _Task, workers: int) -> dict[str, Any]:
    config = LaunchConfig(workers=workers, device=args.device, timeout_s=1200, threads=1)
    return launch(_train, task, config)[0]


def _shape(args: argparse.Namespace, shape: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Every batch and rule on one shape: its rows and the AUC gaps to the base batch."""
    syn, model, store, train = _settings(args, shape)
    base = _Task(syn, args.records, args.heldout, args.passes, model, store, train,
                 device=args.device)
    print(f"== batch bench: {shape}, {args.model} dim {args.embed_dim}, {args.records:,} records "
          f"x {args.passes} pass(es), held-out {args.heldout:,}, base batch {args.base_batch:,}",
          flush=True)
    rows = []
    for batch in args.batch_list:
        for rule in args.rule_list:
            t = replace(train, global_batch=batch, batch_scaling=rule)  # type: ignore[arg-type]
            print(f"   {scaled(t, store).describe()}", flush=True)
            rows.append(_row(args, shape, batch, rule, 1, _run(args, replace(base, train=t), 1)))
            _print(rows[-1])
    if args.dist_batch_list and args.workers > 1:
        t0 = time.perf_counter()
        stream = SyntheticStream(syn)
        fitted = stream.sample_csr(stream.take(0, args.records))
        graph = graph_placement(fitted, args.workers, replace(train, global_batch=args.base_batch),
                                args.seed)
        print(f"graph placement of {args.workers} ranks: {graph.ids.size:,} ids, replicas "
              f"{graph.replica_counts().tolist()}, {time.perf_counter() - t0:.1f} s", flush=True)
        for batch in args.dist_batch_list:
            for rule in args.dist_rule_list:
                t = replace(train, global_batch=batch, batch_scaling=rule,  # type: ignore[arg-type]
                            staleness=args.staleness, placement="graph", route="on")
                out = _run(args, replace(base, train=t, placement=graph), args.workers)
                rows.append(_row(args, shape, batch, rule, args.workers, out))
                _print(rows[-1])
    return rows, _gaps(rows, args.base_batch)


def _gaps(rows: list[dict[str, Any]], base: int) -> dict[str, float]:
    """Each row's AUC minus the base batch's under no rule at the same ranks (the target:
    CowClip's within 0.001 of it)."""
    out = {}
    for r in rows:
        ref = [x for x in rows if x["batch"] == base and x["scaling"] == "none"
               and x["ranks"] == r["ranks"]]
        if ref and r["batch"] != base:
            key = f"auc_gap_{r['shape']}_{r['ranks']}r_{r['batch']}_{r['scaling']}"
            out[key] = round(r["auc"] - ref[0]["auc"], 5)
    return out


def _clip_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Samples/s of ``--clip-cost`` with the clip and without, alternating."""
    syn, model, store, train = _settings(args, args.shapes[0])
    t = replace(train, global_batch=args.clip_cost)
    runs: dict[str, list[float]] = {"cowclip": [], "none": []}
    for _ in range(args.repeats):
        for clip in ("cowclip", "none"):
            task = _Task(syn, args.records, args.heldout, 1, model,
                         replace(store, clip=clip), t, device=args.device)  # type: ignore[arg-type]
            out = _run(args, task, 1)
            runs[clip].append(out["samples"] / max(out["seconds"], 1e-9))
    best = {k: max(v) for k, v in runs.items()}
    ratio = best["cowclip"] / max(best["none"], 1e-9)
    print(f"clip cost at batch {args.clip_cost:,} on {args.device}: {best['cowclip']:,.0f} "
          f"against {best['none']:,.0f} samples/s without ({ratio:.3f}x, best of "
          f"{args.repeats})", flush=True)
    return {"batch": args.clip_cost, "device": args.device,
            "samples_per_s_clip": [round(x, 1) for x in runs["cowclip"]],
            "samples_per_s_no_clip": [round(x, 1) for x in runs["none"]],
            "speed_clip_over_none": round(ratio, 3)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a line per run, the AUC gaps and the JSON summary."""
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    gaps: dict[str, float] = {}
    for shape in args.shapes:
        shape_rows, shape_gaps = _shape(args, shape)
        rows += shape_rows
        gaps.update(shape_gaps)
    for k, v in gaps.items():
        print(f"{k}: {v:+.4f}", flush=True)
    summary: dict[str, Any] = {"bench": "batch", "device": args.device, "rows": rows,
                               "auc_gaps": gaps}
    if args.clip_cost:
        summary["clip_cost"] = _clip_cost(args)
    print(json.dumps(summary, allow_nan=False), flush=True)
    return 0 if all(math.isfinite(r["auc"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
