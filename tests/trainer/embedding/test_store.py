"""Unit tests of the id index and the embedding store (no processes, no torch.distributed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetgmp.partitioner.idindex import IdIndex
from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig, initial_rows
from hetgmp.trainer.embedding.optimizer import RowOptimizer


def test_index_finds_inserted_ids_and_misses_others() -> None:
    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(0, 2**63 - 1, size=5000, dtype=np.int64))
    index = IdIndex(16)
    index.insert(ids[:3000], np.arange(3000))
    index.insert(ids[3000:], np.arange(3000, ids.size))  # grows several times on the way
    assert index.size == ids.size
    assert np.array_equal(index.find(ids), np.arange(ids.size))
    absent = rng.integers(0, 2**63 - 1, size=1000, dtype=np.int64)
    absent = absent[~np.isin(absent, ids)]
    assert (index.find(absent) == -1).all()
    assert index.size <= index.buckets // 2


def test_index_handles_colliding_homes_and_rebuild() -> None:
    # Ids that differ only in high bits still spread; a dense block of small ids collides a lot
    # in a tiny table: every one must still be found after probing.
    index = IdIndex(16)
    ids = np.arange(0, 200, dtype=np.int64)
    index.insert(ids, ids * 10)
    assert np.array_equal(index.find(ids[::-1]), ids[::-1] * 10)
    index.rebuild(ids[::2], ids[::2] * 10)
    assert np.array_equal(index.find(ids[::2]), ids[::2] * 10)
    assert (index.find(ids[1::2]) == -1).all()
    with pytest.raises(ValueError):
        index.insert(np.array([-5]), np.array([0]))


def test_index_probes_past_removed_entries_and_locates_buckets() -> None:
    # At load 1/2 in a small table many ids sit past their home bucket; removing others on
    # the way (tombstones) must not end their probe, and ``locate`` gives each id's own bucket.
    index = IdIndex(256)
    ids = np.arange(1, 129, dtype=np.int64) * 7919
    index.insert(ids, np.arange(ids.size))
    buckets = index.locate(ids)
    assert np.unique(buckets).size == ids.size and (buckets >= 0).all()
    gone = ids[::3]
    assert index.remove(gone) == gone.size
    kept = np.setdiff1d(ids, gone)
    assert np.array_equal(index.find(kept), np.searchsorted(ids, kept))
    assert (index.find(gone) == -1).all() and (index.locate(gone) == -1).all()
    assert np.array_equal(index.locate(kept), buckets[np.searchsorted(ids, kept)])


def test_initial_rows_depend_only_on_seed_and_id() -> None:
    ids = np.array([7, 2**62 + 3, 0, 7], dtype=np.int64)
    a = initial_rows(ids, 8, seed=1, scale=0.05)
    b = initial_rows(ids[::-1].copy(), 8, seed=1, scale=0.05)[::-1]
    assert np.array_equal(a, b)  # independent of the batch it comes in
    assert np.array_equal(a[0], a[3])
    assert not np.array_equal(a, initial_rows(ids, 8, seed=2, scale=0.05))
    assert np.abs(a).max() < 0.05 and len({tuple(r) for r in a}) == 3
    big = initial_rows(np.arange(20000, dtype=np.int64), 4, seed=0, scale=1.0)
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1 / np.sqrt(3)) < 0.01  # uniform


def test_two_stores_create_identical_rows(device: str) -> None:
    config = StoreConfig(seed=3)
    a = EmbeddingStore(6, config, dtype=torch.float64, device=device)
    b = EmbeddingStore(6, config, dtype=torch.float64)  # on CPU: a row is the same everywhere
    ids = np.array([11, 5, 99], dtype=np.int64)
    va, _ = a.lookup(ids, step=0)
    b.lookup(np.array([1, 2, 3, 99], dtype=np.int64), step=0)  # other rows first: other slots
    vb, _ = b.lookup(ids, step=0)
    assert va.device.type == device
    assert torch.equal(va.cpu(), vb)
    assert torch.equal(vb, torch.from_numpy(initial_rows(ids, 6, 3, config.init_scale)))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_apply_updates_rows_state_and_versions(optimizer: str, device: str) -> None:
    config = StoreConfig(optimizer=optimizer, lr=0.1, adagrad_init=0.5)
    store = EmbeddingStore(3, config, dtype=torch.float64, device=device)
    ids = np.array([4, 9], dtype=np.int64)
    before, state = store.lookup(ids, 0, with_state=True)
    grads = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]], dtype=torch.float64, device=device)
    store.apply(ids, grads, np.array([1, 3]))
    after, state_after = store.lookup(ids, 1, with_state=True)
    if optimizer == "sgd":
        expected = before - 0.1 * grads
    else:
        acc = 0.5 + grads.pow(2).mean(1, keepdim=True)
        expected = before - 0.1 * grads / (acc.sqrt() + config.adagrad_eps)
        assert torch.allclose(state_after, acc)
    assert torch.allclose(after, expected)
    assert list(store.versions(np.array([4, 9, 123]))) == [1, 3, 0]


def test_evicted_row_comes_back_fresh_not_garbage(device: str) -> None:
    config = StoreConfig(optimizer="adagrad", evict_after=5, lr=0.5)
    store = EmbeddingStore(4, config, dtype=torch.float64, device=device)
    hot, cold = np.array([1], dtype=np.int64), np.array([2], dtype=np.int64)
    ones = lambda n: torch.ones(n, 4, dtype=torch.float64, device=device)  # noqa: E731
    store.lookup(np.array([1, 2]), step=0)
    store.apply(np.array([1, 2]), ones(2), np.array([1, 1]))
    for step in range(1, 10):
        store.lookup(hot, step)
        store.apply(hot, ones(1), np.array([1]))
        store.maintain(step)
    assert not store.contains(cold)[0] and store.contains(hot)[0]
    assert store.stats.evicted == 1
    # A new id takes the freed slot first; then the evicted one returns as a brand-new row.
    store.lookup(np.array([3]), 10)
    row, state = store.lookup(cold, 11, with_state=True)
    assert torch.equal(row.cpu(), torch.from_numpy(initial_rows(cold, 4, 0, config.init_scale)))
    assert float(state.sum()) == config.adagrad_init
    assert store.versions(cold)[0] == 0 and store.versions(hot)[0] == 10


def test_pinned_rows_survive_eviction_and_max_rows_caps_memory() -> None:
    store = EmbeddingStore(2, StoreConfig(evict_after=2, max_rows=50))
    store.pin(np.array([0], dtype=np.int64))
    store.lookup(np.array([0]), 0)
    for step in range(1, 40):
        store.lookup(np.arange(step * 10, step * 10 + 10, dtype=np.int64), step)
        store.maintain(step)
        assert len(store) <= 50
    assert store.contains(np.array([0]))[0]
    capped = EmbeddingStore(2, StoreConfig(max_rows=100))
    capped.lookup(np.arange(300, dtype=np.int64), 0)
    capped.lookup(np.arange(300, 350, dtype=np.int64), 1)
    capped.maintain(1)
    assert capped.low_water == 97 and len(capped) == 97  # down to 1/32 below the cap
    assert capped.contains(np.arange(300, 350)).all()  # the recently used stay


def test_a_capped_store_takes_at_most_32_bytes_a_row_beyond_the_row_and_its_state() -> None:
    # Issue 46: dim 16 and row-wise Adagrad (68 bytes of row and state). The slots grow by
    # half, but never more than 1/64 past the cap; the index holds int32 slots; the free list
    # only the slots given back. (Doubling, int64 slots and a free list of every slot took 67.)
    cap = 3200
    store = EmbeddingStore(16, StoreConfig(max_rows=cap))
    beyond = []
    for step in range(100):  # 40 new ids a step: under the 1/64 of slack
        store.lookup(np.arange(step * 40, step * 40 + 200, dtype=np.int64), step)
        if store.over_cap:
            store.maintain(step)
        assert len(store) <= cap
        if len(store) >= store.low_water:  # full (below it, the slots grow by half)
            beyond.append(store.nbytes / len(store) - 4 * (16 + 1))
    assert store.stats.evicted > 0 and beyond
    assert store._cap <= cap + cap // 64
    assert max(beyond) <= 32.0


def test_rows_released_from_the_pinned_set_count_as_used_then() -> None:
    # A replicated row's copies read it without touching its owner's store; when the copies
    # are dropped, the row must not be evicted for a last use the store never saw.
    store = EmbeddingStore(2, StoreConfig(evict_after=5))
    store.pin(np.array([1], dtype=np.int64))
    store.lookup(np.array([1, 2], dtype=np.int64), 0)  # both last used by the owner at step 0
    for step in range(1, 20):
        store.lookup(np.array([100 + step], dtype=np.int64), step)
    store.pin(np.zeros(0, dtype=np.int64))  # copies dropped at step 19
    store.maintain(20)
    assert store.contains(np.array([1]))[0]  # released at 19: used 1 step ago
    assert not store.contains(np.array([2]))[0]  # never pinned, unused for 20 steps
    store.maintain(25)
    assert not store.contains(np.array([1]))[0]  # and evicted once unused past the bound


def test_admission_threshold_counts_steps_not_reads() -> None:
    store = EmbeddingStore(2, StoreConfig(admit_after=3, evict_after=100), dtype=torch.float64)
    ids = np.array([42], dtype=np.int64)
    for _ in range(5):  # five reads in one step count once
        value, _ = store.lookup(ids, 0)
    assert not store.contains(ids)[0] and store.candidates == 1
    store.apply(ids, torch.ones(1, 2, dtype=torch.float64), np.array([1]))
    assert store.stats.dropped_updates == 1
    assert torch.equal(store.peek(ids), value)  # the initial value, untouched
    store.lookup(ids, 1)
    store.lookup(ids, 2)
    assert store.contains(ids)[0]
    store.maintain(3)
    assert store.candidates == 0


def test_row_optimizer_returns_the_change_it_made() -> None:
    opt = RowOptimizer(StoreConfig(optimizer="adagrad", lr=0.2))
    values = torch.zeros(2, 3, dtype=torch.float64)
    state = opt.initial_state(2, torch.float64, torch.device("cpu"))
    delta = opt.step(values, state, torch.arange(2), torch.ones(2, 3, dtype=torch.float64))
    assert torch.equal(values, delta)
    assert torch.allclose(values, torch.full((2, 3), -0.2, dtype=torch.float64))


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_row_optimizer_updates_only_its_rows_as_gathered_rows_would(optimizer: str) -> None:
    # In place on the table, the rows must come out bit for bit as the textbook update of the
    # gathered rows makes them, and the other rows untouched.
    cfg = StoreConfig(optimizer=optimizer, lr=0.05)
    opt = RowOptimizer(cfg)
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(10, 4, generator=gen)
    state = torch.rand(10, opt.state_width, generator=gen)
    index = torch.tensor([7, 2, 5])
    grads = torch.randn(3, 4, generator=gen)
    expect_v, expect_s = values.clone(), state.clone()
    if optimizer == "adagrad":
        expect_s[index] = state[index] + grads.pow(2).mean(dim=1, keepdim=True)
        change = grads * (-0.05) / (expect_s[index].sqrt() + cfg.adagrad_eps)
    else:
        change = grads * (-0.05)
    expect_v[index] = values[index] + change
    delta = opt.step(values, state, index, grads)
    assert torch.equal(values, expect_v) and torch.equal(state, expect_s)
    assert torch.equal(delta, change)
