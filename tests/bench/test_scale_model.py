"""The GPU projection of the scale benchmark's counts (bench/scale_model.py), by hand."""

from __future__ import annotations

import pytest

from bench.scale_model import Cluster, project, render

ROWS = [{"ranks": 2, "placement": "hash",
         "bytes_per_sample_by_kind": {"request": 10.0, "response": 40.0, "gradient": 40.0,
                                      "dense": 5.0, "control": 1.0},
         "messages_by_kind": {"request": 20, "control": 20}}]
SMALL = Cluster(gpus_per_node=2, nvlink_gb_s=1.0, ib_gb_s=1.0, round_us=10.0,
                compute_samples_s=1e6, dim=16, dense_params=0, batch_per_gpu=512,
                bench_dim=8, bench_batch=512)


def test_counts_are_carried_to_more_ranks_and_split_between_the_links() -> None:
    p = project(ROWS, 4, "hash", 10, SMALL)
    # From 2 to 4 ranks a kind grows as (N - 1) / N: x1.5; rows and gradients with the row
    # width: x2 more; the control vector as N - 1: x3. Of a rank's all-to-all bytes 2/3 leave
    # its node of 2: 15 + 120 + 120 + 3 = 258 bytes a sample, 86 in the node, 172 out.
    assert p["bytes_per_sample"] == {"nvlink": 86, "infiniband": 172}
    us = p["us_per_sample"]
    assert us["compute"] == pytest.approx(1.0)
    assert us["infiniband"] == pytest.approx(0.172)
    assert us["latency"] == pytest.approx(2 * 10 / 512, abs=1e-4)  # 2 rounds a step
    assert p["samples_s_per_gpu"] == round(1e6 / (1.0 + 0.172 + 2 * 10 / 512))
    assert p["saturates_first"] == "compute"
    # One node: nothing crosses InfiniBand.
    assert project(ROWS, 2, "hash", 10, SMALL)["bytes_per_sample"]["infiniband"] == 0


def test_a_slow_link_saturates_first_and_the_table_says_so() -> None:
    from dataclasses import replace

    slow = replace(SMALL, ib_gb_s=0.0001)
    p = project(ROWS, 4, "hash", 10, slow)
    assert p["saturates_first"] == "infiniband"
    assert p["samples_s_per_gpu"] < 1000
    table = render([p], 2.0)
    assert "infiniband" in table.splitlines()[-1]
    assert f"{2.0 * p['samples_s'] / 1e6:,.0f}M" in table  # the interval a 2 s pass needs
