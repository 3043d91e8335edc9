"""The embedding store against its numpy reference (``reference_store``): the same calls give
the same rows, decisions and counts."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from reference_store import ReferenceStore

from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig

CONFIGS = {
    "plain": StoreConfig(),
    "admission": StoreConfig(admit_after=3),
    "eviction": StoreConfig(evict_after=4),
    "cap": StoreConfig(max_rows=300, admit_after=2),
    "all, sgd": StoreConfig(optimizer="sgd", admit_after=2, evict_after=6, max_rows=250),
    # More candidates than max_rows: the candidates' own cap binds.
    "candidate cap": StoreConfig(max_rows=60, admit_after=6),
}


def _np(t: torch.Tensor | np.ndarray) -> np.ndarray:
    return t if isinstance(t, np.ndarray) else t.cpu().numpy()


def _same_rows(host: ReferenceStore, dev: EmbeddingStore) -> None:
    h_ids, h_values, h_state, h_versions = host.export()
    d_ids, d_values, d_state, d_versions = dev.export()
    np.testing.assert_array_equal(h_ids, _np(d_ids))
    torch.testing.assert_close(h_values, d_values.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(h_state, d_state.cpu(), rtol=0, atol=0)
    np.testing.assert_array_equal(h_versions, _np(d_versions))


def _queued_lookup(dev: EmbeddingStore, ids: np.ndarray, step: int, with_state: bool,
                   rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The lookup as the device step makes it on CUDA: lookup_padded of the ids padded with
    others, the padded array searched whole (the CPU's shortcut off)."""
    dev.cpu_shortcuts = False
    padded = np.concatenate([ids, rng.integers(0, 900, size=40)])
    t = torch.from_numpy(padded).to(dev.device)
    count = torch.tensor(ids.size, device=dev.device)
    got = dev.lookup_padded(t, count, step, with_state=with_state)
    np.testing.assert_array_equal(_np(got.ids), ids)
    return got.values, got.state


def _cases() -> list[object]:
    """Every config by lookup; by lookup_padded, the one that does everything in the fast lane
    and the others marked slow."""
    out: list[object] = []
    for name in CONFIGS:
        out.append(pytest.param(name, False, id=f"{name}-lookup"))
        marks = () if name == "all, sgd" else (pytest.mark.slow,)
        out.append(pytest.param(name, True, marks=marks, id=f"{name}-lookup_padded"))
    return out


@pytest.mark.parametrize(("name", "queued"), _cases())
def test_a_long_random_stream_gives_the_references_rows_and_decisions(name: str, queued: bool,
                                                                      device: str) -> None:
    config = CONFIGS[name]
    rng = np.random.default_rng(7)
    host = ReferenceStore(8, config, dtype=torch.float64, capacity=16)
    dev = EmbeddingStore(8, config, dtype=torch.float64, capacity=16, device=device)
    host.track_evictions()
    dev.track_evictions()
    for step in range(60):
        ids = np.unique(rng.zipf(1.4, size=120).astype(np.int64) % 900)
        if step % 10 == 3:
            pinned = np.concatenate([ids[:3], ids[-3:]])  # hot ids and cold (new) ones
            host.pin(pinned)
            dev.pin(pinned)
        with_state = step % 4 == 0
        hv, hs = host.lookup(ids, step, with_state=with_state)
        if queued:
            dv, ds = _queued_lookup(dev, ids, step, with_state, rng)
        else:
            dv, ds = dev.lookup(ids, step, with_state=with_state)
        torch.testing.assert_close(hv, dv.cpu(), rtol=0, atol=0)
        if with_state:
            assert hs is not None and ds is not None
            torch.testing.assert_close(hs, ds.cpu(), rtol=0, atol=0)
        grads = torch.from_numpy(rng.standard_normal((ids.size, 8)))
        counts = rng.integers(1, 4, size=ids.size).astype(np.int64)
        applied = host.apply(ids, grads, counts)
        np.testing.assert_array_equal(applied, _np(dev.apply(ids, grads, counts)))
        assert host.maintain(step) == dev.maintain(step)
        assert len(host) == len(dev) and host.candidates == dev.candidates
        if step % 15 == 14:
            moved = ids[::3]
            h_taken, d_taken = host.take(moved), dev.take(moved)
            np.testing.assert_array_equal(h_taken[0], _np(d_taken[0]))
            np.testing.assert_array_equal(h_taken[3], _np(d_taken[3]))
            host.put(*h_taken, step)
            dev.put(*d_taken, step)
        if step % 7 == 6:
            h_changed, d_changed = host.changes(), dev.changes()
            np.testing.assert_array_equal(h_changed[0], _np(d_changed[0]))
            torch.testing.assert_close(h_changed[1], d_changed[1].cpu(), rtol=0, atol=0)
    _same_rows(host, dev)
    np.testing.assert_array_equal(host.take_tombstones(), _np(dev.take_tombstones()))
    assert host.stats == dev.stats
    np.testing.assert_array_equal(host.versions(np.arange(900)), _np(dev.versions(np.arange(900))))
    np.testing.assert_array_equal(host.contains(np.arange(900)), _np(dev.contains(np.arange(900))))
    torch.testing.assert_close(host.peek(np.arange(900)), dev.peek(np.arange(900)).cpu(),
                               rtol=0, atol=0)


def test_the_stream_exercised_every_decision() -> None:
    # The parity test above is only as good as its stream: on it the cap, the eviction and the
    # admission all decide something, and rows are dropped and re-created.
    config = CONFIGS["all, sgd"]
    rng = np.random.default_rng(7)
    dev = EmbeddingStore(8, config, dtype=torch.float64, capacity=16)
    evicted = 0
    for step in range(60):
        ids = np.unique(rng.zipf(1.4, size=120).astype(np.int64) % 900)
        dev.lookup(ids, step)
        dev.apply(ids, torch.zeros((ids.size, 8), dtype=torch.float64), np.ones(ids.size, np.int64))
        evicted += dev.maintain(step)
    stats = dev.stats
    assert evicted > 0 and stats.evicted == evicted
    assert stats.not_admitted_reads > 0 and stats.dropped_updates > 0
    assert stats.created > len(dev)  # some rows were evicted and created again


def test_apply_of_ids_without_a_row_changes_no_row() -> None:
    dev = EmbeddingStore(4, StoreConfig(admit_after=5), dtype=torch.float64)
    dev.lookup(torch.tensor([1, 2, 3]), 0)  # none admitted yet
    assert len(dev) == 0
    dev.put(torch.tensor([9]), torch.ones((1, 4)), torch.zeros((1, 1)), torch.tensor([2]), 0)
    applied = dev.apply(torch.tensor([1, 9]), torch.ones((2, 4), dtype=torch.float64),
                        torch.tensor([1, 1]))
    assert applied.tolist() == [False, True]
    assert dev.stats.dropped_updates == 1
    ids, values, _, versions = dev.export()
    assert ids.tolist() == [9] and versions.tolist() == [3]
    assert bool((values < 1).all())  # one Adagrad step from 1.0


def test_rows_moved_between_a_lookup_and_its_apply_are_found_again() -> None:
    # apply reuses the lookup's slots for the same ids object; a row taken (and put back at a
    # new slot) in between must still get its update, as in the reference.
    config = StoreConfig()
    host = ReferenceStore(4, config, dtype=torch.float64, capacity=16)
    dev = EmbeddingStore(4, config, dtype=torch.float64, capacity=16)
    ids = np.arange(40, dtype=np.int64)
    for store in (host, dev):
        store.lookup(ids, 0)
        taken = store.take(ids[:20])
        store.lookup(np.arange(100, 130, dtype=np.int64), 0)  # reuses the freed slots
        store.put(*taken, 0)
        store.apply(ids, torch.ones((40, 4), dtype=torch.float64), np.ones(40, np.int64))
    _same_rows(host, dev)
    assert dev.stats.dropped_updates == 0


@pytest.mark.cuda
def test_on_cuda_apply_never_waits_and_a_lookup_of_held_ids_waits_once() -> None:
    # The sync counts the module docstring promises (not yet run on a GPU when written).
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import warnings

    dev = EmbeddingStore(64, StoreConfig(), device="cuda")
    ids = torch.arange(0, 200_000, 3, device="cuda")
    values, _ = dev.lookup(ids, 0)
    grads = torch.ones_like(values)
    counts = torch.ones(ids.numel(), dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()

    def syncs(call: Callable[[], object]) -> int:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                call()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    assert syncs(lambda: dev.apply(ids, grads, counts)) == 0
    assert syncs(lambda: dev.lookup(ids, 1)) == 1


@pytest.mark.parametrize("name", [pytest.param("eviction", marks=pytest.mark.slow), "all, sgd",
                                  pytest.param("candidate cap", marks=pytest.mark.slow)])
def test_maintain_waits_once(name: str) -> None:
    # Every eviction decision is queued; one readback of the counts sizes the compactions.
    from hetgmp.trainer.step import SyncCounter

    dev = EmbeddingStore(8, CONFIGS[name], dtype=torch.float64, capacity=16)
    dev.cpu_shortcuts = False
    rng = np.random.default_rng(7)
    evicted = 0
    for step in range(40):
        ids = torch.from_numpy(np.unique(rng.zipf(1.4, size=120).astype(np.int64) % 900))
        dev.lookup(ids, step)
        dev.apply(ids, torch.zeros((ids.numel(), 8), dtype=torch.float64),
                  torch.ones(ids.numel(), dtype=torch.int64))
        with SyncCounter("cpu") as waits:
            evicted += dev.maintain(step)
        assert waits.count == 1, (step, dict(waits.seen))
    if name == "candidate cap":  # rows stay under the cap; the candidates were cut to it
        assert dev.candidates == CONFIGS[name].max_rows
    else:
        assert evicted > 0
