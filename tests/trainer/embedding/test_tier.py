"""The disk tier under the store (issue 57): rows past the memory cap spill whole to RocksDB
and come back bit for bit; a capped store with a tier answers exactly what a store without a
cap answers (values, optimizer state, versions, the delta log's changes, migrations)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig
from hetgmp.trainer.embedding.tier import DiskTier


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_tier_gives_back_what_it_was_given(tmp_path: Path, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(1)
    tier = DiskTier(tmp_path, 5, 1, dtype)
    ids = np.unique(rng.integers(-2**63, 2**63 - 1, 300, dtype=np.int64))
    values = torch.from_numpy(rng.standard_normal((ids.size, 5))).to(dtype)
    state = torch.from_numpy(rng.random((ids.size, 1))).to(dtype)
    versions = rng.integers(0, 10**12, ids.size)
    perm = rng.permutation(ids.size)  # written out of order
    tier.put(ids[perm], values[perm], state[perm], versions[perm])
    assert len(tier) == ids.size
    got = tier.items()  # sorted by id, negative ids first
    assert np.array_equal(got[0], ids) and np.array_equal(tier.ids(), ids)
    assert torch.equal(got[1], values) and torch.equal(got[2], state)
    assert np.array_equal(got[3], versions)
    ask = np.concatenate([ids[::7], [12345]])  # one id it never held
    found, v, s, ver = tier.take(ask)
    assert found.tolist() == [True] * (ask.size - 1) + [False]
    assert torch.equal(v, values[::7]) and torch.equal(s, state[::7])
    assert np.array_equal(ver, versions[::7])
    assert len(tier) == ids.size - ids[::7].size
    assert not tier.get(ids[::7])[0].any()  # taken rows left
    path = tier.path
    tier.close()
    assert not path.exists()


def test_a_dead_processs_tier_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = tmp_path / f"tier-{int(dead.stdout)}-abc"
    live = tmp_path / f"tier-{os.getpid()}-def"
    gone.mkdir()
    live.mkdir()
    tier = DiskTier(tmp_path, 2, 0, torch.float32)
    assert not gone.exists() and live.exists() and tier.path.exists()
    tier.close()


def _stream(rng: np.random.Generator, steps: int) -> list[np.ndarray]:
    return [np.unique(rng.zipf(1.2, 60) % 3000).astype(np.int64) for _ in range(steps)]


def _train(store: EmbeddingStore, batches: list[np.ndarray], seed: int,
           every: int = 10) -> list[tuple[np.ndarray, torch.Tensor]]:
    """Lookups and updates of each batch, maintenance where the cap passes, and the delta log's
    changes every ``every`` steps."""
    rng = np.random.default_rng(seed)
    published = []
    for step, ids in enumerate(batches):
        store.lookup(ids, step)
        grads = torch.from_numpy(rng.standard_normal((ids.size, store.dim)))
        store.apply(ids, grads, np.ones(ids.size, np.int64))
        if store.over_cap or step % 4 == 3:
            store.maintain(step)
        if step % every == every - 1:
            published.append(store.changes())
    return published


def _same(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else torch.equal(x, y)
               for x, y in zip(a, b, strict=True))


def test_a_capped_store_with_a_tier_trains_what_an_uncapped_store_trains(
        tmp_path: Path) -> None:
    batches = _stream(np.random.default_rng(2), 150)
    cap = 100
    tiered = EmbeddingStore(4, StoreConfig(max_rows=cap, disk_dir=str(tmp_path)),
                            dtype=torch.float64)
    plain = EmbeddingStore(4, StoreConfig(), dtype=torch.float64)
    tiered.unpublish()  # the delta log's first publish: every row
    plain.unpublish()
    log_t, log_p = _train(tiered, batches, 7), _train(plain, batches, 7)
    st = tiered.stats
    assert st.spilled > 2 * cap and st.restored > cap and st.evicted == 0
    assert len(tiered) <= cap and tiered.tier is not None and len(tiered.tier) > cap
    assert st.created == plain.stats.created
    # The delta log saw every change, spilled or not, once each publish.
    assert len(log_t) == len(log_p) and all(_same(a, b) for a, b in zip(log_t, log_p))
    assert _same(tiered.export(), plain.export())
    assert np.array_equal(tiered.ids(), plain.ids())
    probe = np.concatenate([plain.ids()[::3], [10**9]])  # most on disk, one unknown
    assert np.array_equal(tiered.contains(probe), plain.contains(probe))
    assert np.array_equal(tiered.versions(probe), plain.versions(probe))
    assert torch.equal(tiered.peek(probe), plain.peek(probe))
    before = len(tiered.tier)
    tiered.peek(probe)
    assert len(tiered.tier) == before  # a peek leaves spilled rows where they are
    # A migration takes rows from whichever tier holds them, and puts them back whole.
    moving = plain.ids()[1::5]
    out_t, out_p = tiered.take(moving), plain.take(moving)
    assert _same(out_t, out_p)
    assert not tiered.contains(moving).any()
    tiered.put(*out_t, step=200)
    plain.put(*out_p, step=200)
    assert _same(tiered.export(), plain.export()) and len(tiered) <= cap


def test_a_spilled_row_comes_back_admitted_with_what_it_learned(tmp_path: Path) -> None:
    # Admission counts ids without a row; a spilled row has one: read again, it is neither a
    # candidate nor a fresh row.
    store = EmbeddingStore(2, StoreConfig(max_rows=8, admit_after=3, disk_dir=str(tmp_path)),
                           dtype=torch.float64)
    hot = np.array([5], np.int64)
    for step in range(3):
        store.lookup(hot, step)
    store.apply(hot, torch.ones(1, 2, dtype=torch.float64), np.ones(1, np.int64))
    learned = store.peek(hot).clone()
    for step in range(3, 10):  # others take the memory; ids 100.. are admitted as pinned
        others = np.arange(100 + 20 * step, 120 + 20 * step, dtype=np.int64)
        store.pin(others)
        store.lookup(others, step)
        store.maintain(step)
    assert store.tier is not None and store.tier.get(hot)[0].all()
    reads = store.stats.not_admitted_reads
    values, _ = store.lookup(hot, 10)
    assert torch.equal(values, learned) and store.stats.not_admitted_reads == reads
    assert store.versions(hot).tolist() == [1] and store.stats.restored == 1


def test_an_update_of_a_spilled_row_without_a_lookup_reaches_it(tmp_path: Path) -> None:
    # A copy's push is applied without a lookup by its owner: the row on disk takes it (it is
    # not dropped as an update of a row that is not there).
    tiered = EmbeddingStore(2, StoreConfig(max_rows=8, disk_dir=str(tmp_path)),
                            dtype=torch.float64)
    plain = EmbeddingStore(2, StoreConfig(), dtype=torch.float64)
    ids = np.arange(40, dtype=np.int64)
    for store in (tiered, plain):
        store.lookup(ids, 0)
        store.maintain(0)
        grads = torch.ones(3, 2, dtype=torch.float64)
        store.apply(ids[:3].copy(), grads, np.full(3, 2, np.int64))
    assert tiered.stats.spilled > 0 and tiered.stats.dropped_updates == 0
    assert _same(tiered.export(), plain.export())


def test_idle_rows_expire_from_the_disk_as_from_memory(tmp_path: Path) -> None:
    """--store-evict-after reaches spilled rows: with the tier scanned at every maintain, a
    capped store with a tier drops what an uncapped store drops, when it drops it, with the
    same tombstones and the same removals for the next checkpoint's increment."""
    batches = _stream(np.random.default_rng(8), 200)
    tiered = EmbeddingStore(4, StoreConfig(max_rows=100, evict_after=15,
                                           disk_dir=str(tmp_path)), dtype=torch.float64)
    plain = EmbeddingStore(4, StoreConfig(evict_after=15), dtype=torch.float64)
    tiered.expire_every = 1
    assert tiered.tier is not None
    scans, expire = [], tiered.tier.expire
    tiered.tier.expire = lambda before: (r := expire(before), scans.append(r[0].size))[0]
    grads = np.random.default_rng(9)
    for store in (tiered, plain):
        store.track_evictions(True)
        store.saved_rows(full=True)
    for step, ids in enumerate(batches):
        g = torch.from_numpy(grads.standard_normal((ids.size, 4)))
        for store in (tiered, plain):
            store.lookup(ids, step)
            store.apply(ids, g, np.ones(ids.size, np.int64))
            store.maintain(step)
        if step % 20 == 19:
            assert np.array_equal(tiered.take_tombstones(), plain.take_tombstones())
            assert np.array_equal(tiered.saved_rows(full=False)[1],
                                  plain.saved_rows(full=False)[1])
    assert sum(scans) > 100  # spilled rows expired from the disk
    assert tiered.stats.spilled > 200 and tiered.stats.evicted == plain.stats.evicted
    assert _same(tiered.export(), plain.export())


def test_idle_rows_in_memory_are_still_dropped_and_leave_tombstones(tmp_path: Path) -> None:
    # Expiry (--store-evict-after) is a policy of its own: rows idle in memory go, they do not
    # spill.
    store = EmbeddingStore(2, StoreConfig(max_rows=1000, evict_after=3,
                                          disk_dir=str(tmp_path)))
    store.track_evictions(True)
    old = np.arange(30, dtype=np.int64)
    store.lookup(old, 0)
    store.apply(old, torch.ones(30, 2), np.ones(30, np.int64))
    for step in range(1, 8):
        new = np.arange(100 + 30 * step, 130 + 30 * step, dtype=np.int64)
        store.lookup(new, step)
        store.maintain(step)
    assert not store.contains(old).any()
    assert np.array_equal(store.take_tombstones(), old)
    # No checkpoint was ever taken: nothing keeps the ids an increment would need.
    assert not store._removed and not store._unsaved_log
    assert store.stats.evicted >= 30 and store.stats.spilled == 0


def test_a_restore_larger_than_memory_spills_as_it_goes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ids = np.arange(5000, dtype=np.int64) * 11
    values = torch.from_numpy(rng.standard_normal((ids.size, 3)))
    state = torch.from_numpy(rng.random((ids.size, 1)))
    versions = rng.integers(1, 100, ids.size)
    store = EmbeddingStore(3, StoreConfig(max_rows=256, disk_dir=str(tmp_path)),
                           dtype=torch.float64)
    store.put(ids, values, state, versions, step=0, published=True)
    assert len(store) <= 256 and store.tier is not None and len(store.tier) >= 5000 - 256
    got = store.export()
    assert np.array_equal(got[0], ids) and torch.equal(got[1], values)
    assert torch.equal(got[2], state) and np.array_equal(got[3], versions)
    assert store.changes()[0].size == 0  # restored rows are published already


def test_a_tier_needs_a_cap() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        StoreConfig(disk_dir="/tmp/x")


def test_closing_the_store_removes_the_tier(tmp_path: Path) -> None:
    store = EmbeddingStore(2, StoreConfig(max_rows=16, disk_dir=str(tmp_path)))
    ids = np.arange(100, dtype=np.int64)
    store.lookup(ids, 0)
    store.maintain(0)
    assert store.tier is not None and len(store.tier) > 0
    path = store.tier.path
    store.close()
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_rows_read_ahead_are_what_the_lookup_would_have_read(tmp_path: Path) -> None:
    """Each step reads the next batch's spilled rows ahead, on the tier's thread. With a
    memory tier smaller than a batch, rows read ahead are then restored, updated and spilled
    again by the step in between (stale copies, which must not be used): the store still
    trains exactly what a store in memory trains."""
    batches = _stream(np.random.default_rng(6), 150)
    tiered = EmbeddingStore(4, StoreConfig(max_rows=20, disk_dir=str(tmp_path), prefetch=True),
                            dtype=torch.float64)
    plain = EmbeddingStore(4, StoreConfig(), dtype=torch.float64)
    rng = np.random.default_rng(7)
    for step, ids in enumerate(batches):
        grads = torch.from_numpy(rng.standard_normal((ids.size, 4)))
        if step + 1 < len(batches):
            tiered.prefetch(batches[step + 1])
        for store in (tiered, plain):
            store.lookup(ids, step)
            store.apply(ids, grads, np.ones(ids.size, np.int64))
            store.maintain(step)
    st = tiered.stats
    assert st.prefetched > 500 and st.read_ahead > 300 and st.restored > st.read_ahead
    assert _same(tiered.export(), plain.export())
