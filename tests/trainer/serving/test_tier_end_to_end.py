"""A table larger than memory, end to end (issue 57): two ranks train from Kafka, each with a
memory tier a fraction of its rows, checkpointing (full, then increments); one is SIGKILLed half
way through a write to its disk tier; the job resumes on one rank, with its own tier; and
``hetgmp serve`` with a tier of its own answers over HTTP the scores of the model the resumed
rank holds. No row was reset: every row of the last checkpoint before the crash comes back with
at least its version."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

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
    kafka_spec,
    online_config,
    trainer_forward,
)
from serve_process import Serve

from hetgmp.partitioner import Placement
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticStream
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist.launcher import WorkerFailed, launch
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.sources.synthetic import synthetic_batch
from hetgmp.trainer.testing import Fault, ReturnState

pytestmark = [pytest.mark.broker, pytest.mark.distributed, pytest.mark.slow]

MEMORY_ROWS = 400  # a rank's memory tier; the job makes thousands of rows


def test_a_table_larger_than_memory_trains_crashes_resumes_on_two_ranks_and_serves(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    topic = unique("tier-e2e")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = kafka_spec(kafka, topic, unique("tier-e2e-group"))
    # No idle eviction: rows stay (spilled) however long unused, so none is ever reset.
    store = replace(STORE, evict_after=0, max_rows=MEMORY_ROWS, disk_dir=str(tmp_path / "tier"))
    root = tmp_path / "ckpt"
    online = online_config(root, checkpoint_full_every=4)
    crash = Job(spec, MODEL, store, TRAIN, placement=Placement.hash(2), online=online,
                observers=(Fault(1, "spill", 12),))
    with pytest.raises(WorkerFailed, match="SIGKILL"):
        launch(run_rank, crash, LAUNCH)
    before = ckpt.latest(root)
    assert before is not None and before.depth >= 1 and 0 < before.records < RECORDS
    b_ids, _, _, b_versions = ckpt.load_rows(before)
    assert b_ids.size > 10 * MEMORY_ROWS  # the table was several times the memory tiers

    resume = Job(spec, MODEL, store, TRAIN, placement=Placement.hash(1),
                 online=replace(online, resume=True), observers=(ReturnState,))
    results = launch(run_rank, resume, replace(LAUNCH, workers=1))
    assert all(r.resumed_from == before.step for r in results)
    assert sum(r.job_totals.samples for r in results) == RECORDS - before.records
    states = [r.observed["state"] for r in results]
    ids = np.concatenate([s.ids for s in states])
    versions = np.concatenate([s.versions for s in states])
    order = np.argsort(ids)
    ids, versions = ids[order], versions[order]
    at = np.searchsorted(ids, b_ids)
    assert np.array_equal(ids[at], b_ids)  # every row of the checkpoint is still there ...
    assert (versions[at] >= b_versions).all()  # ... with at least what it had learned
    assert not list((tmp_path / "tier").glob("tier-*"))  # the killed rank's tier too

    batch = synthetic_batch(SyntheticStream(SYN), RECORDS, 256)  # records no one trained
    lines = SyntheticStream(SYN).lines(RECORDS, 256)
    serve = Serve(root, kafka, "--memory-rows", "300", "--disk-dir", str(tmp_path / "serve"))
    try:
        serve.ready()
        status, reply = serve.request("/predict", b"\n".join(lines) + b"\n")
        assert status == 200, reply
        np.testing.assert_allclose(np.asarray(reply["scores"]), trainer_forward(results, batch),
                                   rtol=0, atol=1e-5)
        assert serve.metric("hetgmp_serve_rows") == ids.size  # in either of its tiers
    finally:
        serve.stopped_cleanly()
    assert not list((tmp_path / "serve").glob("tier-*"))  # serve's tier left with it
