"""What a checkpoint holds: every rank's rows (all of them, or an increment's changes), the dense
model and the placement."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer.checkpoint.files import CheckpointError, load_arrays, save_arrays
from hetgmp.trainer.checkpoint.manifest import Manifest, chain, rank_file

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
              state: torch.Tensor, versions: np.ndarray, removed: np.ndarray | None = None
              ) -> None:
    """Write ``rank``'s owned rows: all of them, or (an increment, ``removed`` given) those
    changed since the parent checkpoint and the ids removed since."""
    arrays = {"ids": np.asarray(ids, np.int64), "values": _np(values), "state": _np(state),
              "versions": np.asarray(versions, np.int64)}
    if removed is not None:
        arrays["removed"] = np.asarray(removed, np.int64)
    save_arrays(rank_file(directory, rank), arrays)


def piece_rows(manifest: Manifest, keep: Callable[[np.ndarray], np.ndarray] | None
           ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One checkpoint's rows (of every rank file, filtered by ``keep``) and, for an increment,
    the ids it removes."""
    parts, removed = [], [np.zeros(0, np.int64)]
    keys = _ROW_KEYS | ({"removed"} if manifest.base is not None else set())
    for rank in range(manifest.world):
        name = rank_file(manifest.path, rank).name
        a = _arrays(manifest, name, keys)
        n = a["ids"].shape[0]
        if a["ids"].ndim != 1 or any(a[k].shape[0] != n for k in _ROW_KEYS):
            raise CheckpointError(f"{manifest.path / name}: arrays of different lengths")
        mask = keep(a["ids"]) if keep is not None else np.ones(n, bool)
        parts.append({k: v[mask] for k, v in a.items() if k in _ROW_KEYS})
        if "removed" in keys:
            removed.append(a["removed"].reshape(-1))
    rows = {k: np.concatenate([p[k] for p in parts]) for k in _ROW_KEYS}
    ids = np.sort(rows["ids"])
    if ids.size and bool(np.any(ids[1:] == ids[:-1])):
        raise CheckpointError(f"{manifest.path}: an id is owned by two ranks")
    return rows, np.unique(np.concatenate(removed))


def load_rows(manifest: Manifest, keep: Callable[[np.ndarray], np.ndarray] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of a checkpoint, filtered by ``keep(ids) -> bool mask``: of every rank file of
    it and, for an increment, of its chain (:func:`~hetgmp.trainer.checkpoint.manifest.chain`):
    an id's row is its newest piece's, unless a newer piece removed the id.

    Returns:
        (ids, values, optimizer state, versions) of the rows kept, ids sorted.
    """
    pieces = [piece_rows(m, keep) for m in chain(manifest)]
    rows = {k: np.concatenate([p[0][k] for p in pieces]) for k in _ROW_KEYS}
    piece = np.concatenate([np.full(p[0]["ids"].size, i) for i, p in enumerate(pieces)])
    order = np.lexsort((piece, rows["ids"]))  # by id, then piece: an id's newest row last
    ids = rows["ids"][order]
    newest = order[np.append(ids[1:] != ids[:-1], True)] if ids.size else order
    # The last piece that removed each id: a row survives unless a newer piece removed it.
    gone = np.concatenate([p[1] for p in pieces])
    gone_in = np.concatenate([np.full(p[1].size, i) for i, p in enumerate(pieces)])
    last_gone = np.full(newest.size, -1)
    if gone.size:
        by_id = np.lexsort((gone_in, gone))
        g_ids, g_in = gone[by_id], gone_in[by_id]
        last = np.append(g_ids[1:] != g_ids[:-1], True)
        g_ids, g_in = g_ids[last], g_in[last]
        at = np.searchsorted(g_ids, rows["ids"][newest])
        hit = (at < g_ids.size) & (g_ids[np.minimum(at, g_ids.size - 1)] == rows["ids"][newest])
        last_gone[hit] = g_in[at[hit]]
    newest = newest[last_gone <= piece[newest]]  # a piece's rows outrank its own removals
    return (rows["ids"][newest], rows["values"][newest], rows["state"][newest],
            rows["versions"][newest])


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
