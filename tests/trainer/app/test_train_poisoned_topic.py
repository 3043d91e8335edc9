"""Invariant 6 end to end: ``hetgmp train`` over a topic where malformed records of every kind
(the poison pills of issue 53 and drawn junk) sit among good ones ends with rc 0 and
``records read = trained + dead-lettered``, on one rank and on two, and again with
``--resume`` from its checkpoint (a poison pill never stops a restart either)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaProducer

from hetgmp.streaming.kafka import KafkaSettings, ensure_topic

pytestmark = [pytest.mark.broker, pytest.mark.distributed]

SCHEMA = """\
label = "y"
[dense.price]
transform = "none"
[dense.views]
[sparse.item]
table = "items"
[sparse.history]
table = "items"
max_len = 3
on_overflow = "reject"
[sparse.tags]
max_len = 2
weighted = true
on_overflow = "reject"
weights = "tags_w"
"""

TRAIN = ["--source", "kafka", "--consumer-format", "json", "--device", "cpu", "--embed-dim",
         "4", "--hidden", "8", "--global-batch", "256", "--log-every", "0", "--threads", "1",
         "--timeout-s", "200", "--idle-s", "3", "--repartition-interval", "0",
         "--consumer-group-id", "", "--heldout", "0"]


def _good(rng: np.random.Generator) -> dict[str, object]:
    tags = [f"t{int(x)}" for x in rng.integers(0, 30, int(rng.integers(0, 3)))]
    return {"y": int(rng.integers(0, 2)), "price": float(rng.normal(0, 3)),
            "views": int(rng.integers(0, 1000)), "item": f"i{int(rng.integers(0, 400))}",
            "history": [f"i{int(x)}" for x in rng.integers(0, 400, int(rng.integers(0, 4)))],
            "tags": tags, "tags_w": [float(x) for x in rng.uniform(0, 2, len(tags))]}


def _bad(rng: np.random.Generator, i: int) -> bytes:
    """A malformed record: issue 53's pills first, then junk of several kinds."""
    pills = [{"y": 1, "price": 1e39, "item": "a", "tags": []},  # past float32 on a none field
             {"y": 1, "item": "a", "tags": ["x", "y"], "tags_w": [3e38, 3e38]},  # sum overflows
             {"y": 1, "item": "a", "tags": ["x"], "tags_w": [10**400]},  # too long for a float
             {"y": 1, "item": "a", "tags": ["x", "y"], "tags_w": [1]},  # wrong length
             {"y": 1, "item": "a", "tags": ["x"]},  # weights missing
             {"y": 2, "item": "a"},  # not a label
             {"y": 1, "item": "a", "history": ["a", "b", "c", "d"]},  # past max_len: reject
             {"y": 1, "price": "NaN", "item": "a"}]
    if i < len(pills):
        return json.dumps(pills[i]).encode()
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return bytes(rng.integers(1, 256, int(rng.integers(1, 40)), dtype=np.uint8)).replace(
            b"\n", b" ")
    if kind == 1:
        return json.dumps(_good(rng)).encode()[:int(rng.integers(1, 30))]  # truncated
    if kind == 2:
        return json.dumps([1, 2, {"y": 1}]).encode()
    return json.dumps({"y": 1, "item": "a", "views": "9" * 400}).encode()  # inf as a float


def _produce(kafka: KafkaSettings, topic: str) -> tuple[int, int]:
    """2,000 good records with 150 bad ones among them (after the first 200, which are good:
    a topic whose first records are all bad is refused as the wrong format); (good, bad)."""
    ensure_topic(kafka, topic, 2)
    rng = np.random.default_rng(53)
    lines = [json.dumps(_good(rng)).encode() for _ in range(2_000)]
    bad = [_bad(rng, i) for i in range(150)]
    at = np.sort(rng.choice(np.arange(200, len(lines)), len(bad), replace=False))
    for pos, line in zip(at[::-1], bad[::-1]):
        lines.insert(int(pos), line)
    producer = KafkaProducer(**kafka.client_kwargs(), acks="all")
    for k in range(0, len(lines), 10):  # 10 records a message, round robin
        producer.send(topic, value=b"\n".join(lines[k:k + 10]), partition=(k // 10) % 2)
    producer.flush()
    producer.close()
    return 2_000, len(bad)


def _train(*argv: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-m", "hetgmp.trainer.app.cli", "train", *argv],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_train_over_a_poisoned_topic_trains_every_good_record_and_dead_letters_the_rest(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    topic = unique("poisoned")
    good, bad = _produce(kafka, topic)
    schema = tmp_path / "schema.toml"
    schema.write_text(SCHEMA)
    common = [*TRAIN, "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
              "--consumer-schema", str(schema)]
    for workers in ("1", "2"):
        s = _train(*common, "--workers", workers)
        assert s["records_in"] == good + bad and s["records_decoded"] == good, s
        assert s["samples"] == good and s["dead_lettered"] == s["records_rejected"] == bad, s
        assert np.isfinite(s["mean_loss"])
    # Trained up to a checkpoint, then resumed: the restart reads past every pill too.
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "600",
            "--max-records", "1200"]
    first = _train(*common, "--workers", "2", *ckpt)
    assert first["records_decoded"] >= 1_200
    resumed = _train(*common, "--workers", "2", *ckpt[:2], "--resume")
    assert resumed["samples"] > 0 and np.isfinite(resumed["mean_loss"])
