"""Crashes with a disk tier (issue 57): a rank SIGKILLed in the middle of an incremental
checkpoint, or half way through a write to its disk tier, while its rows spill all along; the
job resumes on one rank from the last complete checkpoint (an increment) and trains every record
after it once. (Beside test_online.py's crash tests, in a file of their own so that the suite's
workers share them out.)"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from exact_jobs import EXACT, SYN
from group_offsets import committed

from hetgmp.partitioner import Placement
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.launcher import WorkerFailed, launch
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.sources import KafkaSpec
from hetgmp.trainer.testing import Fault, RecordOffsets, ReturnState

pytestmark = pytest.mark.distributed

RECORDS = 12_000
PER_MESSAGE = 4
KAFKA_BATCH = 482  # 241 a rank: not a whole number of 4-record messages


@pytest.mark.parametrize("fault", [Fault(1, "checkpoint", 3), Fault(1, "spill", 10)],
                         ids=["in-an-increment", "in-a-spill"])
def test_kill_9_during_an_incremental_checkpoint_or_a_spill_resumes_on_one_rank_without_loss(
        kafka: KafkaSettings, unique, tmp_path: Path, rows_of, fault: Fault) -> None:
    """Rows spill to each rank's disk tier all along; rank 1 dies after writing its part of the
    third checkpoint (an increment), before the manifest, or half way through writing rows to
    its tier. The resume, on one rank, starts from the last complete checkpoint (an increment)
    and trains every record after it once."""
    topic, group = unique("online-crash-inc"), unique("online-crash-inc-group")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=group), idle_s=3.0, poll_s=0.1)
    train = replace(EXACT["train"], global_batch=KAFKA_BATCH)  # type: ignore[type-var]
    model = replace(EXACT["model"], dtype="float32")  # type: ignore[type-var]
    store = replace(EXACT["store"], max_rows=500,  # type: ignore[type-var]
                    disk_dir=str(tmp_path / "tier"))
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                          checkpoint_dir=str(tmp_path / "ckpt"),
                          checkpoint_interval=str(3 * KAFKA_BATCH))
    crash = Job(spec, model, store, train, placement=Placement.hash(2), online=online,
                observers=(fault,))
    with pytest.raises(WorkerFailed, match="SIGKILL"):
        launch(run_rank, crash, LaunchConfig(device="cpu", workers=2, timeout_s=60))
    manifest = ckpt.latest(tmp_path / "ckpt")
    assert manifest is not None and manifest.depth >= 1 and 0 < manifest.records < RECORDS
    assert sum(manifest.offsets.values()) * PER_MESSAGE == manifest.records
    assert committed(kafka, topic, group) == manifest.offsets

    resume = Job(spec, model, store, train, placement=Placement.hash(1),
                 online=replace(online, resume=True), observers=(RecordOffsets, ReturnState))
    (result,) = launch(run_rank, resume, LaunchConfig(device="cpu", workers=1, timeout_s=60))
    assert result.resumed_from == manifest.step
    trained = result.observed["trained_offsets"]
    assert len(trained) == RECORDS - manifest.records  # nothing replayed twice, nothing skipped
    for p in (0, 1):
        offsets = trained[trained[:, 0] == p, 1]
        messages, counts = np.unique(offsets, return_counts=True)
        assert messages.min() == manifest.offsets[p]  # resumes right after the checkpoint
        assert np.array_equal(messages, np.arange(messages.min(), messages.max() + 1))
        assert (counts == PER_MESSAGE).all()  # every record of every message, once
    final = ckpt.latest(tmp_path / "ckpt")
    assert final is not None and final.records == RECORDS
    assert not list((tmp_path / "tier").glob("tier-*"))  # the killed ranks' tiers too
    # The final checkpoint holds the resumed rank's every row (its first is full: the
    # resumed store knows nothing of the chain it came from).
    ids, values, _, _ = ckpt.load_rows(final)
    rows = rows_of([result])
    assert np.array_equal(ids, np.sort(np.array(list(rows))))
    assert all(np.array_equal(values[i], rows[int(k)].numpy()) for i, k in enumerate(ids))
