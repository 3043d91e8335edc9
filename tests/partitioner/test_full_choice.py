"""From ``compare_from`` workers the full partition also runs HET-GMP's algorithm and keeps the
placement that fetches fewer rows (issue 55: METIS falls behind it on community shapes from 16
workers, and a METIS result gone wrong, like the collapse of item 1, is caught the same way)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import hetgmp.partitioner.full as partitioner_full
from bench.matrices import recipe
from hetgmp.partitioner import FullPartitioner, PartitionConfig, WindowGraph, routed_remote_rows
from hetgmp.partitioner.hetgmp import paper_partition


@pytest.fixture(scope="module")
def window() -> WindowGraph:
    ids, _ = recipe(12_000, fields=8, communities=24, hot=12)
    return WindowGraph.from_dense(ids)


def _config(workers: int, **kw: object) -> PartitionConfig:
    return PartitionConfig(num_workers=workers, global_batch=2048, min_count=1, **kw)


def _rows(window: WindowGraph, placement, config: PartitionConfig) -> int:
    return routed_remote_rows((window.indptr, window.indices), placement, config.global_batch)


def test_from_16_workers_the_placement_that_fetches_fewer_rows_is_kept(window) -> None:
    config = _config(16)
    full = FullPartitioner(config)
    kept = full.partition(window, None)
    choice = full.last_choice
    assert choice is not None and choice["samples_judged"] == window.num_samples
    best = min(choice["rows_metis"], choice["rows_hetgmp"])
    assert _rows(window, kept, config) == best
    theirs = paper_partition(window, config).placement
    assert _rows(window, theirs, config) == choice["rows_hetgmp"]
    # Below the threshold (or with it off) METIS alone, as before.
    for cfg in (_config(8), replace(config, compare_from=0)):
        below = FullPartitioner(cfg)
        below.partition(window, None)
        assert below.last_choice is None


def test_a_metis_partition_gone_wrong_is_not_kept(window, monkeypatch) -> None:
    # Owners drawn at random, as a METIS that saw one community alone gave in effect: the
    # comparison keeps HET-GMP's placement.
    real = partitioner_full.metis_owners

    def scrambled(*args: object, **kwargs: object) -> object:
        cw, sample_part, id_part, in_graph = real(*args, **kwargs)  # type: ignore[arg-type]
        rng = np.random.default_rng(0)
        shuffled = np.where(id_part >= 0, rng.integers(0, 16, id_part.size), id_part)
        return cw, sample_part, shuffled, in_graph

    monkeypatch.setattr(partitioner_full, "metis_owners", scrambled)
    full = FullPartitioner(_config(16))
    full.partition(window, None)
    assert full.last_choice is not None and full.last_choice["kept"] == "hetgmp"
    assert full.last_choice["rows_hetgmp"] < 0.8 * full.last_choice["rows_metis"]
