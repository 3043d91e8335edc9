"""CowClip across ranks (ranks as threads): with the clip on and an L2 penalty, s = 0 training on
N ranks equals one process (float64), with ids that occur many times in a batch, copies that
push, and rows that change owner mid-run; at s > 0 the counts that ride with the copies'
pushes change nothing the clip does not bound."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
import torch
from exact_jobs import BATCH, EXACT, SYN, WINDOW

from hetgmp.partitioner import Placement
from hetgmp.streaming import SyntheticStream
from hetgmp.trainer.dist import LocalComm, run_threads
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, graph_placement, run_jobs, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.testing import ReturnState

STEPS = 24
SOURCE = SyntheticSpec(SYN, start=WINDOW.records, records=BATCH * STEPS)
# A ratio small enough that most rows' gradients are clipped at this batch (a mean-loss
# gradient is about count / batch times a sample's: r = 1 clips none of them here), and an L2
# penalty: every part of the rule changes the model.
CLIPPED = replace(EXACT["store"], clip="cowclip", clip_ratio=0.01, clip_min=1e-3, l2=0.5)


@functools.lru_cache(maxsize=None)
def _graph(world: int) -> Placement:
    ids = SyntheticStream(SYN).feature_ids(WINDOW.start, WINDOW.records)
    return graph_placement(ids, world, EXACT["train"])


def _job(store: object = CLIPPED, placement: Placement | None = None, **kw: object) -> Job:
    return Job(SOURCE, EXACT["model"], store, EXACT["train"],  # type: ignore[arg-type]
               placement=placement or Placement.hash(1), observers=(ReturnState,),
               **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def clipped_one() -> object:
    torch.set_num_threads(1)
    return run_rank(LocalComm(), _job())


def test_the_clip_changes_the_model_and_ids_repeat_in_batches(clipped_one, max_diff) -> None:
    # Without this the exactness below would say nothing about the clip.
    plain = run_rank(LocalComm(), _job(EXACT["store"]))
    dense, emb = max_diff(plain, [clipped_one])
    assert emb > 1e-3 and dense > 1e-4, (dense, emb)
    ids = SyntheticStream(SYN).feature_ids(SOURCE.start, BATCH)
    assert np.unique(ids, return_counts=True)[1].max() >= 20  # a hot id, many times a batch


def test_s0_with_the_clip_on_threads_equals_one_process(clipped_one, max_diff) -> None:
    graph = _graph(2)
    jobs = [_job(placement=Placement.hash(2)), _job(placement=graph)]
    per_rank = run_threads(run_jobs, jobs, 2)
    for job in range(len(jobs)):
        ranks = [r[job] for r in per_rank]
        dense, emb = max_diff(clipped_one, ranks)
        assert dense <= 1e-9 and emb <= 1e-9, (job, dense, emb)
        if job:  # copies read, and pushed at every step (s = 0), each clipped by its owner
            counts = ranks[0].job_totals.counts
            assert counts["replica_pushes"] > 0 and counts["replica_reads"] > 0


def test_rows_that_change_owner_keep_s0_with_the_clip_exact(clipped_one, max_diff) -> None:
    rng = np.random.default_rng(5)
    ids = np.unique(SyntheticStream(SYN).feature_ids(0, WINDOW.records + BATCH * STEPS))
    owners = rng.integers(0, 2, ids.size)
    reps = tuple(np.sort(rng.choice(ids[owners != w], 300, replace=False)) for w in range(2))
    schedule = ((3, _graph(2).with_version(1)), (9, Placement(2, 2, ids, owners, reps)),
                (16, Placement.hash(2, 3)))
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                          migration_chunk_bytes=96 * 6000)
    ranks = run_threads(run_rank, _job(placement=Placement.hash(2), online=online,
                                       schedule=schedule), 2)
    dense, emb = max_diff(clipped_one, ranks)
    assert dense <= 1e-9 and emb <= 1e-9, (dense, emb)
    done = [e for e in ranks[0].online["events"] if e["event"] == "migration_done"]
    assert [e["version"] for e in done] == [1, 2, 3]


def test_at_s3_counts_ride_with_pushes_and_change_nothing_unbounded() -> None:
    # A ratio no gradient reaches: each factor is exactly 1, so the job must train bit for bit
    # what it trains without the clip, while its copies push accumulated gradients with
    # their summed counts (the count column travels in every gradient message).
    train = replace(EXACT["train"], staleness=3)
    loose = replace(EXACT["store"], clip="cowclip", clip_ratio=1e9)

    def job(store: object) -> Job:
        return Job(SOURCE, EXACT["model"], store, train,  # type: ignore[arg-type]
                   placement=_graph(2), observers=(ReturnState,))

    with_counts, without = run_threads(run_jobs, [job(loose), job(EXACT["store"])], 2)[0]
    assert with_counts.job_totals.counts["replica_pushes"] > 0
    assert with_counts.job_totals.staleness[1:].sum() > 0  # copies read behind their owners
    a, b = with_counts.observed["state"], without.observed["state"]
    assert torch.equal(a.rows, b.rows) and np.array_equal(a.ids, b.ids)
    assert all(torch.equal(a.dense[k], b.dense[k]) for k in a.dense)


@pytest.mark.slow  # counting the waits dispatches every op through Python
def test_the_clip_adds_no_wait_for_the_device() -> None:
    # Invariant 8: the counts, the L2 term, the clip's factors and its tally stay on the
    # device; a step at 2 ranks still waits twice (CUDA's branch, as test_exchange audits it).
    from hetgmp.runtime import FakeClock
    from hetgmp.trainer.step import SyncCounter, Trainer
    from hetgmp.trainer.testing import StreamSource

    source = StreamSource(SYN, BATCH, 6)
    batches = [source.next_batch() for _ in range(6)]

    def run(comm, _: None) -> tuple[float, dict[str, int]]:
        trainer = Trainer(comm, Placement.hash(2), len(SYN.schema.sparse), len(SYN.schema.dense),
                          clock=FakeClock(), model=EXACT["model"], store=CLIPPED,
                          train=replace(EXACT["train"], staleness=2))
        trainer.store.cpu_shortcuts = False
        counter = SyncCounter("cpu")
        for step, batch in enumerate(batches):
            share = batch.take(np.arange(comm.rank, BATCH, comm.world))
            if step < 2:
                trainer.step(share)
                continue
            with counter:
                trainer.step(share)
        return counter.count / 4, dict(counter.seen)

    for waits, seen in run_threads(run, None, 2):
        assert waits == 2 and seen == {"tolist": 8}, seen
