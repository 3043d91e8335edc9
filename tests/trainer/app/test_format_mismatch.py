"""``consume`` and ``train`` of a topic read with the wrong ``--consumer-format`` or schema stop
with one line naming the flag, exit 1, instead of dead-lettering the whole topic with exit 0;
malformed records before good ones are still dead-lettered and the run goes on."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from kafka import KafkaProducer

from hetgmp.streaming.kafka import KafkaSettings, ensure_topic
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig

pytestmark = pytest.mark.broker

TRAIN = ["--device", "cpu", "--embed-dim", "8", "--hidden", "16", "--global-batch", "512",
         "--log-every", "0", "--threads", "1", "--timeout-s", "120", "--idle-s", "3",
         "--repartition-interval", "0", "--consumer-group-id", ""]


def hetgmp(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetgmp.trainer.app.cli", *argv],
                          capture_output=True, text=True, timeout=240)


def arrow_topic(kafka: KafkaSettings, topic: str) -> None:
    report = produce(kafka, ProduceConfig(topic=topic, count=20_000, partitions=2,
                                          format="arrow"), SyntheticConfig(seed=2))
    assert report.acked == 20_000


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@pytest.mark.timeout(120)
def test_consume_of_an_arrow_topic_as_tsv_says_which_flag_and_fails(kafka, unique):
    topic = unique("arrow-as-tsv")
    arrow_topic(kafka, topic)
    r = hetgmp("consume", "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic",
               topic, "--consumer-group-id", "", "--idle-exit", "3")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    line = last_line(r.stderr)
    assert line.startswith(f"error: FormatMismatch: topic {topic!r} holds Arrow IPC record "
                           "batches, not tab-separated (TSV) lines: read it with "
                           "--consumer-format arrow"), line
    assert '"records"' not in r.stdout  # no summary of a run that read nothing


@pytest.mark.timeout(120)
def test_consume_with_a_wrong_schema_says_so_and_fails(kafka, unique):
    topic = unique("wrong-schema")
    produce(kafka, ProduceConfig(topic=topic, count=2_000, partitions=2), SyntheticConfig(seed=2))
    r = hetgmp("consume", "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic",
               topic, "--consumer-group-id", "", "--idle-exit", "3", "--consumer-schema", "12,26")
    assert r.returncode == 1, r.stderr[-2000:]
    line = last_line(r.stderr)
    assert "wrong_field_count" in line and "--consumer-schema '12,26'" in line, line


@pytest.mark.timeout(120)
def test_malformed_records_before_good_ones_are_dead_lettered_and_the_run_goes_on(kafka, unique):
    """Invariant 6 at the head of a topic: five bad messages (one an Arrow message) first."""
    topic = unique("bad-head")
    ensure_topic(kafka, topic, 1)
    raw = KafkaProducer(**kafka.client_kwargs())
    bad = [b"not\ta\trecord %d" % i for i in range(4)]
    arrow = produce_arrow_bytes()
    for value in [*bad, arrow]:
        raw.send(topic, value=value, partition=0)
    raw.flush()
    raw.close()
    produce(kafka, ProduceConfig(topic=topic, count=800, partitions=1), SyntheticConfig(seed=4))
    r = hetgmp("consume", "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic",
               topic, "--consumer-group-id", "", "--idle-exit", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(last_line(r.stdout))
    assert summary["records"] == 800
    assert summary["rejected"]["wrong_field_count"] >= 4
    assert summary["dead_lettered"] == sum(summary["rejected"].values())


def produce_arrow_bytes() -> bytes:
    from hetgmp.streaming.arrow import encode_arrow
    from hetgmp.streaming.synthetic import SyntheticStream

    stream = SyntheticStream(SyntheticConfig(seed=9))
    block = stream.take(0, 4)
    values, lengths = stream.sparse(block)
    return encode_arrow(stream.config.schema, block.labels, block.dense,
                        values.reshape(lengths.shape), 4)[0]


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_train_of_an_arrow_topic_as_tsv_says_which_flag_and_fails(kafka, unique, workers):
    topic = unique("train-arrow-as-tsv")
    arrow_topic(kafka, topic)
    r = hetgmp("train", "--source", "kafka", "--workers", workers, "--bootstrap-servers",
               kafka.bootstrap_servers, "--consumer-topic", topic, *TRAIN)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    line = last_line(r.stderr)
    assert "FormatMismatch: topic" in line and "read it with --consumer-format arrow" in line, line
    assert re.match(r"error: rank [01] failed: " if workers == "2" else "error: ", line), line
