"""``hetgmp train`` end to end: synthetic source in memory, and a real topic on the broker."""

from __future__ import annotations

import json

import pytest

from streaming.kafka import KafkaSettings
from streaming.producer import ProduceConfig, produce
from streaming.synthetic import SyntheticConfig
from trainer.train_cli import main

pytestmark = pytest.mark.distributed

SMALL = ["--embed-dim", "8", "--hidden", "16", "--global-batch", "512", "--log-every", "0",
         "--threads", "1", "--timeout-s", "120"]


def _summary(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_train_synthetic_on_two_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    # Repartitioning off: the graph placement is computed once from a warm-up window (static).
    code = main(["--workers", "2", "--records", "8192", "--warmup", "8000", "--heldout", "4000",
                 "--staleness", "2", "--model", "widedeep", "--synthetic-vocab-max", "20000",
                 "--repartition-interval", "0", *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    assert s["workers"] == 2 and s["samples"] == 8192 and s["steps"] == 16
    assert s["placement"]["kind"] == "graph" and min(s["placement"]["replicas"]) > 0
    assert 0.5 < s["heldout_auc"] < 1.0
    assert s["max_staleness"] <= 2 and s["replica_reads"] > 0
    assert s["bytes_per_sample"] > 0 and s["remote_rows_per_sample"] > 0


@pytest.mark.broker
def test_train_from_kafka_reads_every_partition_once(
    capsys: pytest.CaptureFixture[str], kafka: KafkaSettings, unique
) -> None:
    topic = unique("train")
    report = produce(kafka, ProduceConfig(topic=topic, count=20_000, partitions=4,
                                          records_per_message=16), SyntheticConfig(seed=2))
    assert report.records == 20_000
    # Online placement: hash at first, a full partition after 2,000 records, then repairs.
    code = main(["--workers", "2", "--source", "kafka", "--records", "0", "--idle-s", "4",
                 "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
                 "--consumer-group-id", "", "--warmup", "2000", "--repartition-interval", "6000",
                 "--staleness", "1", *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    # Every record trained exactly once, whatever rank read it and whichever trained it.
    assert s["samples"] == 20_000
    assert s["placement"]["kind"] == "online" and s["placement"]["version"] >= 1
    assert s["placements_moved_to"] >= 1 and s["placement"]["explicit_ids"] > 0
    assert s["progressive_auc"] is not None and 0.4 < s["progressive_auc"] < 1.0
    assert s["heldout_auc"] is None


def test_a_bad_setting_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--global-batch", "0"])
    assert info.value.code == 2
    assert "global_batch" in capsys.readouterr().err
