"""What a checkpoint holds: every rank's rows (all of them, or an increment's changes), the dense
model and the placement."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Callable, cast

import numpy as np
import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer.checkpoint.files import CheckpointError, load_arrays, save_arrays
from hetgmp.trainer.checkpoint.manifest import Manifest, chain, rank_file

__all__ = ["iter_rows", "load_dense", "load_placement", "load_rows", "save_dense",
           "save_placement", "save_rows"]

_ROW_KEYS = {"ids", "values", "state", "versions"}
Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # ids, values, state, versions
StoreRows = tuple[np.ndarray, torch.Tensor, torch.Tensor, np.ndarray]  # as a store gives them


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _arrays(manifest: Manifest, name: str, keys: set[str]) -> dict[str, np.ndarray]:
    arrays = load_arrays(manifest.read(name), manifest.path / name)
    if not keys <= arrays.keys():
        raise CheckpointError(f"{manifest.path / name} lacks {sorted(keys - arrays.keys())}")
    return arrays


def save_rows(directory: Path, rank: int, parts: Iterable[StoreRows],
              removed: np.ndarray | None = None) -> int:
    """Write ``rank``'s owned rows, a file a part (at least one): all of them, or (an
    increment, ``removed`` given) those changed since the parent checkpoint and the ids removed
    since (in the first file). Parts are written as they come, so rows read a part at a time
    from a disk tier never need the table's memory. Returns the rows written."""
    total = files = 0
    for files, (ids, values, state, versions) in enumerate(parts, start=1):
        arrays = {"ids": np.asarray(ids, np.int64), "values": _np(values), "state": _np(state),
                  "versions": np.asarray(versions, np.int64)}
        if files == 1 and removed is not None:
            arrays["removed"] = np.asarray(removed, np.int64)
        save_arrays(rank_file(directory, rank, files - 1), arrays)
        total += int(arrays["ids"].size)
    if files == 0:
        raise ValueError("save_rows needs at least one part (it may be empty)")
    return total


def _part(manifest: Manifest, name: str, first: bool,
          keep: Callable[[np.ndarray], np.ndarray] | None) -> tuple[Rows, np.ndarray]:
    """One row file's rows kept by ``keep``, and (the first file of an increment's rank) the
    ids the increment removes."""
    removes = first and manifest.base is not None
    a = _arrays(manifest, name, _ROW_KEYS | ({"removed"} if removes else set()))
    n = a["ids"].shape[0]
    if a["ids"].ndim != 1 or any(a[k].shape[0] != n for k in _ROW_KEYS):
        raise CheckpointError(f"{manifest.path / name}: arrays of different lengths")
    mask = keep(a["ids"]) if keep is not None else slice(None)
    rows = (a["ids"][mask], a["values"][mask], a["state"][mask], a["versions"][mask])
    return rows, a["removed"].reshape(-1) if removes else np.zeros(0, np.int64)


def _files(manifest: Manifest) -> list[tuple[str, bool]]:
    return [(name, i == 0) for rank in range(manifest.world)
            for i, name in enumerate(manifest.rank_files(rank))]


def _newest(pieces: list[Manifest], keep: Callable[[np.ndarray], np.ndarray] | None
            ) -> tuple[Rows, np.ndarray]:
    """The increments ``pieces`` (oldest first) merged: an id's row is its newest piece's,
    unless a newer piece removed the id (a piece's rows outrank its own removals). Returns the
    rows (ids sorted) and every id the pieces hold or remove (sorted)."""
    rows: list[tuple[int, Rows]] = []
    gone: list[tuple[int, np.ndarray]] = []
    for i, m in enumerate(pieces):
        for name, first in _files(m):
            part, removed = _part(m, name, first, keep)
            rows.append((i, part))
            gone.append((i, removed))
    ids = np.concatenate([r[0] for _, r in rows])
    piece = np.concatenate([np.full(r[0].size, i) for i, r in rows])
    order = np.lexsort((piece, ids))  # by id, then piece: an id's newest row last
    newest = order[np.append(ids[order][1:] != ids[order][:-1], True)] if ids.size else order
    g_ids = np.concatenate([g for _, g in gone])
    g_in = np.concatenate([np.full(g.size, i) for i, g in gone])
    last_gone = np.full(newest.size, -1)
    if g_ids.size:  # the newest piece that removed each id
        by_id = np.lexsort((g_in, g_ids))
        g_ids, g_in = g_ids[by_id], g_in[by_id]
        last = np.append(g_ids[1:] != g_ids[:-1], True)
        g_ids, g_in = g_ids[last], g_in[last]
        at = np.minimum(np.searchsorted(g_ids, ids[newest]), g_ids.size - 1)
        hit = g_ids[at] == ids[newest]
        last_gone[hit] = g_in[at[hit]]
    newest = newest[last_gone <= piece[newest]]
    merged = tuple(np.concatenate([r[k] for _, r in rows])[newest] for k in range(4))
    return cast(Rows, merged), np.union1d(ids, g_ids)


def iter_rows(manifest: Manifest, keep: Callable[[np.ndarray], np.ndarray] | None = None
              ) -> Iterator[Rows]:
    """A checkpoint's rows kept by ``keep(ids) -> bool mask``, a file at a time: of every rank
    file of it and, for an increment, of its chain
    (:func:`~hetgmp.trainer.checkpoint.manifest.chain`): an id's row is its newest piece's,
    unless a newer piece removed it. The increments are merged in memory (they hold what changed),
    the full base is read one file at a time, without the ids the increments hold or remove; so
    a restore never needs more memory than a file and the changes. No two chunks share an id
    (if the files are sound: :func:`load_rows` checks it)."""
    pieces = chain(manifest)
    newer, touched = _newest(pieces[1:], keep) if len(pieces) > 1 else (None, None)
    for name, first in _files(pieces[0]):
        rows, _ = _part(pieces[0], name, first, keep)
        if touched is not None and touched.size:
            stay = ~np.isin(rows[0], touched)
            rows = cast(Rows, tuple(a[stay] for a in rows))
        yield rows
    if newer is not None and newer[0].size:
        yield newer


def load_rows(manifest: Manifest, keep: Callable[[np.ndarray], np.ndarray] | None = None
              ) -> Rows:
    """Every row :func:`iter_rows` gives, at once.

    Returns:
        (ids, values, optimizer state, versions) of the rows kept, ids sorted.
    """
    parts = list(iter_rows(manifest, keep))
    ids = np.concatenate([p[0] for p in parts])
    order = np.argsort(ids, kind="stable")
    if ids.size and bool(np.any(ids[order][1:] == ids[order][:-1])):
        raise CheckpointError(f"{manifest.path}: an id is owned by two ranks")
    return cast(Rows, tuple(np.concatenate([p[k] for p in parts])[order] for k in range(4)))


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
