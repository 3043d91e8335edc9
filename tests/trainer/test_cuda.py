"""Training on CUDA gives the model that training on CPU gives (float64): alone, through an
NCCL group, and (with two GPUs) on two NCCL ranks against one process.

Skipped where torch sees no GPU, as in CI; on a GPU machine ``make test-gpu`` runs these with
the store's tests on CUDA. One GPU runs all of them but the two-rank one.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from exact_jobs import BATCH, DCN_SGD, EXACT, SOURCE, STEPS, SYN, WINDOW

from hetgmp.partitioner import Placement
from hetgmp.runtime import free_port
from hetgmp.streaming.synthetic import SyntheticStream
from hetgmp.trainer.app.cli import main as cli
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.dist.launcher import launch, run_torchrun
from hetgmp.trainer.run import Job, RankResult, graph_placement, run_jobs, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.testing import ReturnState

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

HELDOUT = SyntheticSpec(SYN, start=SOURCE.start + SOURCE.records, records=4_000)
SETTINGS = {"deepfm": EXACT, "dcn": DCN_SGD}


def _job(model: str, placement: Placement) -> Job:
    return Job(SOURCE, **SETTINGS[model], placement=placement, heldout=HELDOUT,
               observers=(ReturnState,))


@pytest.fixture(scope="module")
def on_cpu() -> dict[str, RankResult]:
    """The reference: one process on CPU, through the same code."""
    return {m: run_rank(LocalComm("cpu"), _job(m, Placement.hash(1))) for m in SETTINGS}


def _same_model(reference: RankResult, results: list[RankResult], max_diff) -> None:
    dense, emb = max_diff(reference, results)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
    totals = results[0].job_totals
    assert totals.samples == BATCH * STEPS
    assert totals.loss_sum == pytest.approx(reference.job_totals.loss_sum, rel=1e-9)
    assert results[0].heldout_auc == pytest.approx(reference.heldout_auc, abs=1e-9)


@pytest.mark.parametrize("model", list(SETTINGS))
def test_one_rank_on_cuda_trains_the_model_cpu_trains(on_cpu, max_diff, model: str) -> None:
    result = run_rank(LocalComm("cuda"), _job(model, Placement.hash(1)))
    _same_model(on_cpu[model], [result], max_diff)


def test_one_rank_on_cuda_with_the_model_compiled_trains_the_model_cpu_trains(
        on_cpu, max_diff) -> None:
    # --compile on on CUDA: the compiled forward and backward on the GPU against eager
    # training on CPU, float64.
    settings = dict(EXACT, model=replace(EXACT["model"], compile="on"))  # type: ignore[arg-type]
    job = Job(SOURCE, **settings, placement=Placement.hash(1), heldout=HELDOUT,
              observers=(ReturnState,))
    _same_model(on_cpu["deepfm"], [run_rank(LocalComm("cuda"), job)], max_diff)


def test_an_nccl_group_trains_the_model_one_process_trains(
    on_cpu, max_diff, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The DistComm path (NCCL collectives on CUDA tensors, object broadcasts from the GPU) in a
    # group of one, started as torchrun starts a rank.
    for name, value in {"RANK": 0, "WORLD_SIZE": 1, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}.items():
        monkeypatch.setenv(name, str(value))
    result = run_torchrun(run_rank, _job("deepfm", Placement.hash(1)),
                          LaunchConfig(workers=1, device="cuda"))
    _same_model(on_cpu["deepfm"], [result], max_diff)


@pytest.mark.distributed
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_nccl_ranks_s0_train_the_model_one_process_trains(on_cpu, max_diff) -> None:
    ids = SyntheticStream(SYN).feature_ids(WINDOW.start, WINDOW.records)
    graph = graph_placement(ids, 2, EXACT["train"])  # type: ignore[arg-type]
    assert graph.replica_counts().min() > 0
    jobs = [_job("deepfm", Placement.hash(2)), _job("deepfm", graph), _job("dcn", graph)]
    per_rank = launch(run_jobs, jobs, LaunchConfig(workers=2, device="cuda", timeout_s=120))
    for job, model in enumerate(["deepfm", "deepfm", "dcn"]):
        ranks = [r[job] for r in per_rank]
        _same_model(on_cpu[model], ranks, max_diff)
        assert ranks[0].job_totals.counts["remote_rows"] > 0


def test_hetgmp_train_runs_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli(["train", "--device", "cuda", "--workers", "1", "--records", "8192", "--warmup", "4000",
                 "--heldout", "4000", "--synthetic-vocab-max", "20000", "--embed-dim", "8",
                 "--hidden", "16", "--global-batch", "512", "--log-every", "0",
                 "--repartition-interval", "0"])
    assert code == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["workers"] == 1 and s["samples"] == 8192 and s["device"] == "cuda"
    assert 0.5 < s["heldout_auc"] < 1.0
