"""What a checkpoint holds: every rank's rows, the dense model and the placement."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer.checkpoint.files import CheckpointError, load_arrays, save_arrays
from hetgmp.trainer.checkpoint.manifest import Manifest, rank_file

__all__ = ["load_dense", "load_placement", "load_rows", "save_dense", "save_placement",
           "save_rows"]

_ROW_KEYS = {"ids", "values", "state", "versions"}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _arrays(manifest: Manifest, name: str, keys: set[str]) -> dict[str, np.ndarray]:
    arrays = load_arrays(manifest.read(name), manifest.path / name)
    if not keys <= arrays.keys():
        raise CheckpointError(f"{manifest.path / name} lacks {sorted(keys - arrays.keys())}")
    return arrays


def save_rows(directory: Path, rank: int, ids: np.ndarray, values: torch.Tensor,
              state: torch.Tensor, versions: np.ndarray) -> None:
    """Write ``rank``'s owned rows."""
    save_arrays(rank_file(directory, rank), {
        "ids": np.asarray(ids, np.int64), "values": _np(values), "state": _np(state),
        "versions": np.asarray(versions, np.int64)})


def load_rows(manifest: Manifest, keep: Callable[[np.ndarray], np.ndarray] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of every rank file of a checkpoint, filtered by ``keep(ids) -> bool mask``.

    Returns:
        (ids, values, optimizer state, versions) of the rows kept, ids sorted.
    """
    parts = []
    for rank in range(manifest.world):
        name = rank_file(manifest.path, rank).name
        a = _arrays(manifest, name, _ROW_KEYS)
        n = a["ids"].shape[0]
        if a["ids"].ndim != 1 or any(a[k].shape[0] != n for k in _ROW_KEYS):
            raise CheckpointError(f"{manifest.path / name}: arrays of different lengths")
        mask = keep(a["ids"]) if keep is not None else np.ones(n, bool)
        parts.append({k: v[mask] for k, v in a.items() if k in _ROW_KEYS})
    ids = np.concatenate([p["ids"] for p in parts])
    order = np.argsort(ids, kind="stable")
    if ids.size and bool(np.any(ids[order][1:] == ids[order][:-1])):
        raise CheckpointError(f"{manifest.path}: an id is owned by two ranks")
    return (ids[order], np.concatenate([p["values"] for p in parts])[order],
            np.concatenate([p["state"] for p in parts])[order],
            np.concatenate([p["versions"] for p in parts])[order])


def save_dense(directory: Path, arrays: dict[str, torch.Tensor | np.ndarray]) -> None:
    """Write the dense parameters and their optimizer state."""
    save_arrays(directory / "dense.npz",
                {k: _np(v) if isinstance(v, torch.Tensor) else np.asarray(v)
                 for k, v in arrays.items()})


def load_dense(manifest: Manifest) -> dict[str, np.ndarray]:
    """The dense arrays of a checkpoint."""
    return _arrays(manifest, "dense.npz", {"flat"})


def save_placement(directory: Path, placement: Placement) -> None:
    """Write a placement (replica sets concatenated, with one count per worker)."""
    reps = placement.replicas
    save_arrays(directory / "placement.npz", {
        "version": np.array([placement.version], np.int64),
        "num_workers": np.array([placement.num_workers], np.int64),
        "ids": placement.ids, "owners": placement.owners,
        "replica_counts": np.array([r.size for r in reps], np.int64),
        "replicas": np.concatenate(reps) if reps else np.zeros(0, np.int64)})


def load_placement(manifest: Manifest) -> Placement:
    """The placement a checkpoint was taken under (for as many workers as its world)."""
    a = _arrays(manifest, "placement.npz",
                {"version", "num_workers", "ids", "owners", "replica_counts", "replicas"})
    workers = int(a["num_workers"][0])
    if workers != manifest.world:
        raise CheckpointError(f"{manifest.path}: the placement is for {workers} ranks, the "
                              f"manifest says {manifest.world}")
    bounds = np.concatenate([[0], np.cumsum(a["replica_counts"])])
    reps = tuple(a["replicas"][bounds[i]:bounds[i + 1]] for i in range(bounds.size - 1))
    try:
        return Placement(int(a["version"][0]), workers, a["ids"], a["owners"], reps)
    except ValueError as exc:
        raise CheckpointError(f"{manifest.path}: placement.npz is not a valid placement: "
                              f"{exc}") from None
