"""``hetgmp serve`` as users run it: a process on a port, answering over HTTP from a checkpoint
and the delta log; scores are the trainer's; bad requests get a 4xx with the reason and the
server goes on; a serve process killed and restarted ends where one that never stopped does."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from published_job import (
    LAUNCH,
    MODEL,
    PER_MESSAGE,
    RECORDS,
    STORE,
    SYN,
    TRAIN,
    checkpoints,
    kafka_spec,
    online_config,
    trainer_forward,
)
from serve_process import Serve

from hetgmp.partitioner import Placement
from hetgmp.streaming.codec import Decoder
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticStream
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.run import Job, run_rank

pytestmark = [pytest.mark.broker, pytest.mark.distributed]

def _lines(start: int, count: int) -> bytes:
    return b"\n".join(SyntheticStream(SYN).lines(start, count)) + b"\n"


def test_served_scores_are_the_trainers_forward_pass(trained) -> None:
    serve = Serve(trained["root"], trained["kafka"])
    try:
        serve.ready()
        body = _lines(RECORDS, 256)  # records no one trained on
        status, reply = serve.request("/predict", body)
        assert status == 200, reply
        batch = Decoder().decode(body.split(b"\n")[:-1]).batch
        expected = trainer_forward(trained["results"], batch)
        np.testing.assert_allclose(reply["scores"], expected, rtol=0, atol=1e-5)
        final = checkpoints(trained["root"])[-1]
        assert reply["model"]["step"] == final.step  # the model as the trainer ended
        assert serve.metric("hetgmp_serve_records_scored_total") == 256
        assert serve.metric("hetgmp_serve_unknown_ids_total") > 0
        assert serve.metric("hetgmp_serve_rows") > 0
    finally:
        serve.stopped_cleanly()


def test_bad_requests_get_a_4xx_with_the_reason_and_the_server_goes_on(trained) -> None:
    serve = Serve(trained["root"], trained["kafka"], "--max-body-bytes", "20000")
    try:
        serve.ready()
        good = _lines(0, 3)
        broken = good.split(b"\n")
        broken[1] = b"1\t2\tonly three fields"
        status, reply = serve.request("/predict", b"\n".join(broken))
        assert status == 400 and reply["rejected"][0]["line"] == 2
        assert reply["rejected"][0]["reason"] == "wrong_field_count"
        status, reply = serve.request("/predict", _lines(0, 200))  # ~40 KB
        assert status == 413 and "20000" in reply["error"]
        status, reply = serve.request("/predict", good, ctype="application/xml")
        assert status == 415 and "application/xml" in reply["error"]
        status, reply = serve.request("/predict", b"\n\n")
        assert status == 400 and "no records" in reply["error"]
        status, reply = serve.request("/predict", b"\xff\xfe\x00garbage\n")
        assert status == 400 and reply["rejected"]
        # JSON lines: the same record as TSV scores the same.
        fields = good.split(b"\n")[0].decode().split("\t")
        schema = Decoder().schema
        record: dict[str, Any] = {"label": int(fields[0])}
        record |= {n: int(v) for n, v in zip(schema.dense, fields[1:14]) if v}
        record |= {n: v for n, v in zip(schema.sparse, fields[14:]) if v}
        s_json, r_json = serve.request("/predict", json.dumps(record).encode(),
                                       ctype="application/x-ndjson")
        s_tsv, r_tsv = serve.request("/predict", good.split(b"\n")[0])
        assert s_json == s_tsv == 200 and r_json["scores"] == r_tsv["scores"]
        # Still serving, and the refusals were counted.
        assert serve.request("/predict", good)[0] == 200
        assert serve.request("/healthz")[0] == 200
        assert serve.metric('hetgmp_serve_requests_total{code="400"}') == 3
        assert serve.metric('hetgmp_serve_requests_total{code="413"}') == 1
    finally:
        serve.stopped_cleanly()


def test_a_serve_process_killed_and_restarted_ends_where_one_that_never_stopped_does(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    """Training goes on while one of two serve processes is down; restarted, it loads the
    newest checkpoint, follows the log from there and ends with the same model."""
    topic = unique("serve-restart")
    records = 3 * RECORDS
    producer = threading.Thread(target=produce, args=(kafka, ProduceConfig(
        topic=topic, count=records, partitions=2, records_per_message=PER_MESSAGE,
        rate=records / 12), SYN))
    producer.start()
    job = Job(kafka_spec(kafka, topic, unique("serve-restart-group")), MODEL, STORE, TRAIN,
              placement=Placement.hash(2), online=online_config(tmp_path))
    results: list[Any] = []
    trainer = threading.Thread(target=lambda: results.extend(launch(
        run_rank, replace(job), replace(LAUNCH, timeout_s=180))))
    trainer.start()
    steady = Serve(tmp_path, kafka)
    victim = Serve(tmp_path, kafka)
    try:
        steady.ready(120)
        victim.ready(120)
        time.sleep(2.0)
        assert victim.stop(signal.SIGKILL) == -signal.SIGKILL
        time.sleep(3.0)  # the log moves on without it
        victim = Serve(tmp_path, kafka)
        victim.ready(120)  # it listens at once; its model (and metrics) come with a checkpoint
        trainer.join(240)
        producer.join(60)
        assert results, "the training job did not end"
        final = checkpoints(tmp_path)[-1]
        assert final.records == records and final.model is not None and final.model.final
        for serve in (steady, victim):
            deadline = time.monotonic() + 60
            while serve.metric("hetgmp_serve_model_step") < final.step:
                assert time.monotonic() < deadline, "\n".join(serve.lines[-20:])
                time.sleep(0.2)
        body = _lines(records, 256)
        a, b = steady.request("/predict", body), victim.request("/predict", body)
        assert a[0] == b[0] == 200 and a[1]["scores"] == b[1]["scores"]
        assert steady.metric("hetgmp_serve_rows") == victim.metric("hetgmp_serve_rows")
        # The restarted one loaded a newer checkpoint: it read less of the log.
        assert victim.metric('hetgmp_serve_deltas_applied_total{kind="mark"}') < \
            steady.metric('hetgmp_serve_deltas_applied_total{kind="mark"}')
    finally:
        steady.stop()
        victim.stop()
