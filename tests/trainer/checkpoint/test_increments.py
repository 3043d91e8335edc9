"""Checkpoints in proportion to change (issue 57): a full checkpoint and its increments restore
exactly what a full checkpoint at the same point restores, whatever happened between them (new
rows, updates, idle rows dropped, rows spilled to the disk tier and read back, rows moved
between ranks); the chain is checked link by link; pruning keeps what a kept checkpoint needs.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.partitioner import Placement
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig

DIM = 4
PART_ROWS = 50  # a full checkpoint of a store with a tier writes its disk rows in parts


def _piece(manifest: ckpt.Manifest) -> tuple[np.ndarray, np.ndarray]:
    """What one checkpoint's own row files hold: the ids of its rows, and the ids it removes."""
    ids, removed = [], [np.zeros(0, np.int64)]
    for rank in range(manifest.world):
        for name in manifest.rank_files(rank):
            with np.load(manifest.path / name) as a:
                ids.append(a["ids"])
                removed += [a["removed"]] if "removed" in a.files else []
    return np.concatenate(ids), np.concatenate(removed)


def _write(root: Path, stores: list[EmbeddingStore], step: int,
           parent: ckpt.Manifest | None) -> ckpt.Manifest:
    """A checkpoint of ``stores`` (one a rank): full without ``parent``, else an increment."""
    base = None if parent is None else ckpt.Base(parent.path.name, parent.digest(),
                                                 parent.depth + 1)
    directory = ckpt.new_step_dir(root, step)
    directory.mkdir(parents=True)
    for rank, store in enumerate(stores):
        parts, removed = store.saved_rows(full=base is None, part_rows=PART_ROWS)
        ckpt.save_rows(directory, rank, parts, removed=None if base is None else removed)
    ckpt.save_dense(directory, {"flat": np.zeros(1)})
    ckpt.save_placement(directory, Placement.hash(len(stores)))
    return ckpt.write_manifest(directory, step=step, world=len(stores), placement_version=0,
                               records=step, offsets={}, topic=None, extra={}, base=base)


def _table(stores: list[EmbeddingStore]) -> tuple[np.ndarray, ...]:
    """Every rank's rows together, ids sorted (what a full checkpoint restores)."""
    parts = [s.export() for s in stores]
    ids = np.concatenate([p[0] for p in parts])
    order = np.argsort(ids)
    return (ids[order], torch.cat([p[1] for p in parts]).numpy()[order],
            torch.cat([p[2] for p in parts]).numpy()[order],
            np.concatenate([p[3] for p in parts])[order])


def _steps(stores: list[EmbeddingStore], rng: np.random.Generator, first: int, n: int,
           moved: np.ndarray) -> None:
    """``n`` steps of Zipf-drawn ids on each rank (ids of rank r are those = r mod world, but
    ``moved`` ids are rank 1's), with maintenance (idle rows dropped, rows past the cap
    spilled)."""
    world = len(stores)
    for step in range(first, first + n):
        drawn = np.unique(rng.zipf(1.3, 160) % 4000).astype(np.int64) + 10**6 * (step // 25)
        owner = np.where(np.isin(drawn, moved), 1, drawn % world)  # the stream drifts ^
        for rank, store in enumerate(stores):
            ids = drawn[owner == rank]
            store.lookup(ids, step)
            grads = torch.from_numpy(rng.standard_normal((ids.size, DIM)))
            store.apply(ids, grads, np.ones(ids.size, np.int64))
            store.maintain(step)


@pytest.mark.parametrize("tier", [False, True], ids=["memory", "disk-tier"])
def test_a_chain_of_increments_restores_what_a_full_checkpoint_restores(
        tmp_path: Path, tier: bool) -> None:
    rng = np.random.default_rng(3)
    stores = [EmbeddingStore(DIM, StoreConfig(
        optimizer="adagrad", evict_after=12, max_rows=150 if tier else 0,
        disk_dir=str(tmp_path / f"tier{r}") if tier else ""), dtype=torch.float64)
        for r in range(2)]
    parent, step = None, 0
    moved = np.zeros(0, np.int64)
    for round_ in range(8):
        _steps(stores, rng, step, 6, moved)
        step += 6
        if round_ in (3, 5):  # a migration: rank 0 hands some of its rows to rank 1
            moving = stores[0].ids()[::4]
            stores[1].put(*stores[0].take(moving), step=step)
            moved = np.union1d(moved, moving)
        parent = _write(tmp_path / "ckpt", stores, step, None if round_ == 4 else parent)
        restored = ckpt.load_rows(parent)
        expected = _table(stores)
        for got, want in zip(restored, expected, strict=True):
            np.testing.assert_array_equal(got, want)
    assert parent is not None and parent.depth == 3  # full at rounds 0 and 4
    removed = sum(_piece(m)[1].size for m in ckpt.chain(parent)[1:])
    if not tier:  # (with the tier, rows spill before they idle long enough to drop)
        assert removed > 0  # idle rows were dropped between checkpoints and forgotten
    else:
        assert len(ckpt.chain(parent)[0].rank_files(0)) > 2  # the full one, in parts
        assert sum(s.stats.spilled for s in stores) > 500
        assert sum(s.stats.restored for s in stores) > 100
    # A restore on another number of ranks reads the chain through the same filter.
    ids = ckpt.load_rows(parent)[0]
    mine = ckpt.load_rows(parent, keep=lambda a: a % 3 == 1)[0]
    np.testing.assert_array_equal(mine, ids[ids % 3 == 1])


def test_an_increment_holds_the_rows_changed_not_the_table(tmp_path: Path) -> None:
    store = EmbeddingStore(DIM, StoreConfig(), dtype=torch.float64)
    every = np.arange(20_000, dtype=np.int64)
    store.lookup(every, 0)
    full = _write(tmp_path, [store], 1, None)
    few = every[::50]
    store.apply(few, torch.ones(few.size, DIM, dtype=torch.float64), np.ones(few.size, np.int64))
    inc = _write(tmp_path, [store], 2, full)
    size = {m.path.name: m.files["rank-00000.npz"]["bytes"] for m in (full, inc)}
    assert size[inc.path.name] < 0.03 * size[full.path.name], size
    nothing = _write(tmp_path, [store], 3, inc)  # nothing changed since
    assert _piece(nothing)[0].size == 0 and _piece(inc)[0].size == few.size
    np.testing.assert_array_equal(ckpt.load_rows(nothing)[1], store.export()[1].numpy())


@pytest.fixture()
def chain_dir(tmp_path: Path) -> tuple[Path, list[ckpt.Manifest]]:
    store = EmbeddingStore(DIM, StoreConfig(evict_after=2), dtype=torch.float64)
    made, parent = [], None
    for step in range(1, 6):
        store.lookup(np.arange(step * 10, step * 10 + 30, dtype=np.int64), step)
        store.maintain(step)
        parent = _write(tmp_path, [store], step, parent if step != 4 else None)
        made.append(parent)
    return tmp_path, made  # full, +1, +2, full, +1


def test_a_checkpoint_whose_parent_is_gone_is_skipped_for_an_older_one(
        chain_dir, caplog) -> None:
    root, made = chain_dir
    shutil.rmtree(made[3].path)  # the base of the newest
    with caplog.at_level(logging.WARNING):
        found = ckpt.latest(root)
    assert found is not None and found.path == made[2].path
    assert "not a complete checkpoint" in caplog.text


def test_a_parent_replaced_by_another_checkpoint_breaks_the_chain(chain_dir) -> None:
    root, made = chain_dir
    # The parent's manifest rewritten (another run's checkpoint at that name): same files,
    # another digest.
    body = (made[1].path / ckpt.MANIFEST).read_text().replace('"records": 2', '"records": 7')
    (made[1].path / ckpt.MANIFEST).write_text(body)
    with pytest.raises(ckpt.CheckpointError, match="increment of another"):
        ckpt.load_rows(made[2])
    assert ckpt.latest(root).path == made[4].path  # its own chain is whole


def test_a_depth_that_does_not_follow_its_parents_is_refused(chain_dir) -> None:
    _, made = chain_dir
    path = made[2].path / ckpt.MANIFEST
    path.write_text(path.read_text().replace('"depth": 2', '"depth": 5'))
    with pytest.raises(ckpt.CheckpointError, match="depth 5 on a parent of depth 1"):
        ckpt.chain(ckpt.read_manifest(made[2].path))


@pytest.mark.parametrize("parent", ["../step-000000000001", "x", 7])
def test_a_parent_outside_the_checkpoint_directory_is_refused(chain_dir, parent) -> None:
    _, made = chain_dir
    path = made[1].path / ckpt.MANIFEST
    body = path.read_text().replace('"step-000000000001"', f'"{parent}"' if isinstance(
        parent, str) else str(parent))
    path.write_text(body)
    with pytest.raises(ckpt.CheckpointError, match="base.parent must name"):
        ckpt.read_manifest(made[1].path)


def test_pruning_keeps_the_parents_of_what_it_keeps(chain_dir) -> None:
    root, made = chain_dir
    before = ckpt.load_rows(made[4])
    gone = ckpt.prune(root, 1)  # keeps the newest (an increment) and its base
    assert {p.name for p in gone} == {m.path.name for m in made[:3]}
    for got, want in zip(ckpt.load_rows(made[4]), before, strict=True):
        np.testing.assert_array_equal(got, want)
    assert ckpt.latest(root).path == made[4].path
    assert ckpt.prune(root, 1) == []


@pytest.fixture()
def in_parts(tmp_path: Path) -> ckpt.Manifest:
    """A full checkpoint of a store whose disk tier holds most rows: its rank file and parts."""
    store = EmbeddingStore(DIM, StoreConfig(max_rows=40, disk_dir=str(tmp_path / "tier")),
                           dtype=torch.float64)
    for step in range(6):
        store.lookup(np.arange(step * 40, step * 40 + 40, dtype=np.int64), step)
        store.maintain(step)
    manifest = _write(tmp_path / "ckpt", [store], 6, None)
    parts = manifest.rank_files(0)[1:]
    assert len(parts) >= 3
    assert parts == [f"rank-00000-{i:04d}.npz" for i in range(1, len(parts) + 1)]
    np.testing.assert_array_equal(ckpt.load_rows(manifest)[0], np.arange(240))
    return manifest


def test_a_rank_whose_parts_leave_a_gap_is_refused(in_parts: ckpt.Manifest) -> None:
    path = in_parts.path / ckpt.MANIFEST
    path.write_text(path.read_text().replace('"rank-00000-0002.npz"', '"rank-00000-0007.npz"'))
    with pytest.raises(ckpt.CheckpointError, match="parts numbered from 1"):
        ckpt.read_manifest(in_parts.path)


def test_a_part_the_manifest_does_not_name_is_refused(in_parts: ckpt.Manifest) -> None:
    after = len(in_parts.rank_files(0))  # the number after its last part
    shutil.copy(in_parts.path / "rank-00000-0001.npz",
                in_parts.path / f"rank-00000-{after:04d}.npz")
    with pytest.raises(ckpt.CheckpointError, match="does not name"):
        ckpt.read_manifest(in_parts.path)
