"""``hetgmp bench scale``: what every rank says it sent is what the others received, kind by
kind, at 2 and 8 in-process ranks, and the summary carries the rows and targets it promises."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from bench.scale import build_parser, job_of, main, measure
from hetgmp.partitioner import Placement
from hetgmp.trainer.dist import KINDS

pytestmark = pytest.mark.slow


# Rows of 8: what is counted does not depend on the width, and the run is faster.
ARGS = ["--steps", "20", "--warmup-steps", "3", "--interval-steps", "5", "--batch-per-rank",
        "256", "--dim", "8"]


def _conserved(row: dict) -> None:
    sent, received = row["bytes_by_kind"], row["bytes_received_by_kind"]
    # Senders count what they put on the wire, receivers what they took off it.
    assert {k: sent.get(k, 0) for k in KINDS} == {k: received.get(k, 0) for k in KINDS}


@pytest.mark.parametrize("ranks", [8])  # 2 ranks: the scheduled test below
def test_bytes_sent_are_bytes_received_kind_by_kind(ranks: int) -> None:
    args: argparse.Namespace = build_parser().parse_args(ARGS)
    row = measure(ranks, "graph", args)
    for kind in ("route", "request", "response", "gradient", "window", "dense", "control"):
        assert row["bytes_by_kind"].get(kind, 0) > 0, kind
    _conserved(row)
    assert row["samples"] == 20 * 256 * ranks
    assert set(row["messages_by_kind"]) >= {"dense", "control", "route"}
    assert 0 < row["control_and_placement_share"] < 1 and row["rank0_over_mean"] >= 1


@pytest.mark.parametrize("ranks", [2, 8])
def test_placements_sent_as_differences_are_counted_on_both_sides(ranks: int) -> None:
    # A schedule places at fixed steps, through the same broadcast a computed placement takes
    # (the online run above places when its partitioner process is done, which a loaded
    # machine delays past the run's end).
    from dataclasses import replace

    from hetgmp.streaming import SyntheticStream

    args: argparse.Namespace = build_parser().parse_args(ARGS)
    job = job_of(ranks, "hash", args)
    ids = np.unique(SyntheticStream(job.source.config).feature_ids(0, 256 * ranks * 4))
    owners = np.random.default_rng(3).integers(0, ranks, ids.size)
    first = Placement(1, ranks, ids, owners, tuple(ids[:0] for _ in range(ranks)))
    second = Placement(2, ranks, ids[::2], owners[::2], tuple(ids[:0] for _ in range(ranks)))
    row = measure(ranks, "hash", args, replace(job, online=replace(
        job.online, repartition_interval="0"), schedule=((4, first), (9, second))))
    assert row["placements"] == 2
    assert row["bytes_by_kind"]["placement"] > 0 and row["bytes_by_kind"]["migrate"] > 0
    _conserved(row)
    # The first table goes whole (from hash: 8 bytes an id and 2 an owner, four owners to a
    # word), then only the ids the second releases (8 bytes each), not the second table; each
    # after its counts (two lists and each worker's replicas added and dropped). By the
    # relay: rank 0 sends each other rank its slice, then each rank its slice to every other.
    words = [2 + 2 * ranks + ids.size + -(-ids.size // 4), 2 + 2 * ranks + ids[1::2].size]
    relayed = sum(w - w // ranks + (ranks - 1) * w for w in words)
    assert row["bytes_by_kind"]["placement"] == 8 * relayed


def test_the_summary_has_a_row_per_configuration_and_the_targets(capsys) -> None:
    assert main(["--ranks", "2,3", "--steps", "12", "--warmup-steps", "3",
                 "--interval-steps", "5", "--batch-per-rank", "64", "--dim", "8"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "scale" and summary["dim"] == 8
    # The projection to GPUs: a row per GPU count and placement.
    assert [(p["ranks"], p["placement"]) for p in summary["projection"]] == [
        (g, p) for g in (8, 16, 32, 64, 128) for p in ("hash", "graph")]
    assert [(r["ranks"], r["placement"]) for r in summary["rows"]] == [
        (2, "hash"), (2, "graph"), (3, "hash"), (3, "graph")]
    for row in summary["rows"]:
        assert {"ranks", "placement", "bytes_by_kind", "messages_by_kind", "rank0_over_mean",
                "repartition_seconds"} <= set(row)
    targets = summary["targets"]
    assert targets["ranks"] == 3 and "graph_over_hash_embedding_bytes" in targets
    with pytest.raises(SystemExit):
        main(["--ranks", "1"])
