"""The held-out protocol produces a file's first 80% and then its last 20%, in two produce calls
(one process, or two ``hetgmp produce`` commands): the order a rank hands the records out in
(append time, offset, partition: :mod:`hetgmp.trainer.sources.order`) is the file's, across the two.

Each call used to start its round robin at partition 0: after 63 messages on 4 partitions
(16, 16, 16, 15) the second call's fourth message (partition 3, offset 15) sorted before its
first (partition 0, offset 16) whenever both were appended in one millisecond."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetgmp.runtime import FakeClock
from hetgmp.streaming import ClickBatch
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.trainer.sources import KafkaShard, KafkaSpec

pytestmark = pytest.mark.broker

RECORDS, FIRST = 10_000, 8_000  # 80% then 20%
PER_MESSAGE = 128  # 63 messages in the first call: the partitions end unequal
# The record's line number is its one dense value, read back untransformed.
SCHEMA = "label=y;dense=n:transform=none;sparse=s"


def write_halves(tmp_path: Path) -> tuple[Path, Path]:
    lines = [f"{i % 2}\t{i}\t{i:x}\n" for i in range(RECORDS)]
    first, last = tmp_path / "first.tsv", tmp_path / "last.tsv"
    first.write_text("".join(lines[:FIRST]))
    last.write_text("".join(lines[FIRST:]))
    return first, last


def trained_order(kafka: KafkaSettings, topic: str) -> np.ndarray:
    """The line numbers in the order one rank reading every partition hands them out."""
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id="", schema=SCHEMA),
                     idle_s=2.0, poll_s=0.05)
    shard = KafkaShard(spec, global_batch=1024, rank=0, world=1)
    got = []
    try:
        while not shard.exhausted:
            got.append(shard.next_batch())
    finally:
        shard.close()
    out = ClickBatch.concat(got)
    return np.rint(out.dense[:, 0]).astype(np.int64)


def assert_file_order(order: np.ndarray) -> None:
    assert len(order) == RECORDS
    wrong = np.flatnonzero(order != np.arange(RECORDS))
    assert not wrong.size, f"{wrong.size} records out of the file's order from record {wrong[0]}"


@pytest.mark.timeout(120)
def test_two_calls_in_one_process_keep_the_files_order(kafka: KafkaSettings, unique,
                                                       tmp_path: Path) -> None:
    """A clock that never moves: every message ties in time with every other, so the offsets
    and partitions alone decide (what a fast producer meets within a millisecond)."""
    first, last = write_halves(tmp_path)
    topic, clock = unique("split-produce"), FakeClock()
    for path in (first, last):
        report = produce(kafka, ProduceConfig(topic=topic, source=f"file:{path}", partitions=4,
                                              records_per_message=PER_MESSAGE), clock=clock)
        assert report.acked == report.records
    assert_file_order(trained_order(kafka, topic))


@pytest.mark.timeout(180)
def test_two_produce_commands_keep_the_files_order(kafka: KafkaSettings, unique,
                                                   tmp_path: Path) -> None:
    first, last = write_halves(tmp_path)
    topic = unique("split-commands")
    for path in (first, last):
        r = subprocess.run([sys.executable, "-m", "hetgmp.trainer.app.cli", "produce",
                            "--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic,
                            "--source", f"file:{path}", "--partitions", "4",
                            "--records-per-message", str(PER_MESSAGE)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
    assert_file_order(trained_order(kafka, topic))
