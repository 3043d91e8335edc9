"""The full partition's bounded METIS input: a sample of the window, then an alternating pass."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import hetgmp.partitioner.full as partitioner_full
from hetgmp.partitioner import (
    FullPartitioner,
    IncrementalPartitioner,
    PartitionConfig,
    Placement,
    WindowGraph,
    remote_rows_per_sample,
    route,
)
from hetgmp.partitioner.graph import compact, dense_numbering, renumber
from hetgmp.partitioner.greedy import alternate


@pytest.fixture
def sampled_fractions(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The fractions of the samples METIS was given, one per sampled partition."""
    seen: list[float] = []
    real = partitioner_full._sampled_graph

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(float(args[2]))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(partitioner_full, "_sampled_graph", spy)
    return seen


def _remote(ids: np.ndarray, placement: Placement, batch: int) -> float:
    total = 0.0
    for lo in range(0, ids.shape[0], batch):
        part = ids[lo:lo + batch]
        total += remote_rows_per_sample(part, route(part, placement), placement) * part.shape[0]
    return total / ids.shape[0]


def test_dense_numbering_is_np_unique() -> None:
    rng = np.random.default_rng(3)
    for size in (0, 1, 7, 5000):
        values = rng.integers(-2**62, 2**62, size=size) % 101 * 2**40 - 9
        ids, inverse = dense_numbering(values)
        want_ids, want_inverse = np.unique(values, return_inverse=True)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(inverse, want_inverse.ravel())


def test_two_communities_split_cleanly_from_a_sample(
        two_communities: WindowGraph, config: Callable[..., PartitionConfig],
        sampled_fractions: list[float]) -> None:
    # 800 edges; METIS sees about 300 of them (a sample of ~75 samples), the pass places the rest.
    placement = FullPartitioner(config(2, metis_edges=300)).partition(two_communities, None)
    assert len(sampled_fractions) == 1 and sampled_fractions[0] < 0.5
    batch = two_communities.indices.reshape(200, 4)
    assert remote_rows_per_sample(batch, route(batch, placement), placement) == 0.0
    assert placement.owner_of(np.array([1]))[0] != placement.owner_of(np.array([101]))[0]


def test_a_star_hub_is_replicated(config: Callable[..., PartitionConfig],
                                  sampled_fractions: list[float]) -> None:
    # Two communities that share one id (the hub, 999) in every sample: the hub is owned on one
    # side and copied to the other, whose samples then need no remote row either.
    rng = np.random.default_rng(5)
    left = np.array([np.r_[rng.choice(np.arange(1, 13), 3, replace=False), 999]
                     for _ in range(100)])
    right = np.array([np.r_[rng.choice(np.arange(101, 113), 3, replace=False), 999]
                      for _ in range(100)])
    ids = np.concatenate([left, right]).astype(np.int64)
    cfg = config(2, metis_edges=300, replica_fraction=0.2)
    placement = FullPartitioner(cfg).partition(WindowGraph.from_dense(ids), None)
    assert len(sampled_fractions) == 1
    owner = int(placement.owner_of(np.array([999]))[0])
    assert 999 in set(placement.replicas[1 - owner].tolist())
    assert remote_rows_per_sample(ids, route(ids, placement), placement) == 0.0


@pytest.mark.parametrize("workers", [2, 4])
def test_sampled_partition_is_balanced_and_near_metis_on_all(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig],
        sampled_fractions: list[float], workers: int) -> None:
    ids = make_stream(12_000, seed=4)
    window = WindowGraph.from_dense(ids)
    whole = FullPartitioner(config(workers, global_batch=1024, metis_edges=0))
    sampled = FullPartitioner(config(workers, global_batch=1024, metis_edges=20_000))
    a, b = whole.partition(window, None), sampled.partition(window, None)
    assert len(sampled_fractions) == 1 and sampled_fractions[0] < 0.6
    cw = compact(window)
    rows = np.bincount(b.owner_of(cw.ids[cw.degree >= 2]), minlength=workers)
    assert rows.max() <= max(np.ceil(rows.mean()), np.floor(1.05 * rows.mean()))
    hashed = _remote(ids, Placement.hash(workers), 1024)
    full_rate, sampled_rate = _remote(ids, a, 1024), _remote(ids, b, 1024)
    assert sampled_rate <= 0.6 * hashed, (sampled_rate, full_rate, hashed)
    assert sampled_rate <= 1.15 * full_rate, (sampled_rate, full_rate, hashed)


def test_alternate_keeps_fixed_rows_and_balances_samples(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig]) -> None:
    cw = compact(WindowGraph.from_dense(make_stream(3000, seed=6)))
    cfg = config(3, global_batch=300)
    start = (cw.ids % 3).astype(np.int32)
    placeable = cw.degree >= 5
    owner, worker, counts = alternate(cw, start, placeable, cfg, passes=2)
    np.testing.assert_array_equal(counts.sum(axis=1), cw.degree)
    np.testing.assert_array_equal(np.argmax(counts, axis=1)[placeable], owner[placeable])
    np.testing.assert_array_equal(owner[~placeable], start[~placeable])
    assert np.bincount(worker, minlength=3).max() <= np.floor(1.05 * 1000)


def test_an_incremental_pass_never_raises_remote_rows_on_its_own_window(
        make_stream: Callable[..., np.ndarray], config: Callable[..., PartitionConfig]) -> None:
    ids = make_stream(8000, seed=8, drift_at=4000)
    cfg = config(4, global_batch=512)
    first = FullPartitioner(cfg).partition(WindowGraph.from_dense(ids[:4000], start=0), None)
    window = WindowGraph.from_dense(ids[2000:8000], start=2000)
    refiner = IncrementalPartitioner(cfg, recent_fraction=1.0)
    before = _remote(ids[2000:8000], first, 512)
    after = _remote(ids[2000:8000], refiner.partition(window, first), 512)
    assert after <= before


@pytest.mark.slow
def test_the_cap_keeps_the_communities_of_a_dense_numbered_matrix(
        sampled_fractions: list[float]) -> None:
    # Issue 45, item 1: the segments recipe with ids numbered densely field by field and the
    # records shuffled. Reported: capped 33-34 points below uncapped (500k x 26, METIS on 8.5%
    # of the samples). Here 60k x 26 with the cap at the same share; METIS's seed moves either
    # figure by 2-5 points, so the two are compared over seeds (measured: capped 67.1 / 63.8%,
    # uncapped 61.3 / 61.3% below hash at seeds 0 / 1).
    from bench.records import dense_records
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=0, drift_every=10**9))
    records, _ = dense_records(stream, stream.take(0, 60_000), 0)
    ids = records.values.reshape(len(records), -1)
    batch, n = 4096, 4
    hashed = Placement.hash(n)
    hash_rate = sum(remote_rows_per_sample(part, np.arange(len(part)) * n // len(part), hashed)
                    * len(part) for part in np.array_split(ids, range(batch, len(ids), batch))
                    ) / len(ids)
    reduction: dict[int, list[float]] = {83_000: [], 0: []}
    for seed in (0, 1):
        for cap in reduction:
            config = PartitionConfig(num_workers=n, global_batch=batch, min_count=1,
                                     replica_basis="touched", metis_edges=cap, seed=seed)
            placement = FullPartitioner(config).partition(WindowGraph.from_dense(ids), None)
            reduction[cap].append(1.0 - _remote(ids, placement, batch) / hash_rate)
    assert len(sampled_fractions) == 2 and max(sampled_fractions) < 0.1  # the cap bound
    assert np.mean(reduction[83_000]) >= np.mean(reduction[0]) - 0.02, reduction
    assert min(reduction[0]) > 0.5  # the communities are there to keep


# Run in a fresh process: the window is loaded from disk, the peak reset, then one full
# partition and two incremental passes over every sample (the offline protocol's passes, the
# largest a pass gets); prints the peak's rise over the resident size before the partition, and
# the window's bytes, in MiB.
_PEAK_CHILD = """
import sys
from pathlib import Path
import numpy as np
from hetgmp.partitioner import FullPartitioner, IncrementalPartitioner, PartitionConfig, WindowGraph

status = Path("/proc/self/status")
def field(name):
    return next(int(l.split()[1]) / 1024 for l in status.read_text().splitlines()
                if l.startswith(name))
ids = np.load(sys.argv[1])
window = WindowGraph.from_dense(ids)
import pymetis  # its import is not the partition's
Path("/proc/self/clear_refs").write_text("5")
before = field("VmRSS")
config = PartitionConfig(num_workers=4, min_count=1, global_batch=2048, metis_edges=300_000)
placement = FullPartitioner(config).partition(window, None)
refiner = IncrementalPartitioner(config, recent_fraction=1.0, recent_cap=None)
for _ in range(2):
    placement = refiner.partition(window, placement)
print(field("VmHWM") - before, ids.nbytes / 2**20)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_of_a_full_partition_and_its_passes_is_bounded(tmp_path: Path) -> None:
    # 120k x 26 of the synthetic stream (24 MB of ids), METIS capped at 300k edges: the peak
    # rise of a full partition and two passes over all its samples stays under 7x the
    # window's bytes. Measured with three passes: 6.0x (143 MB; the full partition alone 95 MB, most of it the
    # first use of numpy's, Arrow's and METIS's memory). Before the passes counted their
    # entries in slices, capped the group balance's METIS input and handed freed memory back
    # between steps: 8.5x (202 MB); at 200k x 26, 4.2x against 8.3x.
    import subprocess

    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=0, drift_every=10**9))
    path = tmp_path / "ids.npy"
    np.save(path, stream.block_ids(stream.take(0, 120_000)))
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("the kernel does not let this process reset its peak RSS")
    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(path)], capture_output=True,
                          text=True, timeout=300, check=True)
    rise, window_mb = map(float, done.stdout.split())
    assert rise <= 7 * window_mb, (rise, window_mb)


@pytest.mark.parametrize("shape", [pytest.param("segments", marks=pytest.mark.slow), "user_item"])
def test_full_and_incremental_stay_balanced_on_both_shapes(shape: str) -> None:
    # Rows owned (over the window's distinct ids: an incremental pass balances them all, the
    # ones it does not look at weighing where they are) and each step's samples within
    # 1 + epsilon of the mean,
    # on the planted-community stream and on the user-item one, after a full partition (METIS
    # on a sample: the window has more edges than the cap) and an incremental pass after drift.
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=2, shape=shape,  # type: ignore[arg-type]
                                             drift_every=15_000))
    ids = stream.block_ids(stream.take(0, 30_000))
    workers, batch = 4, 2048
    cfg = PartitionConfig(num_workers=workers, global_batch=batch, metis_edges=60_000)
    refiner = IncrementalPartitioner(cfg)
    first = refiner.partition(WindowGraph.from_dense(ids[:20_000], start=0), None)
    window = WindowGraph.from_dense(ids[10_000:30_000], start=10_000)
    second = refiner.partition(window, first)
    assert refiner.last_pass is not None
    cap = 1.05 * batch / workers
    for placement, records in ((first, ids[:20_000]), (second, ids[10_000:30_000])):
        rows = np.bincount(placement.owner_of(np.unique(records)), minlength=workers)
        assert rows.max() <= np.ceil(1.05 * rows.mean()), rows
        for lo in range(0, records.shape[0], batch):
            part = records[lo:lo + batch]
            loads = np.bincount(route(part, placement), minlength=workers)
            assert loads.max() <= np.ceil(cap * part.shape[0] / batch), loads


def test_compact_against_known_ids_numbers_the_window_the_same(
        make_stream: Callable[..., np.ndarray]) -> None:
    window = WindowGraph.from_dense(make_stream(3000, seed=9))
    first = compact(window)
    again = compact(window, first.ids)
    for name in ("ids", "entry_id", "entry_sample", "degree", "sample_weight"):
        np.testing.assert_array_equal(getattr(again, name), getattr(first, name), err_msg=name)
    assert again.entry_id.dtype == first.entry_id.dtype
    with pytest.raises(ValueError, match="not among the ids"):
        renumber(window.indices, first.ids[1:])
