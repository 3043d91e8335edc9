"""Two labels (issue 56): a click and a conversion. ``hetgmp train`` trains a multi-task model
(the built-in MMoE) on them and reports each task; a model of one logit, or task weights of
another count, are refused in one line before any rank starts; a task weighted 0 leaves its head
untrained, and the Prometheus metrics show each task."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.app.cli import main
from hetgmp.trainer.dist import LocalComm
from hetgmp.trainer.model import Bags, ModelConfig
from hetgmp.trainer.run.metrics import TrainerMetrics
from hetgmp.trainer.sources import synthetic_batch
from hetgmp.trainer.step import TrainConfig, Trainer

TWO = ["--source", "synthetic", "--synthetic-shape", "user_history", "--synthetic-conversion",
       "--synthetic-vocab-max", "100000", "--embed-dim", "8", "--hidden", "32,16",
       "--global-batch", "1024", "--log-every", "0", "--threads", "1", "--timeout-s", "120"]


def test_mmoe_learns_both_tasks_and_the_summary_reports_each(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", *TWO, "--model", "mmoe", "--records", "60000", "--heldout", "10000",
                 "--workers", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    summary = json.loads(out[-1])
    tasks = summary["tasks"]
    assert list(tasks) == ["label", "conversion"]
    # Both heads learned (chance is 0.5; the ground truth's ceilings are near 0.75).
    assert tasks["label"]["heldout_auc"] > 0.6 and tasks["conversion"]["heldout_auc"] > 0.6, tasks
    assert tasks["label"]["heldout_auc"] == summary["heldout_auc"]
    assert f"conversion {round(tasks['conversion']['heldout_auc'], 4)}" in out[-2]


@pytest.mark.parametrize(("argv", "said"), [
    (["--model", "deepfm"], "model 'deepfm' predicts one label; the schema has 2 "
                            "(label, conversion)"),
    (["--model", "mmoe", "--task-weights", "1"], "--task-weights gives 1 weight(s); the schema "
                                                 "has 2 label(s)"),
    (["--model", "mmoe", "--task-weights", "1,-1"], "each must be a finite number >= 0"),
])
def test_a_model_or_weights_that_do_not_fit_the_labels_are_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    code = main(["train", *TWO, *argv, "--records", "2048", "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err


def _heads_after(weights: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """MMoE's conversion tower before and after six steps under ``weights``."""
    syn = SyntheticConfig(shape="user_history", users=500, items=800, vocab_max=5_000,
                          conversion=True, seed=2)
    schema, stream = syn.schema, SyntheticStream(syn)
    trainer = Trainer(LocalComm(), Placement.hash(1), len(schema.sparse), len(schema.dense),
                      model=ModelConfig(model="mmoe", embed_dim=4, hidden=(8,)),
                      train=TrainConfig(global_batch=256, log_every=0, task_weights=weights),
                      bags=Bags.of(schema))
    before = trainer.model.towers[1].weight.detach().clone()
    for step in range(6):
        trainer.step(synthetic_batch(stream, step * 256, 256))
    trainer.finish_step()
    return before, trainer.model.towers[1].weight.detach()


def test_a_task_weighted_zero_leaves_its_head_as_it_was() -> None:
    before, after = _heads_after((1.0, 0.0))
    assert torch.equal(before, after)
    before, after = _heads_after((1.0, 1.0))
    assert not torch.equal(before, after)


def test_the_metrics_show_each_tasks_auc() -> None:
    registry = CollectorRegistry()
    m = TrainerMetrics(registry, rank=0, staleness_bound=0)
    m.on_task_aucs({"click": 0.71, "conversion": 0.64})
    got = {labels["task"]: value for labels, value in (
        (s.labels, s.value) for f in registry.collect() if f.name == "hetgmp_task_auc"
        for s in f.samples)}
    assert got == {"click": 0.71, "conversion": 0.64}
    assert np.isclose(registry.get_sample_value("hetgmp_task_auc",
                                                {"rank": "0", "task": "conversion"}), 0.64)
