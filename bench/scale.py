"""How the traffic grows with the ranks: ``hetgmp bench scale``.

Ranks are threads of this process (``ThreadComm``), 2 to 32 of them, training the synthetic
stream with a small model (DeepFM, ``--dim`` 64, one hidden layer of 16): time is not the
measure, what moves is. Every rank
reads ``--batch-per-rank`` samples a step (the global batch grows with the ranks), for
``--steps`` steps. ``hash`` trains on the hash placement; ``graph`` starts on hash and places
online (a full partition after ``--warmup-steps``, an incremental pass every
``--interval-steps``, the window that many steps long), with routing on.

Per configuration, from every rank's communicator (the step's collectives and the online
loop's between steps: window feed, placement broadcast, migration, control vector):

* ``bytes_by_kind``: bytes sent by all ranks, by kind; ``bytes_per_sample_by_kind`` the same
  over the samples trained; ``messages_by_kind``: collectives called, summed over ranks;
* ``steady_embedding_bytes_per_sample`` and ``steady_remote_rows_per_sample``: the same over
  the steps trained on a placement of the run's own (graph: a computed placement in force and
  no migration running), without the steps on hash before the first pass;
* ``rank0_over_mean``: rank 0's bytes sent and received over the mean rank's (rank 0 holds the
  window and starts the placement broadcasts);
* ``rank0_cpu_over_mean``: rank 0's thread CPU seconds over the mean rank's (its partitioner
  runs in a process of its own, reported apart as ``repartition_seconds``);
* ``repartition_seconds``: the mean time of a placement's computation, and
  ``repartition_lag_steps``, the most steps between a repartition's start and its placement.

Targets, at the largest rank count (issue 46): graph's embedding bytes a sample <= 0.5x hash's
(over the run, and on its own placement);
control vector plus placement broadcast <= 5% of all bytes sent; rank 0 sends and receives
<= 2x the mean rank; a repartition finishes within its interval. The last line printed is the
JSON summary ``{"bench": "scale", "rows": [...], "targets": {...}}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np

from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import EMBEDDING_KINDS, KINDS, ThreadComm, run_threads
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, RankResult, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.step import TrainConfig

__all__ = ["build_parser", "job_of", "main", "measure"]


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(prog="hetgmp bench scale", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ranks", default="2,4,8,16,32", help="rank counts, comma separated")
    p.add_argument("--placements", default="hash,graph", help="hash, graph or both")
    p.add_argument("--batch-per-rank", type=int, default=512,
                   help="samples a rank reads a step (the global batch is this times the ranks)")
    p.add_argument("--steps", type=int, default=40, help="steps trained")
    p.add_argument("--warmup-steps", type=int, default=6,
                   help="graph: steps on hash before the first (full) partition")
    p.add_argument("--interval-steps", type=int, default=10,
                   help="graph: steps between repartitions, and the window's length in steps")
    p.add_argument("--route-rounds", type=int, default=0,
                   help="graph: batch-aware routing rounds (the trainer's --route-rounds; 0, "
                        "the default here: route alone, as the curve was measured; -1: the "
                        "trainer's own choice, whose probes cost O(ranks^2) a step)")
    p.add_argument("--dim", type=int, default=64,
                   help="embedding row width (rows and gradients grow with it, routed samples, "
                        "ids and placements do not)")
    p.add_argument("--drift-steps", type=int, default=20,
                   help="the stream's hot sets drift every this many steps of the global batch "
                        "(the same per step at every rank count; 0: the stream's own, every "
                        "100,000 records, which at 32 ranks is every 6 steps)")
    p.add_argument("--window-sample", type=float, default=1.0,
                   help="graph: fraction of the samples sent to rank 0's window "
                        "(--window-sample of hetgmp train)")
    p.add_argument("--seed", type=int, default=0, help="stream and model seed")
    p.add_argument("--quick", action="store_true", help="2, 4 and 8 ranks, 24 steps")
    p.add_argument("--project-from", default="", metavar="FILE",
                   help="print only the GPU projection (bench/scale_model.py) of a saved run: "
                        "a file whose last line is this benchmark's JSON summary")
    p.add_argument("--project-gpus", default="8,16,32,64,128",
                   help="GPU counts the projection covers (8 a node)")
    return p


def print_projection(rows: list[dict[str, Any]], steps: int, gpus: list[int], dim: int
                     ) -> list[dict]:
    """The cost model's projection of these counts (taken at row width ``dim``) to GPUs (see
    bench/scale_model.py)."""
    from bench.scale_model import Cluster, project, render

    graph = [r for r in rows if r["placement"] == "graph" and r["repartition_seconds"]]
    pass_s = max(graph, key=lambda r: r["ranks"])["repartition_seconds"] if graph else None
    c = Cluster(bench_dim=dim)
    out = [project(rows, n, p, steps, c) for n in gpus
           for p in dict.fromkeys(r["placement"] for r in rows)]
    print(f"projection ({c.dim}-wide rows, {c.dense_params:,} dense parameters, "
          f"{c.batch_per_gpu:,} samples a GPU a step, {c.gpus_per_node} GPUs a node, NVLink "
          f"{c.nvlink_gb_s:.0f} GB/s and InfiniBand {c.ib_gb_s:.0f} GB/s a GPU each way, "
          f"{c.round_us:.0f} us a collective round, compute {c.compute_samples_s:,.0f} "
          f"samples/s a GPU; a pass {pass_s} s as measured here):", flush=True)
    print(render(out, pass_s), flush=True)
    return out


def _rank(comm: ThreadComm, job: Job) -> tuple[RankResult, float]:
    began = time.thread_time()
    result = run_rank(comm, job)
    return result, time.thread_time() - began


def job_of(ranks: int, placement: str, args: argparse.Namespace) -> Job:
    """The job of one configuration."""
    batch = args.batch_per_rank * ranks
    syn = SyntheticConfig(seed=args.seed)
    if args.drift_steps:
        syn = dataclasses.replace(syn, drift_every=batch * args.drift_steps)
    graph = placement == "graph"
    return Job(SyntheticSpec(syn, 0, batch * args.steps),
               ModelConfig(model="deepfm", embed_dim=args.dim, hidden=(16,), seed=args.seed),
               StoreConfig(seed=args.seed),
               TrainConfig(global_batch=batch, placement="graph" if graph else "hash",
                           route="on" if graph else "off", warmup=batch * args.warmup_steps,
                           route_rounds=args.route_rounds, log_every=0),
               placement=None if graph else Placement.hash(ranks),
               online=OnlineConfig(repartition_interval=str(batch * args.interval_steps),
                                   window=batch * args.interval_steps,
                                   window_sample=args.window_sample))


def measure(ranks: int, placement: str, args: argparse.Namespace, job: Job | None = None
            ) -> dict[str, Any]:
    """One configuration's row (see the module docstring); ``job`` replaces the bench's own."""
    out = run_threads(_rank, job or job_of(ranks, placement, args), ranks, timeout_s=900)
    results = [r for r, _ in out]
    cpu = np.array([c for _, c in out])
    sent = np.array([[r.online["traffic_sent"][k] for k in KINDS] for r in results], np.int64)
    received = np.array([[r.online["traffic_received"][k] for k in KINDS] for r in results],
                        np.int64)
    calls = np.array([[r.online["traffic_calls"][k] for k in KINDS] for r in results], np.int64)
    samples = int(results[0].job_totals.samples)
    moved = sent.sum(axis=1) + received.sum(axis=1)
    by_kind = dict(zip(KINDS, sent.sum(axis=0).tolist()))
    steady = _steady(results, placement)
    events = results[0].online["events"]
    placed = [e for e in events if e["event"] == "placement"]
    started = [e for e in events if e["event"] == "repartition"]
    lags = [p["step"] - s["step"] for s, p in zip(started, placed)]
    return {
        "ranks": ranks, "placement": placement, "samples": samples,
        "bytes_by_kind": {k: v for k, v in by_kind.items() if v},
        "bytes_received_by_kind": {k: int(v) for k, v in zip(KINDS, received.sum(axis=0)) if v},
        "bytes_per_sample_by_kind": {k: round(v / max(samples, 1), 1)
                                     for k, v in by_kind.items() if v},
        "embedding_bytes_per_sample": round(sum(by_kind[k] for k in EMBEDDING_KINDS)
                                            / max(samples, 1), 1),
        **steady,
        "messages_by_kind": {k: int(v) for k, v in zip(KINDS, calls.sum(axis=0)) if v},
        "control_and_placement_share": round((by_kind["control"] + by_kind["placement"])
                                             / max(sum(by_kind.values()), 1), 4),
        "rank0_over_mean": round(float(moved[0] / max(moved.mean(), 1)), 3),
        "rank0_cpu_over_mean": round(float(cpu[0] / max(cpu.mean(), 1e-9)), 3),
        "placements": len(placed),
        "repartition_seconds": round(float(np.mean([p["seconds"] for p in placed])), 3)
        if placed else None,
        "repartition_lag_steps": max(lags) if lags else None,
    }


def _steady(results: list[RankResult], placement: str) -> dict[str, Any]:
    """Embedding bytes a sample over the steps trained on a placement of the run's own
    (graph: a computed placement in force, no migration running; hash: every step), and how
    many such steps there were: what the placement itself costs, apart from the steps before
    its first pass and during its migrations."""
    fields = results[0].online["history_fields"]
    at = {f: fields.index(f) for f in ("samples", "migrating", "version", "embedding_bytes",
                                         "rows_not_held")}
    sent = samples = remote = 0
    steps = set()
    for r in results:
        for h in r.online["history"]:
            if placement == "hash" or (h[at["version"]] >= 1 and not h[at["migrating"]]):
                sent += h[at["embedding_bytes"]]
                samples += h[at["samples"]]
                remote += h[at["rows_not_held"]]
                steps.add(h[0])
    return {"steady_steps": len(steps),
            "steady_embedding_bytes_per_sample": round(sent / samples, 1) if samples else None,
            "steady_remote_rows_per_sample": round(remote / samples, 3) if samples else None}


def _targets(rows: list[dict[str, Any]], interval_steps: int) -> dict[str, Any]:
    top = max(r["ranks"] for r in rows)
    at = {r["placement"]: r for r in rows if r["ranks"] == top}
    out: dict[str, Any] = {"ranks": top}
    if "hash" in at and "graph" in at:
        out["graph_over_hash_embedding_bytes"] = round(
            at["graph"]["embedding_bytes_per_sample"]
            / max(at["hash"]["embedding_bytes_per_sample"], 1e-9), 3)
        if at["graph"]["steady_embedding_bytes_per_sample"] is not None:
            for what in ("embedding_bytes", "remote_rows"):
                out[f"graph_over_hash_{what}_steady"] = round(
                    at["graph"][f"steady_{what}_per_sample"]
                    / max(at["hash"][f"steady_{what}_per_sample"], 1e-9), 3)
    out["control_and_placement_share"] = max(r["control_and_placement_share"]
                                             for r in at.values())
    out["rank0_over_mean"] = max(r["rank0_over_mean"] for r in at.values())
    if "graph" in at and at["graph"]["repartition_lag_steps"] is not None:
        out["repartition_lag_steps"] = at["graph"]["repartition_lag_steps"]
        out["repartition_within_interval"] = at["graph"]["repartition_lag_steps"] <= interval_steps
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the last printed line is the JSON summary. Returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        gpus = [int(x) for x in args.project_gpus.split(",") if x.strip()]
    except ValueError:
        parser.error("--project-gpus takes comma-separated integers")
    if args.project_from:
        with open(args.project_from, encoding="utf-8") as f:
            saved = json.loads(f.read().strip().splitlines()[-1])
        print_projection(saved["rows"], saved.get("steps", args.steps), gpus,
                         saved.get("dim", args.dim))
        return 0
    if args.quick:
        args.ranks, args.steps = "2,4,8", 24
    try:
        counts = [int(x) for x in str(args.ranks).split(",") if x.strip()]
    except ValueError:
        parser.error("--ranks takes comma-separated integers")
    placements = [x.strip() for x in str(args.placements).split(",") if x.strip()]
    if not counts or min(counts) < 2 or set(placements) - {"hash", "graph"} or not placements:
        parser.error("--ranks: counts of 2 or more; --placements: hash, graph or both")
    if args.steps <= args.warmup_steps + args.interval_steps:
        parser.error("--steps must exceed --warmup-steps plus --interval-steps (a placement "
                     "must come before the run ends)")
    print(f"== scale bench: ranks {counts}, {args.batch_per_rank} samples a rank a step, "
          f"{args.steps} steps, threads of one process (counts, not times)", flush=True)
    rows = []
    for ranks in counts:
        for placement in placements:
            began = time.perf_counter()
            row = measure(ranks, placement, args)
            rows.append(row)
            kinds = "  ".join(f"{k} {v:,.0f}" for k, v in row["bytes_per_sample_by_kind"].items())
            print(f"{ranks:>3} ranks {placement:>5}: {row['embedding_bytes_per_sample']:>7,.0f} "
                  f"embedding B/sample; control+placement {100 * row['control_and_placement_share']:.2f}%"
                  f" of bytes; rank 0 {row['rank0_over_mean']:.2f}x the mean rank's bytes, "
                  f"{row['rank0_cpu_over_mean']:.2f}x its CPU; placements {row['placements']} "
                  f"(lag {row['repartition_lag_steps']} steps); on its own placement "
                  f"{row['steady_embedding_bytes_per_sample']} embedding B/sample over "
                  f"{row['steady_steps']} steps; {time.perf_counter() - began:.0f} s", flush=True)
            print(f"{'':>16}B/sample by kind: {kinds}", flush=True)
    targets = _targets(rows, args.interval_steps)
    for k, v in targets.items():
        print(f"{k}: {v}", flush=True)
    projected = print_projection(rows, args.steps, gpus, args.dim)
    print(json.dumps({"bench": "scale", "steps": args.steps, "dim": args.dim, "rows": rows,
                      "targets": targets,
                      "projection": projected}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
