"""Serve's table with a disk tier answers what the table with every row in memory answers
(issue 57): through deltas (upserts of newer and older versions), tombstones, a generation's
rollback (drop_newer), reads of rows on disk and unknown ids, with memory bounded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetgmp.trainer.serving.table import ServingTable

DIM = 5


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_table_with_a_tier_answers_as_one_in_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    plain = ServingTable(DIM, 3, 0.01)
    tiered = ServingTable(DIM, 3, 0.01, memory_rows=64, disk_dir=tmp_path)
    version = 0
    for step in range(300):
        ids = np.unique(rng.zipf(1.3, 40) % 2000).astype(np.int64)
        kind = rng.random()
        if kind < 0.6:  # a delta: mostly newer, sometimes a replayed older one
            version += 1
            v = version if rng.random() < 0.9 else max(version - 5, 0)
            values = rng.standard_normal((ids.size, DIM)).astype(np.float32)
            assert tiered.upsert(ids, values, v) == plain.upsert(ids, values, v)
        elif kind < 0.7:
            assert tiered.remove(ids, version) == plain.remove(ids, version)
        elif kind < 0.72:
            assert tiered.drop_newer(version - 3) == plain.drop_newer(version - 3)
        else:
            probe = np.concatenate([ids, [10**9 + step]])  # one id nobody holds
            _same(tiered.gather(probe), plain.gather(probe))
        np.testing.assert_array_equal(tiered.versions(ids), plain.versions(ids))
        assert tiered.memory_size <= tiered.memory_rows and len(tiered) == len(plain)
    assert tiered.tier is not None and len(tiered.tier) > 4 * tiered.memory_rows
    _same(tiered.export(), plain.export())
    tiered.close()
    assert not list(tmp_path.glob("tier-*"))


@pytest.mark.parametrize("kw", [{"memory_rows": 10}, {"disk_dir": "x"}, {"memory_rows": -1}])
def test_a_tier_needs_both_settings(kw: dict) -> None:
    with pytest.raises(ValueError, match="memory_rows > 0 and disk_dir"):
        ServingTable(DIM, 0, 0.01, **kw)


def test_serve_refuses_half_a_tier_and_a_directory_it_cannot_make(tmp_path: Path) -> None:
    from hetgmp.trainer.serving.config import ServeConfig

    with pytest.raises(ValueError, match="--memory-rows and --disk-dir go together"):
        ServeConfig(checkpoint_dir="c", memory_rows=1000)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot create it"):
        ServeConfig(checkpoint_dir="c", memory_rows=1000, disk_dir=str(tmp_path / "file" / "d"))
    ok = ServeConfig(checkpoint_dir="c", memory_rows=1000, disk_dir=str(tmp_path / "tier"))
    assert (tmp_path / "tier").is_dir() and ok.memory_rows == 1000
