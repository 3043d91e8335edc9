"""``hetgmp bench scale``: what every rank says it sent is what the others received, kind by
kind, at 2 and 8 in-process ranks, and the summary carries the rows and targets it promises."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.scale import build_parser, main, measure
from trainer.dist import KINDS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("ranks", [2, 8])
def test_bytes_sent_are_bytes_received_kind_by_kind(ranks: int) -> None:
    args: argparse.Namespace = build_parser().parse_args(
        ["--steps", "20", "--warmup-steps", "3", "--interval-steps", "5",
         "--batch-per-rank", "256"])
    row = measure(ranks, "graph", args)
    assert row["placements"] >= 1  # the online loop placed, migrated and broadcast
    sent, received = row["bytes_by_kind"], row["bytes_received_by_kind"]
    for kind in ("route", "request", "response", "gradient", "window", "placement", "migrate",
                 "dense", "control"):
        assert sent.get(kind, 0) > 0, kind
    # Senders count what they put on the wire, receivers what they took off it.
    assert {k: sent.get(k, 0) for k in KINDS} == {k: received.get(k, 0) for k in KINDS}
    assert row["samples"] == 20 * 256 * ranks
    assert set(row["messages_by_kind"]) >= {"dense", "control", "route"}
    assert 0 < row["control_and_placement_share"] < 1 and row["rank0_over_mean"] >= 1


def test_the_summary_has_a_row_per_configuration_and_the_targets(capsys) -> None:
    assert main(["--ranks", "2,4", "--steps", "16", "--warmup-steps", "3",
                 "--interval-steps", "5", "--batch-per-rank", "128"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "scale"
    assert [(r["ranks"], r["placement"]) for r in summary["rows"]] == [
        (2, "hash"), (2, "graph"), (4, "hash"), (4, "graph")]
    for row in summary["rows"]:
        assert {"ranks", "placement", "bytes_by_kind", "messages_by_kind", "rank0_over_mean",
                "repartition_seconds"} <= set(row)
    targets = summary["targets"]
    assert targets["ranks"] == 4 and "graph_over_hash_embedding_bytes" in targets
    with pytest.raises(SystemExit):
        main(["--ranks", "1"])
