"""The online loop: live migration keeps the math (invariants 1, 3, 4), checkpoints resume on any
number of ranks, and a rank killed in the middle of a migration loses nothing (invariant 5).

The migration and checkpoint jobs share one 2-rank launch (ranks cost seconds to start); the
single-process runs go through the very same ``run_rank`` in the test process.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from group_offsets import committed

from hetgmp.partitioner import Placement
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.dist.launcher import WorkerFailed, launch
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, RankResult, graph_placement, run_jobs, run_rank
from hetgmp.trainer.sources import KafkaSpec, SyntheticSpec
from hetgmp.trainer.step import TrainConfig
from hetgmp.trainer.testing import AuditRun, Fault, Paced, RecordOffsets, ReturnState

pytestmark = pytest.mark.distributed

SYN = SyntheticConfig(vocab_max=20_000, seed=5)
WINDOW = 20_000
BATCH = 240
STEPS = 40
STATE = (ReturnState,)
SOURCE = SyntheticSpec(SYN, start=WINDOW, records=BATCH * STEPS)
EXACT = dict(
    model=ModelConfig(model="deepfm", embed_dim=8, hidden=(16,), dtype="float64"),
    store=StoreConfig(optimizer="adagrad", lr=0.05),
    train=TrainConfig(staleness=0, global_batch=BATCH, replica_fraction=0.05, log_every=0,
                      dense_optimizer="adam"),
)
STALE_S = 3
# Rows of this model: 9 float64 values + 1 accumulator + id + version = 96 bytes; chunks of
# 3,000 rows make a migration take several steps.
CHUNK = 96 * 3000


def _ids() -> np.ndarray:
    return np.unique(SyntheticStream(SYN).feature_ids(0, WINDOW + BATCH * STEPS))


def _random_placement(world: int, version: int, seed: int) -> Placement:
    """Owners drawn at random (most rows move) and random replicas."""
    ids = _ids()
    rng = np.random.default_rng(seed)
    owners = rng.integers(0, world, ids.size)
    reps = tuple(np.sort(rng.choice(ids[owners != w], 300, replace=False)) for w in range(world))
    return Placement(version, world, ids, owners, reps)


def _schedule(world: int) -> tuple[tuple[int, Placement], ...]:
    graph = graph_placement(SyntheticStream(SYN).feature_ids(0, WINDOW), world, EXACT["train"])
    return ((3, graph.with_version(1)), (9, _random_placement(world, 2, 1)),
            (16, _random_placement(world, 3, 2)), (23, Placement.hash(world, 4)),
            (30, graph.with_version(5)))


def _online(**kw: object) -> OnlineConfig:
    return OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                        migration_chunk_bytes=CHUNK, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ckpt")
    return {name: base / name for name in ("one", "two")}


@pytest.fixture(scope="module")
def single(dirs: dict[str, Path]) -> dict[str, RankResult]:
    """Single-process runs: the reference, and the first half of a run that checkpoints."""
    torch.set_num_threads(1)
    one = Placement.hash(1)
    half = _online(checkpoint_dir=str(dirs["one"]), max_records=BATCH * STEPS // 2)
    return {
        "reference": run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=one, observers=STATE)),
        "first_half": run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=one, online=half,
                                                observers=STATE)),
    }


@pytest.fixture(scope="module")
def two_ranks(single: dict[str, RankResult], dirs: dict[str, Path]) -> list[list[RankResult]]:
    """Results by job, then by rank: migrations at s = 0; a run that checkpoints halfway; a
    resumption of the single-process checkpoint (1 -> 2 ranks)."""
    graph = _schedule(2)[0][1]
    jobs = [
        Job(SOURCE, **EXACT, placement=Placement.hash(2),
            online=_online(), schedule=_schedule(2), observers=(ReturnState, AuditRun)),
        Job(SOURCE, **EXACT, placement=graph,
            online=_online(checkpoint_dir=str(dirs["two"]), max_records=BATCH * STEPS // 2),
            observers=STATE),
        Job(SOURCE, **EXACT, placement=Placement.hash(2),
            online=_online(checkpoint_dir=str(dirs["one"]), resume=True), observers=STATE),
        # One record: rank 0 reads nothing and trains nothing in a step that rank 1 trains.
        Job(SyntheticSpec(SYN, 0, 1), **EXACT, placement=Placement.hash(2)),
        # The migrations of job 0 with lagging copies: owners follow each copy's lag across
        # changes of owner and of replica set.
        Job(SOURCE, **{**EXACT, "train": replace(EXACT["train"], staleness=STALE_S)},
            placement=Placement.hash(2), online=_online(), schedule=_schedule(2),
            observers=(AuditRun,)),
    ]
    per_rank = launch(run_jobs, jobs, LaunchConfig(device="cpu", workers=2, timeout_s=120))
    return [list(r) for r in zip(*per_rank)]


def test_migrations_keep_s0_training_exact(two_ranks, single, max_diff) -> None:
    ranks = two_ranks[0]
    dense, emb = max_diff(single["reference"], ranks)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
    online = ranks[0].online
    assert online["placements"] == 5
    done = [e for e in online["events"] if e["event"] == "migration_done"]
    assert len(done) == 5 and [e["version"] for e in done] == [1, 2, 3, 4, 5]
    # Random placements move most rows, over several steps, while training goes on.
    assert max(e["rows_moved"] for e in done) > 2 * 3000
    migrating_steps = sum(1 for h in online["history"] if h[6])
    assert migrating_steps >= 8
    # Invariant 1 was checked after every chunk on every rank (the check raises otherwise).
    assert ranks[0].observed["owner_checks"] >= migrating_steps
    assert ranks[0].placement["version"] == 5
    assert ranks[0].job_totals.steps == STEPS


def test_staleness_bound_holds_across_migrations(two_ranks, recount_lags) -> None:
    ranks = two_ranks[4]
    totals = ranks[0].job_totals
    assert ranks[0].online["placements"] == 5 and totals.steps == STEPS
    hist = totals.staleness
    assert totals.max_staleness <= STALE_S and hist[STALE_S] > 0  # copies did lag, up to s
    # Recounted from what owners applied, with rows changing owner and copies coming and going.
    lags = recount_lags(ranks)
    assert lags.size == totals.counts["replica_reads"] and lags.max() <= STALE_S
    assert np.array_equal(np.bincount(lags, minlength=hist.size), hist)


def test_checkpoint_of_two_ranks_resumes_on_one(two_ranks, single, dirs, max_diff,
                                                rows_of) -> None:
    first = two_ranks[1]
    assert first[0].steps == STEPS // 2
    manifest = ckpt.latest(dirs["two"])
    assert manifest is not None and manifest.world == 2 and manifest.step == STEPS // 2
    assert manifest.records == BATCH * STEPS // 2
    # Rows on disk are exactly the ranks' rows, each id once (load_rows checks that).
    ids, values, state, versions = ckpt.load_rows(manifest)
    assert np.array_equal(ids, np.sort(np.array(list(rows_of(first)))))
    assert state.shape[1] == 1 and versions.min() >= 1
    resumed = run_rank(LocalComm(), Job(
        SOURCE, **EXACT, placement=Placement.hash(1),
        online=_online(checkpoint_dir=str(dirs["two"]), resume=True), observers=STATE))
    assert resumed.resumed_from == STEPS // 2 and resumed.steps == STEPS
    dense, emb = max_diff(single["reference"], [resumed])
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)


def test_checkpoint_of_one_rank_resumes_on_two(two_ranks, single, max_diff) -> None:
    assert single["first_half"].steps == STEPS // 2
    ranks = two_ranks[2]
    assert ranks[0].resumed_from == STEPS // 2
    dense, emb = max_diff(single["reference"], ranks)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)


def test_a_rank_without_samples_takes_part_in_the_step(two_ranks) -> None:
    ranks = two_ranks[3]
    assert ranks[0].steps == 1 and ranks[0].job_totals.samples == 1
    assert [r.totals.samples for r in ranks] == [0, 1]


def test_checkpoint_refuses_another_model(single, dirs) -> None:
    other = replace(EXACT["model"], embed_dim=4)  # type: ignore[type-var]
    job = Job(SOURCE, other, EXACT["store"], EXACT["train"], placement=Placement.hash(1),
              online=_online(checkpoint_dir=str(dirs["one"]), resume=True))
    with pytest.raises(ckpt.CheckpointError, match="another model"):
        run_rank(LocalComm(), job)


def test_incomplete_checkpoint_is_skipped(tmp_path: Path, single, dirs) -> None:
    manifest = ckpt.latest(dirs["one"])
    assert manifest is not None
    crashed = ckpt.step_dir(tmp_path, manifest.step + 1)
    crashed.mkdir(parents=True)
    (crashed / "rank-00000.npz").write_bytes(b"half a file")
    import shutil

    good = ckpt.step_dir(tmp_path, manifest.step)
    shutil.copytree(manifest.path, good)
    found = ckpt.latest(tmp_path)
    assert found is not None and found.path == good


# -- crash recovery through the embedded broker ----------------------------------------------

RECORDS = 12_000
PER_MESSAGE = 4
KAFKA_BATCH = 482  # 241 a rank: not a whole number of 4-record messages


@pytest.mark.broker
def test_kill_9_during_migration_resumes_without_loss(kafka: KafkaSettings, unique, tmp_path):
    topic, group = unique("online-crash"), unique("online-crash-group")
    produce(kafka, ProduceConfig(topic=topic, count=RECORDS, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=group), idle_s=3.0, poll_s=0.1)
    train = replace(EXACT["train"], global_batch=KAFKA_BATCH)  # type: ignore[type-var]
    model = replace(EXACT["model"], dtype="float32")  # type: ignore[type-var]
    online = _online(checkpoint_dir=str(tmp_path), checkpoint_interval=str(2 * KAFKA_BATCH))
    victims = _random_placement(2, 1, 11)
    crash = Job(spec, model, EXACT["store"], train, placement=Placement.hash(2),
                online=replace(online, migration_chunk_bytes=8000),
                schedule=((6, victims),), observers=(Fault(1, "migration", 2),))
    with pytest.raises(WorkerFailed, match="SIGKILL"):
        launch(run_rank, crash, LaunchConfig(device="cpu", workers=2, timeout_s=60))

    manifest = ckpt.latest(tmp_path)
    assert manifest is not None and 0 < manifest.records < RECORDS
    # The checkpoint's offsets are exactly what it trained (both partitions start at 0) ...
    assert set(manifest.offsets) == {0, 1}
    assert sum(manifest.offsets.values()) * PER_MESSAGE == manifest.records
    # ... and Kafka holds them as the group's committed offsets (committed after the manifest).
    assert committed(kafka, topic, group) == manifest.offsets

    resume = Job(spec, model, EXACT["store"], train, placement=Placement.hash(2),
                 online=replace(online, resume=True), observers=(RecordOffsets,))
    results = launch(run_rank, resume, LaunchConfig(device="cpu", workers=2, timeout_s=60))
    assert all(r.resumed_from == manifest.step for r in results)
    trained = np.concatenate([r.observed["trained_offsets"] for r in results])
    assert len(trained) == RECORDS - manifest.records  # nothing replayed twice, nothing skipped
    for p in (0, 1):
        offsets = trained[trained[:, 0] == p, 1]
        first = manifest.offsets[p]
        assert offsets.min() == first  # resumes right after the checkpoint
        messages, counts = np.unique(offsets, return_counts=True)
        assert np.array_equal(messages, np.arange(first, messages.max() + 1))  # no gap
        assert (counts == PER_MESSAGE).all()  # every record of every message, once
    final = ckpt.latest(tmp_path)
    assert final is not None and final.records == RECORDS
    assert committed(kafka, topic, group) == final.offsets


# -- end to end: the placement follows a drifting stream -------------------------------------

DRIFT_EVERY = 25_000
STREAM = 100_000


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.serial  # the partitioner must keep pace with training: no neighbour on the cores
def test_placement_follows_a_drifting_stream(online_run) -> None:
    from bench.online import job_series

    # Records arrive at most at about 30k/s (a step of 1,024 and a 30 ms rest): training on a topic
    # written beforehand outran a partitioner that other processes starved of CPU (CI, a core
    # kept busy: the placement after the last drift landed too late, or not at all).
    results = online_run("online-drift", SyntheticConfig(seed=2, drift_every=DRIFT_EVERY),
                         STREAM, placement="graph", warmup=8_000, interval=10_000,
                         observers=(Paced(0.03),))
    events = results[0].online["events"]
    done = [e for e in events if e["event"] == "migration_done"]
    versions = [e["version"] for e in done]
    # The placement advances: the full one and at least one after each of the three drifts
    # (checked below). Requests come every 10k records; under load the partitioner process
    # finishes fewer of them before the stream ends (4 of up to 10 seen with two benchmarks
    # beside the suite), so the count asked is what the drift checks need, not more.
    assert len(versions) >= 4 and versions == sorted(versions)
    assert results[0].placement["version"] == versions[-1]
    # Each incremental placement says what its pass moved; the first, a full one, has no pass.
    placed = [e for e in events if e["event"] == "placement"]
    assert placed[0]["kind"] == "full" and placed[0]["moves"] is None
    passes = [e["moves"] for e in placed[1:]]
    assert passes and all(m["new_samples"] > 0 and m["ids"] > 0 for m in passes)
    assert all(m["regroup"] + m["group_balance"] + m["refine"] <= m["budget"] for m in passes)
    s = job_series(results)
    rrps = lambda m: s["rows_not_held"][m].sum() / s["samples"][m].sum()  # noqa: E731
    cold = rrps(s["version"] == 0)  # hash placement before the first partition
    for drift in range(DRIFT_EVERY, STREAM, DRIFT_EVERY):
        # Right after the drift, on the placement of the old stream ...
        hit = (s["records"] >= drift) & (s["records"] < drift + 4_000)
        # ... and once the last placement in force before the next drift, computed after this
        # one, is in force (the first after a drift is computed on a window mostly of the old
        # stream: its gain is within the noise of a few steps).
        later = [e["step"] for e in done
                 if drift + 2_000 <= e["records"] < drift + DRIFT_EVERY - 4_096]
        assert later, f"no placement after the drift at {drift}"
        settled = (s["step"] > later[-1]) & (s["records"] < drift + DRIFT_EVERY)
        assert settled.sum() >= 3, drift
        assert rrps(settled) < rrps(hit) < cold, (drift, rrps(hit), rrps(settled), cold)


@pytest.mark.broker
@pytest.mark.timeout(120)
def test_record_budget_is_met_when_one_rank_has_all_the_records(kafka: KafkaSettings,
                                                                 unique) -> None:
    """--max-records hands the odd records to ranks in turn; a rank whose partitions are empty
    must not keep the turn (the run would spin without a step for ever)."""
    from kafka import KafkaProducer

    from hetgmp.streaming.kafka import ensure_topic

    topic, n = unique("online-budget"), 3_001
    ensure_topic(kafka, topic, 2)
    raw = KafkaProducer(**kafka.client_kwargs(), linger_ms=20)
    for line in SyntheticStream(SYN).lines(0, n):
        raw.send(topic, value=line, partition=0)  # rank 1's partition stays empty
    raw.flush()
    raw.close()
    job = Job(KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=unique("budget-group")),
                        idle_s=60.0, poll_s=0.05),
              **EXACT, placement=Placement.hash(2), online=_online(max_records=n))
    results = launch(run_rank, job, LaunchConfig(device="cpu", workers=2, timeout_s=60))
    assert results[0].job_totals.samples == n
    assert [r.totals.counts["samples_read"] for r in results] == [n, 0]


def test_budget_shares_add_up_and_rotate() -> None:
    from hetgmp.trainer.online.budget import budget_share

    for remaining in (0, 1, 2, 7, 1000):
        for turn in range(3):
            shares = [budget_share(remaining, r, 3, turn) for r in range(3)]
            assert sum(shares) == remaining
    # One record left, the only rank with data is rank 0: it gets the turn within a round or
    # two, however many rounds pass without a step.
    assert any(budget_share(1, 0, 2, turn) == 1 for turn in (5, 6))


def test_run_ended_by_steps_counts_its_last_step(tmp_path: Path) -> None:
    job = Job(SOURCE, EXACT["model"], EXACT["store"],
              replace(EXACT["train"], steps=5),  # type: ignore[type-var]
              placement=Placement.hash(1), online=_online(checkpoint_dir=str(tmp_path)))
    result = run_rank(LocalComm(), job)
    manifest = ckpt.latest(tmp_path)
    assert result.steps == 5 and manifest is not None
    assert manifest.records == result.job_totals.samples == 5 * BATCH


def test_a_records_interval_checkpoints_on_the_step_that_reaches_it(tmp_path: Path) -> None:
    """Every 2 steps' records: steps 2, 4 and 6, not one step late (rank 0 used to decide
    before the step's records were counted, so 2 steps' worth came at step 3)."""
    online = _online(checkpoint_dir=str(tmp_path), checkpoint_interval=str(2 * BATCH),
                     max_records=6 * BATCH, keep_checkpoints=5)
    run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1), online=online))
    assert sorted(int(d.name.removeprefix("step-")) for d in tmp_path.glob("step-*")) == [2, 4, 6]


def test_checkpoint_directories_are_not_reused_by_accident(tmp_path: Path) -> None:
    online = _online(checkpoint_dir=str(tmp_path), max_records=2 * BATCH)
    run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1), online=online))
    manifest = ckpt.latest(tmp_path)
    assert manifest is not None
    before = (manifest.path / ckpt.MANIFEST).stat().st_mtime_ns
    # A fresh run may not write over another run's checkpoints ...
    with pytest.raises(ckpt.CheckpointError, match="--resume"):
        run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1), online=online))
    # ... and a resumed run with nothing left to train does not rewrite the one it resumed.
    again = run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1),
                                      online=replace(online, resume=True)))
    assert again.resumed_from == manifest.step and again.job_totals.samples == 0
    assert (manifest.path / ckpt.MANIFEST).stat().st_mtime_ns == before


def test_a_complete_checkpoint_is_durable_in_its_root(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from hetgmp.trainer.checkpoint import manifest as written

    synced: list[tuple[Path, bool]] = []
    real = written.fsync_dir

    def record(path: Path) -> None:  # which directory, and was a manifest in the root by then
        synced.append((Path(path), any(tmp_path.glob(f"*/{ckpt.MANIFEST}"))))
        real(path)

    monkeypatch.setattr(written, "fsync_dir", record)
    online = _online(checkpoint_dir=str(tmp_path), max_records=2 * BATCH)
    run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1), online=online))
    assert ckpt.latest(tmp_path) is not None
    # The root's entry for the new checkpoint directory is synced once the manifest is there.
    assert (tmp_path, True) in synced


@pytest.mark.broker
def test_records_read_ahead_for_the_warmup_are_not_checkpointed_untrained(
        kafka: KafkaSettings, unique, tmp_path: Path) -> None:
    """The static placement reads --warmup records before training them: a checkpoint taken
    while some are still waiting must not cover them."""
    topic = unique("online-warmup")
    produce(kafka, ProduceConfig(topic=topic, count=6_000, partitions=2,
                                 records_per_message=PER_MESSAGE), SYN)
    spec = KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=unique("warmup-group")),
                     idle_s=3.0, poll_s=0.05)
    train = replace(EXACT["train"], global_batch=480, warmup=3_000,  # type: ignore[type-var]
                    steps=3)
    job = Job(spec, EXACT["model"], EXACT["store"], train,
              online=_online(checkpoint_dir=str(tmp_path)))
    results = launch(run_rank, job, LaunchConfig(device="cpu", workers=2, timeout_s=60))
    trained = results[0].job_totals.samples
    # 3 steps of a warm-up of about 3,000 records read. The warm-up's batches are replayed one a
    # step as they were read, and a batch read before the broker has delivered much can be
    # short (one clean-clone CI run trained 1,200): at most 3 full steps, never all it read.
    assert 0 < trained <= 3 * 480
    manifest = ckpt.latest(tmp_path)
    assert manifest is not None and manifest.records == trained
    assert sum(manifest.offsets.values()) * PER_MESSAGE == trained


def test_sigterm_to_one_rank_stops_the_job_gracefully(tmp_path: Path) -> None:
    """A process-group SIGTERM (systemd, `kill -- -PGID`) reaches the ranks themselves: the job
    still ends with its last step, a checkpoint and exit, not with killed ranks."""
    import multiprocessing
    import os
    import signal
    import threading
    import time

    from hetgmp.trainer.dist.launcher import stop_event

    long = SyntheticSpec(SYN, start=WINDOW, records=BATCH * 2000)
    job = Job(long, **EXACT, placement=Placement.hash(2),
              online=_online(checkpoint_dir=str(tmp_path), checkpoint_interval=str(20 * BATCH)))
    results: list[RankResult] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.extend(launch(run_rank, job, LaunchConfig(device="cpu", workers=2, timeout_s=60),
                                  stop_event()))
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    ranks: list = []
    while time.monotonic() < deadline and len(ranks) < 2:
        ranks = [p for p in multiprocessing.active_children() if p.name.startswith("hetgmp-rank")]
        time.sleep(0.2)
    assert len(ranks) == 2
    while time.monotonic() < deadline and ckpt.latest(tmp_path) is None:
        time.sleep(0.2)  # training is under way once the first checkpoint is written
    first = ckpt.latest(tmp_path)
    assert first is not None
    os.kill(ranks[1].pid, signal.SIGTERM)
    thread.join(90)
    assert not errors, errors
    assert results and first.step < results[0].steps < 2000
    manifest = ckpt.latest(tmp_path)
    assert manifest is not None and manifest.step == results[0].steps


def test_samples_held_for_the_partitioner_stay_within_the_window() -> None:
    """Rank 0 keeps at most --window samples for the next partition, also when no other rank
    sends it any (here, one rank and a repartition due only after ten minutes)."""
    from contextlib import ExitStack

    from hetgmp.runtime import SystemClock
    from hetgmp.trainer.online import OnlineLoop, build_parts
    from hetgmp.trainer.sources import SyntheticShard
    from hetgmp.trainer.step import Trainer

    comm, batch, window = LocalComm(), 500, 2_000
    source = SyntheticShard(SyntheticSpec(SYN, 0, 40 * batch), batch, 0, 1)
    trainer = Trainer(comm, Placement.hash(1), len(source.schema.sparse),
                      len(source.schema.dense))
    online, clock = OnlineConfig(repartition_interval="10m", window=window), SystemClock()
    with ExitStack() as stack:
        parts = build_parts(comm, trainer, online, TrainConfig(global_batch=batch), clock,
                            stack, partition=True)
        loop = OnlineLoop(comm, trainer, source, parts, online, clock)
        for _ in range(40):
            loop.between_steps(loop.control())
            b = source.next_batch()
            loop.after_step(b, trainer.step(b), 0.0, False)
            assert loop.window_held < window + batch
        assert loop.window_held >= window


def _damage(manifest: ckpt.Manifest) -> None:
    """Flip one byte of a checkpoint's rank file (same size: only the digest can tell)."""
    f = ckpt.rank_file(manifest.path, 0)
    data = bytearray(f.read_bytes())
    data[-30] ^= 0xFF
    f.write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_is_set_aside_not_kept_over_good_ones(tmp_path: Path
                                                                          ) -> None:
    """Resuming past a damaged checkpoint: the resumed run's checkpoints are numbered below it,
    and pruning used to keep it and delete them (then commit offsets with no checkpoint left)."""
    first = _online(checkpoint_dir=str(tmp_path), checkpoint_interval=str(2 * BATCH),
                    max_records=6 * BATCH, keep_checkpoints=3)
    run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1), online=first))
    steps = sorted(int(d.name.removeprefix("step-")) for d in tmp_path.glob("step-*"))
    newest = ckpt.latest(tmp_path)
    assert len(steps) >= 2 and newest is not None and newest.step == steps[-1]
    _damage(newest)
    # The resumed run trains one step past the older checkpoint and checkpoints there: below
    # the damaged one's step.
    assert steps[-2] + 1 < steps[-1]
    again = replace(first, resume=True, checkpoint_interval=str(BATCH),
                    max_records=(steps[-2] + 1) * BATCH, keep_checkpoints=1)
    result = run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1),
                                       online=again))
    assert result.resumed_from == steps[-2]
    kept = ckpt.latest(tmp_path)
    assert kept is not None and kept.step == steps[-2] + 1
    assert (tmp_path / f"damaged-{newest.path.name}").is_dir()
    # With every checkpoint damaged, --resume stops instead of starting a new model.
    _damage(kept)
    with pytest.raises(ckpt.CheckpointError, match="passes its checks"):
        run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=Placement.hash(1), online=again))
