"""How the traffic grows with the ranks: ``hetgmp bench scale``.

Ranks are threads of this process (``ThreadComm``), 2 to 32 of them, training the synthetic
stream with a small model (DeepFM dim 8): time is not the measure, what moves is. Every rank
reads ``--batch-per-rank`` samples a step (the global batch grows with the ranks), for
``--steps`` steps. ``hash`` trains on the hash placement; ``graph`` starts on hash and places
online (a full partition after ``--warmup-steps``, an incremental pass every
``--interval-steps``, the window that many steps long), with routing on.

Per configuration, from every rank's communicator (the step's collectives and the online
loop's between steps: window feed, placement broadcast, migration, control vector):

* ``bytes_by_kind``: bytes sent by all ranks, by kind; ``bytes_per_sample_by_kind`` the same
  over the samples trained; ``messages_by_kind``: collectives called, summed over ranks;
* ``rank0_over_mean``: rank 0's bytes sent and received over the mean rank's (rank 0 holds the
  window and broadcasts placements);
* ``rank0_cpu_over_mean``: rank 0's thread CPU seconds over the mean rank's (its partitioner
  runs in a process of its own, reported apart as ``repartition_seconds``);
* ``repartition_seconds``: the mean time of a placement's computation, and
  ``repartition_lag_steps``, the most steps between a repartition's start and its placement.

Targets, at the largest rank count (issue 46): graph's embedding bytes a sample <= 0.5x hash's;
control vector plus placement broadcast <= 5% of all bytes sent; rank 0 sends and receives
<= 2x the mean rank; a repartition finishes within its interval. The last line printed is the
JSON summary ``{"bench": "scale", "rows": [...], "targets": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from partitioner import Placement
from streaming.synthetic import SyntheticConfig
from trainer.dist import EMBEDDING_KINDS, KINDS, ThreadComm, run_threads
from trainer.embedding import StoreConfig
from trainer.model import ModelConfig
from trainer.online import OnlineConfig
from trainer.run import Job, RankResult, run_rank
from trainer.sources import SyntheticSpec
from trainer.step import TrainConfig

__all__ = ["build_parser", "job_of", "main", "measure"]


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(prog="hetgmp bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,8,16,32", help="rank counts, comma separated")
    p.add_argument("--placements", default="hash,graph", help="hash, graph or both")
    p.add_argument("--batch-per-rank", type=int, default=512,
                   help="samples a rank reads a step (the global batch is this times the ranks)")
    p.add_argument("--steps", type=int, default=40, help="steps trained")
    p.add_argument("--warmup-steps", type=int, default=6,
                   help="graph: steps on hash before the first (full) partition")
    p.add_argument("--interval-steps", type=int, default=10,
                   help="graph: steps between repartitions, and the window's length in steps")
    p.add_argument("--seed", type=int, default=0, help="stream and model seed")
    p.add_argument("--quick", action="store_true", help="2, 4 and 8 ranks, 24 steps")
    return p


def _rank(comm: ThreadComm, job: Job) -> tuple[RankResult, float]:
    began = time.thread_time()
    result = run_rank(comm, job)
    return result, time.thread_time() - began


def job_of(ranks: int, placement: str, args: argparse.Namespace) -> Job:
    """The job of one configuration."""
    batch = args.batch_per_rank * ranks
    syn = SyntheticConfig(seed=args.seed)
    graph = placement == "graph"
    return Job(SyntheticSpec(syn, 0, batch * args.steps),
               ModelConfig(model="deepfm", embed_dim=8, hidden=(16,), seed=args.seed),
               StoreConfig(seed=args.seed),
               TrainConfig(global_batch=batch, placement="graph" if graph else "hash",
                           route="on" if graph else "off", warmup=batch * args.warmup_steps,
                           log_every=0),
               placement=None if graph else Placement.hash(ranks),
               online=OnlineConfig(repartition_interval=str(batch * args.interval_steps),
                                   window=batch * args.interval_steps))


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


def _targets(rows: list[dict[str, Any]], interval_steps: int) -> dict[str, Any]:
    top = max(r["ranks"] for r in rows)
    at = {r["placement"]: r for r in rows if r["ranks"] == top}
    out: dict[str, Any] = {"ranks": top}
    if "hash" in at and "graph" in at:
        out["graph_over_hash_embedding_bytes"] = round(
            at["graph"]["embedding_bytes_per_sample"]
            / max(at["hash"]["embedding_bytes_per_sample"], 1e-9), 3)
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
                  f"(lag {row['repartition_lag_steps']} steps); {time.perf_counter() - began:.0f} s",
                  flush=True)
            print(f"{'':>16}B/sample by kind: {kinds}", flush=True)
    targets = _targets(rows, args.interval_steps)
    for k, v in targets.items():
        print(f"{k}: {v}", flush=True)
    print(json.dumps({"bench": "scale", "rows": rows, "targets": targets}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
