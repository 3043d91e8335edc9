"""Settings checked against the machine before any rank starts.

``--workers 1000`` or ``--embed-dim 1000000000`` used to end in a traceback from some rank (or in
the kernel's OOM killer); here they are refused with what they would need. The memory a rank
needs is estimated from the model's parameter count (built on torch's meta device: nothing is
allocated), the optimizer state, one step's rows and activations, and a fixed base for the
interpreter, torch and the clients; it is an estimate, so only settings that clearly cannot fit
are refused.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig, ModelSpec, build_model
from hetgmp.trainer.step import TrainConfig

__all__ = ["Needs", "check_disk_tier", "check_resources", "estimate", "machine_memory"]

log = logging.getLogger(__name__)

# Resident memory of a rank before its model and data: the interpreter, torch, numpy, the Kafka
# client and the metrics server (measured at 230-330 MB on the CPU machine).
_RANK_BASE = 300 << 20
# Values per dense parameter held by a rank: the parameter, its gradient, the flat gradient
# buffer of the all-reduce, and Adam's two moments.
_PER_PARAM = 5
# Copies of one step's gathered rows alive at once (rows, their gradients, the replies and
# gradient messages of the exchange, the model's first activations).
_PER_ROW = 8


@dataclass(frozen=True)
class Needs:
    """What one rank of a job needs, estimated.

    Attributes:
        dense_params: Parameters of the dense model.
        bytes_per_rank: Memory a rank needs (bytes).
    """

    dense_params: int
    bytes_per_rank: int


def machine_memory() -> int | None:
    """Bytes of memory available for new processes now (Linux ``MemAvailable``; None
    elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def estimate(model: ModelConfig, train: TrainConfig, world: int, n_fields: int,
             n_dense: int, spec: ModelSpec | None = None) -> Needs:
    """The memory one rank of a job needs, without allocating any of it (``spec``: what the
    model's factory is given, when the fields are more than pooled ones)."""
    with torch.device("meta"):
        params = sum(p.numel() for p in
                     build_model(model, n_fields, n_dense, spec).parameters())
    item = 8 if model.dtype == "float64" else 4
    local = -(-train.global_batch // world)
    # A record's rows, each field at its width (and an id a row).
    widths = [w for _, w in spec.widths] if spec is not None and spec.widths else \
        [model.row_dim] * n_fields
    rows = local * sum(w + 1 for w in widths) * _PER_ROW * item
    return Needs(params, _RANK_BASE + params * _PER_PARAM * item + rows)


def check_resources(launch: LaunchConfig, model: ModelConfig, train: TrainConfig, *,
                    ranks_here: int, world: int, n_fields: int, n_dense: int,
                    device: str = "cpu", spec: ModelSpec | None = None) -> Needs:
    """Refuse settings this machine cannot run; returns the estimate.

    Args:
        launch: Ranks, threads.
        model: The model (its parameter count).
        train: The global batch.
        ranks_here: Ranks this machine runs.
        world: Ranks of the whole job.
        n_fields: Sparse fields per record.
        n_dense: Dense features per record.
        device: ``cpu`` or ``cuda`` (GPU memory is checked on the device itself).

    Raises:
        ValueError: What does not fit, with the figures.
    """
    cores = os.cpu_count() or 1
    if launch.threads > cores:
        raise ValueError(f"--threads {launch.threads}: this machine has {cores} core(s)")
    if device == "cpu" and ranks_here * launch.threads > 4 * cores:
        raise ValueError(f"--workers {ranks_here} x --threads {launch.threads} CPU ranks on "
                         f"{cores} core(s): each rank would get a sliver of a core; run at "
                         f"most {4 * cores // launch.threads} here, or more machines")
    needs = estimate(model, train, world, n_fields, n_dense, spec)
    per_rank = needs.bytes_per_rank
    if device == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        if per_rank - _RANK_BASE > free:
            raise ValueError(_too_big(model, needs, per_rank - _RANK_BASE, free, "GPU"))
        per_rank = _RANK_BASE  # the host keeps the process, the device the model
    available = machine_memory()
    if available is not None and ranks_here * per_rank > available:
        raise ValueError(_too_big(model, needs, ranks_here * per_rank, available,
                                  f"{ranks_here} rank(s)"))
    if cores < ranks_here * launch.threads:
        log.warning("%d rank(s) x %d thread(s) on %d core(s): ranks will share cores",
                    ranks_here, launch.threads, cores)
    return needs


def check_disk_tier(store: StoreConfig, model: ModelConfig, ranks_here: int,
                    row_dim: int | None = None) -> None:
    """Refuse a disk tier (``--store-disk-dir``) that cannot be written, or whose disk has less
    room than this machine's ranks keep in memory (a tier holds at least that much once the
    table is twice the memory tier; RocksDB stores a row in 1.08x its bytes). ``row_dim``:
    the stored rows' width (default ``model.row_dim``; tables of several widths store
    blocks)."""
    if not store.disk_dir:
        return
    path = Path(store.disk_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--store-disk-dir {path}: cannot create it ({exc.strerror})") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"--store-disk-dir {path}: not writable by this user")
    width = (row_dim or model.row_dim) + store.state_width
    row = width * (8 if model.dtype == "float64" else 4) + 8
    want = int(ranks_here * store.max_rows * row * 1.08)
    free = shutil.disk_usage(path).free
    if free < want:
        raise ValueError(f"--store-disk-dir {path}: {free / 2**30:.1f} GiB free, less than the "
                         f"{want / 2**30:.1f} GiB the memory tier of {ranks_here} rank(s) would "
                         f"spill ({store.max_rows:,} rows of {row} bytes each): free space or "
                         f"lower --store-max-rows")


def _too_big(model: ModelConfig, needs: Needs, want: int, have: int, what: str) -> str:
    return (f"{what} would need about {want / 2**30:,.1f} GiB ({needs.dense_params:,} dense "
            f"parameters with --embed-dim {model.embed_dim} and --hidden "
            f"{','.join(map(str, model.hidden))}), and {have / 2**30:,.1f} GiB is available: "
            f"a smaller model, batch or fewer ranks per machine")
