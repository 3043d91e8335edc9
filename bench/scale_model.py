"""A cost model of one training step on GPUs, from the counts of ``hetgmp bench scale``.

The scale benchmark counts, per kind, the bytes a rank sends per sample it trains, at 2 to 32
in-process ranks of a small model (DeepFM dim 8). :func:`project` carries those counts to a
model and a cluster of a given shape, and bounds the samples a second a GPU trains by each
resource in turn:

* **compute**: a GPU's samples a second on its own (default: MLPerf Training v5.0's
  DLRM-DCNv2 on 8 H200, 1.94M a GPU; this trainer has not run on a GPU yet);
* **NVLink** and **InfiniBand**: a rank's embedding-path bytes (routed samples, headers,
  requests, rows, gradients) go to the other ranks evenly, so ``(N - G) / (N - 1)`` of them
  leave a node of ``G`` GPUs; rows and gradients scale with the row width (counted at dim 8);
  the dense gradients go by NCCL's ring, hierarchically: ``2 D`` a step a GPU inside the node,
  ``2 D / G`` across nodes, ``D`` the dense parameters' bytes;
* **latency**: the collective rounds of a step (counted by the benchmark) times a round's
  latency;
* **rank 0's link**: it receives every rank's window samples for the partitioner;
* **the partitioner**: a pass must finish within its interval, so the interval in records
  must be at least the pass's seconds times the job's samples a second.

Counts past the benchmark's largest rank count are carried by the share of rows held
elsewhere: a kind's bytes a sample grow as ``(N - 1) / N`` (that of a hash placement), and the
control vector's as ``N - 1`` (every rank gathers every rank's 18 values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Cluster", "project", "render"]

_ROW_KINDS = ("response", "gradient", "flush", "migrate")  # grow with the row width
_EMBED_KINDS = ("route", "header", "request", "response", "gradient", "flush")


@dataclass(frozen=True)
class Cluster:
    """The model and machines projected to (defaults: MLPerf's 8-GPU H200 nodes)."""

    gpus_per_node: int = 8
    nvlink_gb_s: float = 450.0  # NVLink 4, a GPU's bandwidth each way (900 GB/s both ways)
    ib_gb_s: float = 50.0  # 400 Gb/s InfiniBand NDR, one adapter a GPU
    round_us: float = 10.0  # latency of one small collective round (an assumption)
    compute_samples_s: float = 1.94e6  # a GPU alone: MLPerf v5.0 DLRM-DCNv2, 8 H200
    dim: int = 128  # row width (MLPerf DLRM-DCNv2's)
    dense_params: int = 15_405_109  # this project's dcnv2 at 1024,1024,512,256, 3 cross, rank 512
    batch_per_gpu: int = 6912  # MLPerf DLRM-DCNv2's 55,296 over 8 GPUs
    bench_dim: int = 8  # the row width the counts were taken at
    bench_batch: int = 512  # samples a rank a step in the counts


def _counts_at(rows: list[dict[str, Any]], ranks: int, placement: str) -> dict[str, float]:
    """Bytes a sample by kind at ``ranks``: measured, or carried from the largest count."""
    mine = sorted((r for r in rows if r["placement"] == placement), key=lambda r: r["ranks"])
    exact = [r for r in mine if r["ranks"] == ranks]
    if exact:
        return dict(exact[0]["bytes_per_sample_by_kind"])
    top = mine[-1]
    n0 = top["ranks"]
    grow = ((ranks - 1) / ranks) / ((n0 - 1) / n0)
    out = {k: v * grow for k, v in top["bytes_per_sample_by_kind"].items()}
    if "control" in out:
        out["control"] = top["bytes_per_sample_by_kind"]["control"] * (ranks - 1) / (n0 - 1)
    return out


def _rounds_at(rows: list[dict[str, Any]], ranks: int, placement: str, steps: int) -> float:
    """Collective rounds a rank calls a step (the largest count measured)."""
    mine = [r for r in rows if r["placement"] == placement and r["ranks"] <= ranks] or \
        [r for r in rows if r["placement"] == placement]
    top = max(mine, key=lambda r: r["ranks"])
    return sum(top["messages_by_kind"].values()) / top["ranks"] / steps


def project(rows: list[dict[str, Any]], ranks: int, placement: str, steps: int,
            c: Cluster = Cluster()) -> dict[str, Any]:
    """The bounds on a GPU's samples a second at ``ranks`` GPUs (see the module docstring)."""
    per = _counts_at(rows, ranks, placement)
    widen = c.dim / c.bench_dim
    scaled = {k: v * (widen if k in _ROW_KINDS else 1.0) for k, v in per.items()
              if k != "dense"}
    # Ids and rows a sample do not depend on the batch; the control vector is a fixed size a
    # step, so its bytes a sample fall as the batch grows.
    scaled["control"] = scaled.get("control", 0.0) * c.bench_batch / c.batch_per_gpu
    a2a = sum(v for k, v in scaled.items() if k in _EMBED_KINDS or k == "migrate")
    g = c.gpus_per_node
    off = max(0.0, (ranks - g) / (ranks - 1)) if ranks > 1 else 0.0
    dense = 4.0 * c.dense_params
    nodes = -(-ranks // g)
    dense_nvl = 2 * dense * (min(ranks, g) - 1) / max(min(ranks, g), 1) / c.batch_per_gpu
    dense_ib = (2 * dense / g * (nodes - 1) / nodes) / c.batch_per_gpu if nodes > 1 else 0.0
    other = scaled.get("control", 0.0) + scaled.get("placement", 0.0)
    nvl_bytes = (a2a + other) * (1 - off) + dense_nvl
    ib_bytes = (a2a + other) * off + dense_ib
    rounds = _rounds_at(rows, ranks, placement, steps)
    # Seconds a sample on a GPU: compute, then the slower link (no overlap: an upper bound on
    # the time), then the step's collective rounds spread over its batch.
    terms = {"compute": 1.0 / c.compute_samples_s,
             "nvlink": nvl_bytes / (c.nvlink_gb_s * 1e9),
             "infiniband": ib_bytes / (c.ib_gb_s * 1e9),
             "latency": rounds * c.round_us * 1e-6 / c.batch_per_gpu}
    seconds = terms["compute"] + max(terms["nvlink"], terms["infiniband"]) + terms["latency"]
    rate = 1.0 / seconds
    first = max(terms, key=lambda k: terms[k])
    # Rank 0 takes every rank's window samples (in its node over NVLink, from the others over
    # its adapter): its link caps the job's samples a second.
    window = per.get("window", 0.0)
    cap = None
    if window:
        link = c.ib_gb_s if ranks > g else c.nvlink_gb_s
        cap = link * 1e9 / (window * (off if ranks > g else 1.0)) / ranks
        if cap < rate:
            rate, first = cap, "rank 0's link (window)"
    return {"ranks": ranks, "nodes": nodes, "placement": placement,
            "bytes_per_sample": {"nvlink": round(nvl_bytes), "infiniband": round(ib_bytes)},
            "us_per_sample": {k: round(v * 1e6, 4) for k, v in terms.items()},
            "rank0_window_cap_per_gpu": None if cap is None else round(cap),
            "samples_s_per_gpu": round(rate), "samples_s": round(rate * ranks),
            "saturates_first": first, "rounds_per_step": round(rounds, 1),
            "window_bytes_per_sample": round(window, 1)}


def render(projected: list[dict[str, Any]], pass_seconds: float | None) -> str:
    """A table of projections, a line each: bytes a sample on each link, microseconds a sample
    by resource, the samples a second that gives, rank 0's link use by the window, and the
    records a repartition interval must span for a pass of ``pass_seconds`` to keep up."""
    lines = [f"{'GPUs':>4} {'nodes':>5} {'placement':>9} {'NVLink B':>8} {'IB B':>6}  "
             f"{'us a sample: compute NVLink    IB latency':>42} {'samples/s a GPU':>15} "
             f"{'job samples/s':>13} {'rank 0 link':>11}  {'interval':>9}  first to saturate"]
    for p in projected:
        b, us = p["bytes_per_sample"], p["us_per_sample"]
        cap = p["rank0_window_cap_per_gpu"]
        link = f"{100 * p['samples_s_per_gpu'] / cap:.1f}%" if cap else "-"
        need = f"{pass_seconds * p['samples_s'] / 1e6:,.0f}M" if pass_seconds else "-"
        lines.append(
            f"{p['ranks']:>4} {p['nodes']:>5} {p['placement']:>9} {b['nvlink']:>8,} "
            f"{b['infiniband']:>6,}  {us['compute']:>22.3f} {us['nvlink']:>6.3f} "
            f"{us['infiniband']:>5.3f} {us['latency']:>7.4f} {p['samples_s_per_gpu']:>15,} "
            f"{p['samples_s']:>13,} {link:>11}  {need:>9}  {p['saturates_first']}")
    return "\n".join(lines)
