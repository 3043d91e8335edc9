"""Models beyond the pooled menu (issue 56): DIN against DeepFM on a user's history, and a
two-task MMoE on click and conversion, each placed and trained as ``bench train`` trains.

Protocol (one run, every configuration on the same records):

* Stream: the synthetic ``user_history`` shape with the repeat signal (``--repeat-prob``: that
  often the item scored is one of the user's last ``repeat_window`` clicks, with a ground-truth
  logit bonus of ``--repeat-bonus``): a signal that only a model comparing the item with the
  history can read. Without it (``--repeat-prob 0``) attention has nothing to find: DIN and the
  pooled DeepFM tie (0.7430 against 0.7427 at one rank, 1.2M records; docs/experiments.md).
* ``din``: the history kept as a sequence (``pooling = "none"``), attended by the candidate
  item's row; ``deepfm``: the same history mean-pooled. Records ``W .. W+T-1`` are trained on,
  the next ``H`` held out; the same model settings (``--embed-dim``, ``--hidden``) for both.
* Each model at two placements on ``--workers`` ranks: ``hash`` at ``s = 0`` (rows by id hash,
  samples where they are read) and ``graph_s10`` (the graph placement fitted to the records
  trained, as ``bench train``'s protocol, 5% replicas of the rows a rank uses, samples routed
  to their rows' rank, ``s = 10``).
* ``mmoe``: the stream with a conversion label (``--synthetic-conversion``: converted only
  where clicked), history pooled, hash ``s = 0`` and graph ``s = 10``: each task's held-out AUC.
* samples/s: as ``bench train`` (the slowest rank's training loop, sources in memory first).
  bytes/sample: the embedding path's bytes sent between ranks over samples trained.
* ``--table-dims TABLE=DIM,...`` (tables of their own widths): each model also runs with those
  widths (``<model>_dims``) and with every table at the widest of them (``<model>_widest``, what
  padding rows to one width would hold); ``row_mb`` is the rows the stores hold at the end, all
  ranks: values, the optimizer's state and the 16 bytes of id and version a stored block.

The last line printed is the JSON summary ``{"bench": "models", "rows": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

from bench.train import _print, _row
from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import Bags, ModelConfig
from hetgmp.trainer.run import Job, graph_placement, run_jobs, synthetic_samples
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.step import TrainConfig

__all__ = ["build_parser", "main", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags."""
    p = argparse.ArgumentParser(
        prog="hetgmp bench models",
        description="DIN against DeepFM with the history pooled, and a two-task MMoE: held-out "
                    "AUC, samples/s and bytes/sample under hash and graph placement.")
    p.add_argument("--window", type=int, default=100_000, help="records before the trained "
                   "ones (W)")
    p.add_argument("--records", type=int, default=1_200_000, help="training records (T)")
    p.add_argument("--heldout", type=int, default=100_000, help="held-out records (H)")
    p.add_argument("--global-batch", type=int, default=2048, help="samples per step")
    p.add_argument("--workers", type=int, default=2, help="ranks of every run")
    p.add_argument("--embed-dim", type=int, default=16, help="embedding dimension")
    p.add_argument("--hidden", default="128,64", help="hidden layer sizes")
    p.add_argument("--history-len", type=int, default=20, help="items in a record's history")
    p.add_argument("--repeat-prob", type=float, default=0.3,
                   help="how often the item is one of the user's last clicks (the signal "
                        "attention can read; 0: none)")
    p.add_argument("--repeat-bonus", type=float, default=3.0,
                   help="ground-truth logit bonus of a repeat")
    p.add_argument("--replica-fraction", type=float, default=0.05,
                   help="graph runs: replica budget, a fraction of the rows a rank uses")
    p.add_argument("--models", default="din,deepfm,mmoe",
                   help="which of din, deepfm (the pair compared) and mmoe to run")
    p.add_argument("--table-dims", default="",
                   help="TABLE=DIM,...: run each model also with these tables' widths, and with "
                        "every table at the widest (the items' table is C2)")
    p.add_argument("--seed", type=int, default=0, help="stream, model and partitioner seed")
    p.add_argument("--quick", action="store_true",
                   help="CI-sized run: W=20k, T=60k, H=20k, dim 8, hidden 32,16")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.quick:
        args.window, args.records, args.heldout = 20_000, 60_000, 20_000
        args.embed_dim, args.hidden = 8, "32,16"
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.model_list or set(args.model_list) - {"din", "deepfm", "mmoe"}:
        p.error("--models: one or more of din, deepfm, mmoe")
    if min(args.window, args.records, args.heldout, args.global_batch, args.workers) < 1:
        p.error("--window, --records, --heldout, --global-batch and --workers must be >= 1")
    if not 0.0 <= args.repeat_prob <= 1.0:
        p.error("--repeat-prob must lie in [0, 1]")
    try:
        args.dims = ModelConfig(table_dims=args.table_dims).dims_of_tables()
    except ValueError as exc:
        p.error(str(exc))
    return args


def _stream(args: argparse.Namespace, **kw: Any) -> SyntheticConfig:
    return SyntheticConfig(seed=args.seed, shape="user_history", history_len=args.history_len,
                           repeat_prob=args.repeat_prob, repeat_bonus=args.repeat_bonus, **kw)


def _runs(args: argparse.Namespace, model: str, syn: SyntheticConfig, train: TrainConfig,
          name: str = "", embed_dim: int = 0, table_dims: str = "") -> list[tuple[str, Job]]:
    """``model``'s hash s = 0 and graph s = 10 jobs on ``syn`` (``name``: the model's name
    in the rows; ``embed_dim``, ``table_dims``: the rows' widths, default ``--embed-dim``)."""
    w, t, h = args.window, args.records, args.heldout
    config = ModelConfig(model=model, embed_dim=embed_dim or args.embed_dim, seed=args.seed,
                         hidden=tuple(int(x) for x in args.hidden.split(",") if x.strip()),
                         table_dims=table_dims)
    base = dict(source=SyntheticSpec(syn, w, t), model=config, store=StoreConfig(seed=args.seed),
                heldout=SyntheticSpec(syn, w + t, h), seed=args.seed)
    # The graph of what the ranks read: a column of ids a block of each row.
    read = synthetic_samples(syn, w, t, Bags.of(syn.schema).widths(config, syn.n_sparse))
    graph = graph_placement(read, args.workers, train, args.seed)
    name = name or model
    return [(f"{name}_hash_s0", Job(**base, placement=Placement.hash(args.workers),
                                    train=replace(train, staleness=0, placement="hash",
                                                  route="off"))),
            (f"{name}_graph_s10", Job(**base, placement=graph,
                                      train=replace(train, staleness=10, route="on")))]


def syn_fields(job: Job) -> int:
    """Sparse fields of a job's synthetic records."""
    return job.source.config.n_sparse  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a line per run, the ratios and the JSON summary."""
    args = parse_args(argv)
    train = TrainConfig(global_batch=args.global_batch, replica_fraction=args.replica_fraction,
                        replica_basis="touched", log_every=0)
    print(f"== models bench: user_history (history {args.history_len}, repeat "
          f"{args.repeat_prob} x bonus {args.repeat_bonus}), window {args.window:,}, train "
          f"{args.records:,}, held-out {args.heldout:,}, dim {args.embed_dim}, hidden "
          f"{args.hidden}, batch {args.global_batch}, {args.workers} ranks", flush=True)
    t0 = time.perf_counter()
    jobs: list[tuple[str, Job]] = []
    for model in args.model_list:
        if model == "din":  # the history as a sequence of rows
            syn = _stream(args, history_pooling="none")
        elif model == "deepfm":
            syn = _stream(args)
        else:
            syn = _stream(args, conversion=True)
        jobs += _runs(args, model, syn, train)
        if args.dims:
            jobs += _runs(args, model, syn, train, f"{model}_dims", table_dims=args.table_dims)
            jobs += _runs(args, model, syn, train, f"{model}_widest",
                          embed_dim=max(args.dims.values()))
    print(f"graph placements fitted in {time.perf_counter() - t0:.1f}s", flush=True)
    results = launch(run_jobs, [j for _, j in jobs],
                     LaunchConfig(workers=args.workers, device="cpu", timeout_s=900))[0]
    rows = []
    for (name, job), result in zip(jobs, results):
        fields = syn_fields(job)
        widths = Bags.of(job.source.config.schema).widths(  # type: ignore[union-attr]
            job.model, fields)
        # Ids a record reads: a user, an item, its history, the other fields; a block each.
        values = [1, 1, args.history_len] + [1] * (fields - 3)
        ids = sum(v * k for v, k in zip(values, widths.blocks))
        row = _row(name, result, "user_history", float(ids))
        row["model"] = job.model.model
        held = float(result.store.get("memory_rows", 0))
        row["rows_held"] = int(held)
        row["row_mb"] = round(held * ((widths.row_dim + job.store.state_width) * 4 + 16) / 1e6,
                              2)
        if result.tasks:
            row["tasks"] = {k: {m: round(float(v), 5) for m, v in t.items()}
                            for k, t in result.tasks.items()}
        rows.append(row)
        _print(row)
        if result.tasks:
            print(f"{'':>11}  held-out AUC by task: " + ", ".join(
                f"{k} {t['heldout_auc']:.4f}" for k, t in row["tasks"].items()), flush=True)
    by = {r["config"]: r for r in rows}
    ratios: dict[str, float] = {}
    for placement in ("hash_s0", "graph_s10"):
        din, fm = by.get(f"din_{placement}"), by.get(f"deepfm_{placement}")
        if din and fm:
            ratios[f"auc_din_minus_deepfm_{placement}"] = round(din["auc"] - fm["auc"], 5)
            ratios[f"speed_din_over_deepfm_{placement}"] = round(
                din["samples_per_s"] / max(fm["samples_per_s"], 1e-9), 3)
    for model in args.model_list:
        g, hsh = by.get(f"{model}_graph_s10"), by.get(f"{model}_hash_s0")
        if g and hsh:
            ratios[f"bytes_graph_over_hash_{model}"] = round(
                g["bytes_per_sample"] / max(hsh["bytes_per_sample"], 1e-9), 3)
    for model in args.model_list if args.dims else ():
        for placement in ("hash_s0", "graph_s10"):
            one, dims, widest = (by.get(f"{model}{kind}_{placement}")
                                 for kind in ("", "_dims", "_widest"))
            if one and dims and widest:
                ratios[f"auc_dims_minus_one_{model}_{placement}"] = round(
                    dims["auc"] - one["auc"], 5)
                ratios[f"auc_dims_minus_widest_{model}_{placement}"] = round(
                    dims["auc"] - widest["auc"], 5)
                ratios[f"row_mb_dims_over_widest_{model}_{placement}"] = round(
                    dims["row_mb"] / max(widest["row_mb"], 1e-9), 3)
                ratios[f"speed_dims_over_one_{model}_{placement}"] = round(
                    dims["samples_per_s"] / max(one["samples_per_s"], 1e-9), 3)
                ratios[f"speed_dims_over_widest_{model}_{placement}"] = round(
                    dims["samples_per_s"] / max(widest["samples_per_s"], 1e-9), 3)
        g, hsh = by.get(f"{model}_dims_graph_s10"), by.get(f"{model}_dims_hash_s0")
        if g and hsh:
            ratios[f"bytes_graph_over_hash_{model}_dims"] = round(
                g["bytes_per_sample"] / max(hsh["bytes_per_sample"], 1e-9), 3)
    for k, v in ratios.items():
        print(f"{k}: {v}", flush=True)
    print(json.dumps({"bench": "models", "rows": rows, "ratios": ratios}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
