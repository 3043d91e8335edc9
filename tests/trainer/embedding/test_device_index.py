"""The device id index (sorted runs) against a Python dict (on CPU, and on CUDA where there is
one: the ``device`` fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy.typing import ArrayLike

from hetgmp.trainer.embedding.device_index import DeviceIndex

TOP = 2**63 - 1


def _t(values: ArrayLike, device: str) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64), device=device)


def _check(index: DeviceIndex, ref: dict[int, int], queries: np.ndarray, device: str) -> None:
    got = index.find(_t(queries, device)).cpu().numpy()
    want = np.array([ref.get(int(q), -1) for q in queries], dtype=np.int64)
    assert np.array_equal(got, want)
    assert index.size == len(ref)


def _items(index: DeviceIndex) -> dict[int, int]:
    keys, vals = index.items()
    pairs = dict(zip(keys.cpu().tolist(), vals.cpu().tolist()))
    assert len(pairs) == keys.numel()  # no id twice
    return pairs


def test_agrees_with_a_dict_under_long_random_sequences(device: str) -> None:
    rng = np.random.default_rng(7)
    index = DeviceIndex(device=device)
    ref: dict[int, int] = {}
    next_value = peak = 0
    for step in range(250):
        n = int(rng.integers(0, 400))
        # Random 63-bit ids, small ids (0 included), the largest ones, and ids equal in their
        # low 32 bits (the half that decides small tables' groups before mixing).
        pool = np.concatenate([rng.integers(0, TOP, n, dtype=np.int64), rng.integers(0, 64, 8),
                               np.array([0, TOP, TOP - 1]),
                               (rng.integers(0, 2**31, 8) << 32) | 12345])
        new = np.array([i for i in dict.fromkeys(pool.tolist()) if i not in ref][:n],
                       dtype=np.int64)
        values = np.arange(next_value, next_value + new.size)
        next_value += new.size
        index.insert(_t(new, device), _t(values, device))
        ref.update(zip(new.tolist(), values.tolist()))
        present = np.array(list(ref), dtype=np.int64)
        if present.size and rng.random() < 0.3:  # delete a random share, sometimes most
            share = rng.choice([0.05, 0.3, 0.9], p=[0.6, 0.3, 0.1])
            gone = rng.choice(present, size=int(share * present.size), replace=False)
            index.remove(_t(gone, device))
            for i in gone.tolist():
                del ref[i]
            present = np.array(list(ref), dtype=np.int64)
        picks = rng.choice(present, 200) if present.size else np.zeros(0, np.int64)
        queries = np.concatenate([picks, picks[:20], rng.integers(0, TOP, 100, dtype=np.int64),
                                  np.array([0, TOP])])  # repeats, absent ids, the extremes
        _check(index, ref, rng.permutation(queries), device)
        peak = max(peak, len(ref))
        if step % 50 == 49:
            assert _items(index) == ref
    assert peak > 2000  # the sequence did grow the table well past the buffer's size


def test_small_values_are_held_in_four_bytes_and_answered_as_int64(device: str) -> None:
    small, wide = DeviceIndex(device=device, small_values=True), DeviceIndex(device=device)
    ids = _t(np.random.default_rng(3).integers(0, TOP, 5000, dtype=np.int64), device)
    ids = torch.unique(ids)
    slots = torch.randperm(ids.numel(), device=device) + (2**31 - 1 - ids.numel())
    for index in (small, wide):
        index.insert(ids[:3000], slots[:3000])
        index.insert(ids[3000:], slots[3000:])
        index.remove(ids[:10])
    queries = torch.cat([ids, ids[:100] + 1])
    assert small.find(queries).dtype == torch.int64
    assert torch.equal(small.find(queries), wide.find(queries))
    assert _items(small) == _items(wide)
    assert small.nbytes * 4 == wide.nbytes * 3  # 12 bytes an entry against 16


def test_deleted_entries_are_dropped_and_the_runs_do_not_grow(device: str) -> None:
    rng = np.random.default_rng(3)
    ids = np.unique(rng.integers(0, TOP, 40_000, dtype=np.int64))
    rng.shuffle(ids)
    live, spare = list(ids[:4000]), list(ids[4000:])
    index = DeviceIndex(device=device)
    empty = index.nbytes
    index.insert(_t(live, device), _t(live, device) % 1000)
    assert index.nbytes == empty + 16 * len(live)  # exactly its entries (a run, 2 x 8 B)
    for _ in range(10):  # 30,000 inserts into a table sized for 4,000 entries
        rng.shuffle(live)
        gone, live = live[:3000], live[3000:]
        index.remove(_t(gone, device))
        new, spare = spare[:3000], spare[3000:]
        index.insert(_t(new, device), _t(new, device) % 1000)
        live += new
    ref = {i: i % 1000 for i in live}
    _check(index, ref, np.concatenate([live[:500], gone[:500]]), device)
    # Tombstones until a compaction: bounded, not kept forever.
    assert index.nbytes <= 3 * 16 * index.size


def test_removals_alone_give_the_sorted_runs_memory_back(device: str) -> None:
    ids = torch.arange(0, 40_000, 2, device=device) * 7919
    index = DeviceIndex(device=device)
    index.rebuild(ids, ids)
    full = index.nbytes
    for chunk in ids[:19_000].split(1000):  # no insert comes to trigger a compaction
        index.remove(chunk)
    assert index.nbytes <= 0.2 * full
    assert index.find(ids[18_990:19_010]).tolist() == [-1] * 10 + ids[19_000:19_010].tolist()


def test_extreme_ids_and_empty_batches(device: str) -> None:
    index = DeviceIndex(device=device)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    assert index.find(torch.zeros((3, 0), dtype=torch.int64, device=device)).shape == (3, 0)
    assert index.find(_t([0, TOP], device)).tolist() == [-1, -1]  # nothing stored yet
    index.insert(empty, empty)
    index.remove(empty)
    extremes = [0, 1, 2**62, TOP - 1, TOP]
    index.insert(_t(extremes, device), _t([10, 11, 12, 13, 14], device))
    grid = _t([[TOP, 0, 5], [TOP - 1, 2**62, 1]], device)
    assert index.find(grid).tolist() == [[14, 10, -1], [13, 12, 11]]  # shape kept, 5 absent
    assert index.find(empty).shape == (0,)
    index.remove(_t([TOP, 0], device))
    assert index.find(_t([TOP, 0, 1], device)).tolist() == [-1, -1, 11]
    index.insert(_t([TOP], device), _t([99], device))
    assert index.find(_t([TOP, TOP], device)).tolist() == [99, 99]
    assert index.size == 4
    assert _items(index) == {1: 11, 2**62: 12, TOP - 1: 13, TOP: 99}


def test_items_round_trip_and_rebuild(device: str) -> None:
    rng = np.random.default_rng(11)
    ids = np.unique(rng.integers(0, TOP, 20_000, dtype=np.int64))
    index = DeviceIndex(device=device)
    index.insert(_t(ids, device), _t(np.arange(ids.size), device))
    index.remove(_t(ids[::3], device))
    ref = {int(i): n for n, i in enumerate(ids) if n % 3}
    assert _items(index) == ref
    copy = DeviceIndex(device=device)
    copy.rebuild(*index.items())
    _check(copy, ref, ids, device)
    big = index.nbytes
    keep = ids[:100]
    index.rebuild(_t(keep, device), _t(np.arange(100) * 2, device))
    _check(index, {int(i): 2 * n for n, i in enumerate(keep)}, ids[:1000], device)
    assert index.nbytes < big / 10  # sized to what it holds now
    index.insert(_t(ids[100:200], device), _t(np.arange(100), device))  # and usable after
    assert index.size == 200


def test_arguments_are_checked() -> None:
    index = DeviceIndex()
    with pytest.raises(ValueError, match="same number"):
        index.insert(torch.arange(3), torch.arange(2))
    assert index.size == 0
