"""The model delta log on the real broker: a checkpoint and the deltas after it are the trainer's
model, bit for bit; scores from it are the trainer's; a crash and a resume never move a row
back; evicted rows leave serving.

The job they read is the session's ``trained`` (conftest); the crash test runs its own.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from published_job import (
    LAUNCH,
    MODEL,
    PER_MESSAGE,
    RECORDS,
    STORE,
    SYN,
    TRAIN,
    checkpoints,
    follow,
    kafka_spec,
    online_config,
    trainer_forward,
    trainer_model,
)

from hetgmp.partitioner import Placement
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticStream
from hetgmp.trainer.dist.launcher import WorkerFailed, launch
from hetgmp.trainer.run import Job, run_rank
from hetgmp.trainer.sources.synthetic import synthetic_batch
from hetgmp.trainer.testing import Fault, ReturnState

pytestmark = [pytest.mark.broker, pytest.mark.distributed]


def test_a_checkpoint_and_the_deltas_after_it_are_the_trainers_model(trained) -> None:
    found = checkpoints(trained["root"])
    assert len(found) >= 4 and all(m.model is not None for m in found)
    first, last = found[0], found[-1]
    assert first.model.topic == f"{trained['topic']}.model" and last.model.final
    ids, rows, dense = trainer_model(trained["results"])
    serving, follower = follow(trained["kafka"], first)
    follower.close()
    held, values, _, flat = serving.export()
    # Every row the trainer holds, bit for bit (every row a step reads, it updates: serving
    # holds them all) ...
    got, unknown = serving.table.gather(ids)
    np.testing.assert_array_equal(got, rows)
    assert unknown == 0
    # ... and no row the trainer let go of (evicted rows were tombstoned).
    assert np.isin(held, ids).all()
    assert sum(r.job_totals.samples for r in trained["results"][:1]) == RECORDS
    np.testing.assert_array_equal(flat, torch.cat([v.reshape(-1) for v in dense.values()]).numpy())
    assert serving.applied.tombstones > 0 and serving.applied.gaps == 0
    assert serving.applied.incomplete == 0 and serving.applied.foreign == 0


def test_every_checkpoint_plus_its_deltas_reaches_the_same_model(trained) -> None:
    """Whichever checkpoint a serve process starts from, the log takes it to the same rows."""
    found = checkpoints(trained["root"])
    ends = []
    for manifest in (found[0], found[len(found) // 2], found[-1]):
        serving, follower = follow(trained["kafka"], manifest)
        follower.close()
        ids, values, _, flat = serving.export()
        ends.append((ids, values, flat))
    for ids, values, flat in ends[1:]:
        np.testing.assert_array_equal(ids, ends[0][0])
        np.testing.assert_array_equal(values, ends[0][1])
        np.testing.assert_array_equal(flat, ends[0][2])


def test_serving_scores_are_the_trainers_forward_pass(trained) -> None:
    serving, follower = follow(trained["kafka"], checkpoints(trained["root"])[0])
    follower.close()
    batch = synthetic_batch(SyntheticStream(SYN), RECORDS, 512)  # records no one trained
    expected = trainer_forward(trained["results"], batch)
    np.testing.assert_allclose(serving.score(batch), expected, rtol=0, atol=1e-5)
    assert serving.unknown_ids > 0  # the fresh records hold ids no one trained


def test_serve_with_its_own_disk_tier_holds_and_scores_what_the_trainer_holds(
        trained, tmp_path: Path) -> None:
    """A serve process that keeps 300 rows in memory and the rest on disk, started from the
    first checkpoint and caught up with the log: the trainer's rows bit for bit, its scores."""
    ids, rows, dense = trainer_model(trained["results"])
    serving, follower = follow(trained["kafka"], checkpoints(trained["root"])[0],
                               memory_rows=300, disk_dir=str(tmp_path))
    follower.close()
    table = serving.table
    assert table.tier is not None and len(table.tier) > 3 * table.memory_rows
    assert table.memory_size <= table.memory_rows and len(table) == ids.size
    held, values, _, flat = serving.export()
    np.testing.assert_array_equal(held, ids)
    np.testing.assert_array_equal(values, rows)
    np.testing.assert_array_equal(flat, torch.cat([v.reshape(-1) for v in dense.values()]).numpy())
    batch = synthetic_batch(SyntheticStream(SYN), RECORDS, 512)
    np.testing.assert_allclose(serving.score(batch), trainer_forward(trained["results"], batch),
                               rtol=0, atol=1e-5)
    assert serving.applied.tombstones > 0  # rows evicted by the trainer left either tier
    table.close()
    assert not list(tmp_path.glob("tier-*"))


def test_a_crash_and_a_resume_never_move_a_row_back(kafka: KafkaSettings, unique,
                                                    tmp_path: Path) -> None:
    """A rank SIGKILLed mid-run, the job resumed: a serve process that followed all along
    never saw a row's version fall, and ends holding the resumed trainer's model."""
    topic = unique("deltas-crash")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    # kafka-python publishes: librdkafka's idempotent producer waits 0.5-1.0 s for its producer
    # id when it starts (measured against the embedded broker), longer than the crashed run
    # lives before its kill, and the test needs that run's deltas past its last checkpoint.
    spec = kafka_spec(kafka, topic, unique("deltas-crash-group"), client="kafka-python")
    crash = Job(spec, MODEL, STORE, TRAIN, placement=Placement.hash(2), online=online_config(tmp_path),
                observers=(Fault(1, "checkpoint", 3),))
    with pytest.raises(WorkerFailed, match="SIGKILL"):
        launch(run_rank, crash, LAUNCH)
    found = checkpoints(tmp_path)
    assert found and not found[-1].model.final
    serving, follower = follow(kafka, found[0])
    before = serving.table.export()
    # The crashed run published past its last checkpoint: rows the resumed run will redo.
    assert serving.step > found[-1].step
    # The resumed run stops one step past the checkpoint, short of where the crashed run had
    # published: rows only the crashed run updated must come back to the checkpoint's values
    # (the resumed run republishes what it restored; a newer generation outranks the crash).
    resume = Job(spec, MODEL, STORE, TRAIN, placement=Placement.hash(2),
                 online=replace(online_config(tmp_path), resume=True,
                                max_records=found[-1].records + TRAIN.global_batch),
                 observers=(ReturnState,))
    results = launch(run_rank, resume, LAUNCH)
    follower.catch_up(timeout_s=60)
    follower.close()
    after = serving.table.export()
    both, i, j = np.intersect1d(before[0], after[0], return_indices=True)
    assert both.size and (after[2][j] >= before[2][i]).all()  # no version went back
    assert serving.applied.generations == 1  # the resumed run outranked the crashed one
    ids, rows, _ = trainer_model(results)
    got, _ = serving.table.gather(ids)
    np.testing.assert_array_equal(got, rows)  # what the resumed trainer holds, exactly
    assert np.isin(after[0], ids).all()


def test_a_copied_checkpoint_directory_never_publishes_as_the_original(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    """``cp -a`` of a job's checkpoint directory, resumed on the same topic: the copy trains
    and publishes, and a serve process of the original applies none of it."""
    import shutil

    topic = unique("deltas-copy")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = kafka_spec(kafka, topic, unique("deltas-copy-group"))
    one = replace(LAUNCH, workers=1)
    original, copy = tmp_path / "original", tmp_path / "copy"
    launch(run_rank, Job(spec, MODEL, STORE, TRAIN, placement=Placement.hash(1),
                         online=online_config(original, max_records=RECORDS // 2)), one)
    shutil.copytree(original, copy, copy_function=shutil.copy2)
    serving, follower = follow(kafka, checkpoints(original)[-1])
    before = serving.export()
    launch(run_rank, Job(spec, MODEL, STORE, TRAIN, placement=Placement.hash(1),
                         online=replace(online_config(copy), resume=True)), one)
    assert checkpoints(copy)[-1].records == RECORDS  # the copy trained the rest, and published
    follower.catch_up(timeout_s=60)
    follower.close()
    assert serving.applied.foreign > 0 and serving.applied.generations == 0
    for held, now in zip(before, serving.export()):
        np.testing.assert_array_equal(held, now)
    assert checkpoints(copy)[-1].model.lineage != checkpoints(original)[-1].model.lineage


def test_by_default_serve_can_start_while_the_run_trains_and_a_quiet_log_is_fresh(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    """Finding 13 of 2026-12-04: with the default --checkpoint-interval (then 0: only at the
    end) no checkpoint existed while a run trained, so serve could not start. ``auto`` takes
    one at the first publish. And once the ranks have read the whole log, the marks say so:
    the served model's lag stops growing with the age of the newest record."""
    topic = unique("deltas-default")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = kafka_spec(kafka, topic, unique("deltas-default-group"))
    online = replace(online_config(tmp_path), checkpoint_interval="auto")
    (result,) = launch(run_rank, Job(spec, MODEL, STORE, TRAIN, placement=Placement.hash(1),
                                     online=online, observers=(ReturnState,)),
                       replace(LAUNCH, workers=1))
    found = checkpoints(tmp_path)
    assert len(found) == 2 and found[-1].model.final and not found[0].model.final
    first = found[0]
    assert first.step < found[-1].step and first.model.publishes == 1
    # A serve started from that first checkpoint reaches the trainer's final model.
    serving, follower = follow(kafka, first)
    follower.close()
    ids, rows, _ = trainer_model([result])
    got, _ = serving.table.gather(ids)
    np.testing.assert_array_equal(got, rows)
    # The source sat idle for idle_s after the last record: the last marks say the ranks had
    # read the whole log by then, later than the newest record trained.
    assert serving.watermark_ms > 0
    assert serving.fresh_ms - serving.watermark_ms >= 1000 * (spec.idle_s - 1)
