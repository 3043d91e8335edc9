"""Multi-rank training with gloo against single-process training (invariants 2 and 3).

The ranks of one launch run several jobs in a row (one process group), since starting ranks is
what costs the most here; the single-process references run in the test process through the
very same code (``run_rank`` with a ``LocalComm``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from exact_jobs import BATCH, DCN_SGD, EXACT, SOURCE, STEPS, SYN, WINDOW

from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist import KINDS, LaunchConfig
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.run import Job, RankResult, graph_placement, run_jobs, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.step import TrainConfig
from hetgmp.trainer.testing import AuditRun, RecordSteps, ReturnState

pytestmark = pytest.mark.distributed

STALE_S = 3
# Dense parameters past comm's all-gather threshold (64 kB), so that the trainer's dense
# all-reduce goes by gloo's ring, left running into the next step.
WIDE = dict(EXACT, model=replace(EXACT["model"], hidden=(256,)))

# The AUC comparison runs on the default synthetic stream (the benchmark's), small model.
AUC_SYN = SyntheticConfig(seed=7)
AUC_WINDOW = SyntheticSpec(AUC_SYN, 0, 30_000)
AUC_JOB = dict(
    source=SyntheticSpec(AUC_SYN, 30_000, 80_000),
    heldout=SyntheticSpec(AUC_SYN, 110_000, 20_000),
    model=ModelConfig(model="deepfm", embed_dim=8, hidden=(32, 16)),
    store=StoreConfig(),
    train=TrainConfig(staleness=10, global_batch=1024, log_every=0),
)


def _placement(world: int) -> Placement:
    ids = SyntheticStream(SYN).feature_ids(WINDOW.start, WINDOW.records)
    placement = graph_placement(ids, world, EXACT["train"])
    assert placement.replica_counts().min() > 0  # the test is about replicas too
    return placement


def _jobs() -> list[Job]:
    """The jobs of the 2-rank launch (at three ranks the same protocols run on threads:
    tests/trainer/dist/test_threads.py)."""
    world = 2
    graph = _placement(world)
    jobs = [
        Job(SOURCE, **EXACT, placement=Placement.hash(world), observers=(ReturnState,)),
        Job(SOURCE, **EXACT, placement=graph, observers=(ReturnState,)),
        Job(SOURCE, **DCN_SGD, placement=graph, observers=(ReturnState,)),
    ]
    stale = replace(EXACT["train"], staleness=STALE_S)
    jobs.append(Job(SOURCE, EXACT["model"], EXACT["store"], stale, placement=graph,
                    observers=(AuditRun, RecordSteps)))
    # Batch-aware routing moves samples between ranks: what is computed must not change.
    batched = replace(EXACT["train"], route_rounds=3, route_epsilon=0.25)
    jobs.append(Job(SOURCE, EXACT["model"], EXACT["store"], batched, placement=graph,
                    observers=(ReturnState,)))
    auc_ids = SyntheticStream(AUC_SYN).feature_ids(AUC_WINDOW.start, AUC_WINDOW.records)
    auc_graph = graph_placement(auc_ids, 2, AUC_JOB["train"])  # type: ignore[arg-type]
    jobs.append(Job(**AUC_JOB, placement=auc_graph))  # type: ignore[arg-type]
    jobs.append(Job(SOURCE, **WIDE, placement=graph, observers=(ReturnState,)))
    return jobs


@pytest.fixture(scope="module")
def two_ranks() -> list[list[RankResult]]:
    """Results by job, then by rank, of one 2-rank launch."""
    per_rank = launch(run_jobs, _jobs(), LaunchConfig(device="cpu", workers=2, timeout_s=120))
    return [list(r) for r in zip(*per_rank)]


@pytest.fixture(scope="module")
def single() -> dict[str, RankResult]:
    torch.set_num_threads(1)
    one = Placement.hash(1)
    return {
        "deepfm": run_rank(LocalComm(), Job(SOURCE, **EXACT, placement=one, observers=(ReturnState,))),
        "dcn": run_rank(LocalComm(), Job(SOURCE, **DCN_SGD, placement=one, observers=(ReturnState,))),
        "auc": run_rank(LocalComm(), Job(**AUC_JOB, placement=one)),  # type: ignore[arg-type]
        "wide": run_rank(LocalComm(), Job(SOURCE, **WIDE, placement=one, observers=(ReturnState,))),
    }


@pytest.mark.parametrize("job,model", [(0, "deepfm"), (1, "deepfm"), (2, "dcn"), (4, "deepfm"),
                                       (6, "wide")],
                         ids=["hash", "graph-replicas", "graph-replicas-dcn-sgd",
                              "graph-batch-aware-routing", "graph-replicas-ring-all-reduce"])
def test_two_ranks_s0_equal_single_process(two_ranks, single, max_diff, job: int,
                                           model: str) -> None:
    ranks = two_ranks[job]
    dense, emb = max_diff(single[model], ranks)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
    totals = ranks[0].job_totals
    assert totals.steps == STEPS and totals.samples == BATCH * STEPS
    # Each rank counts the loss of the samples it trained; the job's is the global batches'.
    one = single[model].job_totals
    assert totals.loss_samples == one.loss_samples == BATCH * STEPS
    assert totals.loss_sum == pytest.approx(one.loss_sum, rel=1e-9)
    assert totals.counts["remote_rows"] > 0  # rows did cross ranks
    if job > 0:
        assert totals.counts["replica_reads"] > 0 and totals.counts["replica_pushes"] > 0
        assert totals.max_staleness == 0


def test_staleness_never_exceeds_bound(two_ranks, recount_lags) -> None:
    ranks = two_ranks[3]
    totals = ranks[0].job_totals
    hist = totals.staleness
    assert totals.max_staleness <= STALE_S
    assert hist[1:].sum() > 0 and hist[STALE_S] > 0  # reads did use lagging copies, up to s
    assert totals.counts["replica_refreshes"] < totals.counts["replica_reads"]
    assert 0 < totals.counts["replica_pushes"] < totals.counts["replica_reads"]
    for r in ranks:  # per step, too
        assert all(c.staleness.size <= STALE_S + 1 for c in r.observed["step_counters"])
    # Independent check: recount from what owners applied, not from the lags they kept.
    lags = recount_lags(ranks)
    assert lags.size > 0 and lags.max() <= STALE_S
    assert np.array_equal(np.bincount(lags, minlength=hist.size), hist)


def test_two_ranks_s10_reach_single_process_auc(two_ranks, single) -> None:
    ranks, reference = two_ranks[5], single["auc"]
    totals = ranks[0].job_totals
    assert totals.samples == reference.job_totals.samples == 80_000
    assert totals.max_staleness == 10 and totals.counts["replica_pushes"] > 0
    assert reference.heldout_auc is not None and reference.heldout_auc > 0.7  # it learned
    assert ranks[0].heldout_auc is not None
    assert abs(ranks[0].heldout_auc - reference.heldout_auc) <= 0.005


def test_counters_add_up(two_ranks) -> None:
    for ranks in two_ranks:
        t = ranks[0].job_totals
        c = t.counts
        assert c["owned_reads"] + c["replica_reads"] + c["remote_rows"] == c["unique_ids"]
        assert c["rows_served"] == c["remote_rows"] + c["replica_refreshes"]
        assert c["samples_read"] == c["samples_trained"] == t.counts["global_samples"]
        assert t.embedding_bytes > 0 and t.dense_bytes > 0
        # Every step's dense all-reduce is counted once, the last one (finished after the
        # loop) included.
        assert t.traffic.calls[KINDS.index("dense")] == t.steps
        # Bytes sent by all ranks = bytes received by all ranks.
        assert int(t.traffic.sent.sum()) == int(t.traffic.received.sum())


def test_local_view_reads_owned_rows_and_unfilled_copies_from_owners(targets) -> None:
    for cases in launch(targets.local_view_reads, None, LaunchConfig(device="cpu", workers=2, timeout_s=120)):
        assert [c[0] for c in cases] == ["unfilled copies", "filled copies",
                                         "copy of a row still owned here"]
        assert all(expected and nonzero for _, expected, nonzero in cases), cases
