"""Factories for the partitioner tests: hand-made graphs and a tiny community stream."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from hetgmp.partitioner import PartitionConfig, Placement, WindowGraph


def _community_samples(rng: np.random.Generator, community_ids: list[np.ndarray],
                       sizes: list[int], per_sample: int) -> np.ndarray:
    rows = []
    for ids, size in zip(community_ids, sizes):
        for _ in range(size):
            rows.append(rng.choice(ids, size=per_sample, replace=False))
    return np.array(rows, dtype=np.int64)


@pytest.fixture
def two_communities() -> WindowGraph:
    """200 samples: the first 100 use 4 of ids 1..12, the last 100 use 4 of ids 101..112."""
    rng = np.random.default_rng(7)
    ids = [np.arange(1, 13), np.arange(101, 113)]
    return WindowGraph.from_dense(_community_samples(rng, ids, [100, 100], 4))


@pytest.fixture
def make_stream() -> Callable[..., np.ndarray]:
    """A miniature of the synthetic stream: segments with skewed popularity and hot sets.

    ``make_stream(n, seed=0, segments=8, fields=6, hot=6, drift_at=None)`` returns int64
    ``[n, fields]`` ids; field f's ids are ``f * 1_000_000 + value``. Each sample picks a segment
    (Zipf 1.0); each field takes a value from the segment's hot set with probability 0.8, else a
    global Zipf(1.1) value. Past ``drift_at`` the first (most popular) half of the segments get new
    hot sets and the popularity order rotates by one.
    """

    def make(n: int, seed: int = 0, segments: int = 8, fields: int = 6, hot: int = 6,
             drift_at: int | None = None) -> np.ndarray:
        rng = np.random.default_rng(seed)
        vocab = 2000
        hot_sets = rng.integers(0, vocab, size=(2, segments, fields, hot))
        hot_sets[1, segments // 2:] = hot_sets[0, segments // 2:]
        popularity = 1.0 / np.arange(1, segments + 1)
        popularity /= popularity.sum()
        zipf = 1.0 / np.arange(1, vocab + 1) ** 1.1
        zipf /= zipf.sum()
        out = np.empty((n, fields), dtype=np.int64)
        for i0 in range(0, n, 1000):
            m = min(1000, n - i0)
            epoch = np.zeros(m, dtype=np.int64)
            if drift_at is not None:
                epoch = (np.arange(i0, i0 + m) >= drift_at).astype(np.int64)
            seg = rng.choice(segments, size=m, p=popularity)
            seg = np.where(epoch == 1, (seg + 1) % segments, seg)
            slot = rng.integers(0, hot, size=(m, fields))
            hot_value = hot_sets[epoch[:, None], seg[:, None], np.arange(fields), slot]
            glob = rng.choice(vocab, size=(m, fields), p=zipf)
            value = np.where(rng.random((m, fields)) < 0.8, hot_value, glob)
            out[i0:i0 + m] = np.arange(fields) * 1_000_000 + value
        return out

    return make


@pytest.fixture
def config() -> Callable[..., PartitionConfig]:
    """``config(num_workers, **overrides)`` with a small global batch suited to tiny windows."""

    def make(num_workers: int = 2, **overrides: object) -> PartitionConfig:
        values: dict[str, object] = {"num_workers": num_workers, "global_batch": 64}
        values.update(overrides)
        return PartitionConfig(**values)  # type: ignore[arg-type]

    return make


@pytest.fixture
def random_placement() -> Callable[..., Placement]:
    """``random_placement(seed, num_workers=4, version=0)``: explicit ids and replicas at random."""

    def make(seed: int, num_workers: int = 4, version: int = 0) -> Placement:
        rng = np.random.default_rng(seed)
        ids = np.unique(rng.integers(0, 500, size=120))
        owners = rng.integers(0, num_workers, size=ids.size).astype(np.int32)
        base = Placement(version, num_workers, ids, owners)
        replicas = []
        for worker in range(num_workers):
            pool = np.unique(rng.integers(0, 500, size=30))
            replicas.append(pool[base.owner_of(pool) != worker])
        return Placement(version, num_workers, ids, owners, tuple(replicas))

    return make
