"""The model contract (issue 56): a model of the user's, named by import path, trains on
pooled fields, a sequence field and dense features, with two labels (click and conversion);
N ranks equal one process at s = 0 (float64) through live migrations and a resume; a model
that reads a field the schema lacks, or returns the wrong shape, is refused with one line
before any rank starts."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.partitioner import Placement
from hetgmp.streaming import SyntheticStream
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import LocalComm, run_threads
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import Bags, ModelConfig, ModelError, ModelSpec, build_model, check_model
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, graph_placement, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.step import TrainConfig
from hetgmp.trainer.testing import AuditRun, ReturnState

# The history kept as a sequence of 8 rows of the item table; two labels.
HISTORY = SyntheticConfig(shape="user_history", users=1_500, items=2_500, history_len=8,
                          n_sparse=6, seed=4, history_pooling="none", repeat_prob=0.3,
                          conversion=True)
WINDOW, BATCH, STEPS = 6_000, 240, 12
TRAIN = TrainConfig(staleness=0, global_batch=BATCH, replica_fraction=0.05, log_every=0,
                    task_weights=(1.0, 0.5))
EXACT = dict(model=ModelConfig(model="user_models:build", embed_dim=8, dtype="float64"),
             store=StoreConfig(optimizer="adagrad", lr=0.05), train=TRAIN)
# Tables of three widths: the items (the candidate and the history) 16 wide, C4 4, the rest 8
# (rows stored in blocks of 4).
WIDTHS = {"one width": "", "three widths": "C2=16,C4=4"}
SOURCE = SyntheticSpec(HISTORY, start=WINDOW, records=BATCH * STEPS)


@functools.lru_cache(maxsize=None)
def _graph() -> Placement:
    stream = SyntheticStream(HISTORY)
    return graph_placement(stream.sample_csr(stream.take(0, WINDOW)), 2, TRAIN)


def _exact(widths: str) -> dict:
    return {**EXACT, "model": replace(EXACT["model"], table_dims=widths)}


@functools.lru_cache(maxsize=None)
def _reference(widths: str = ""):
    torch.set_num_threads(1)
    return run_rank(LocalComm(), Job(SOURCE, **_exact(widths), placement=Placement.hash(1),
                                     observers=(ReturnState,)))


def test_the_spec_names_pooled_and_sequence_fields_and_their_tables() -> None:
    spec = ModelSpec.of_bags(EXACT["model"], Bags.of(HISTORY.schema), 6, 13)
    history = HISTORY.schema.sparse[2]
    assert spec.sequences == ((history, 8),) and history not in spec.pooled
    assert spec.tasks == 2 and spec.labels == ("label", "conversion")
    assert spec.table_of(history) == spec.table_of(HISTORY.schema.sparse[1])


@pytest.mark.parametrize("widths", WIDTHS.values(), ids=WIDTHS.keys())
def test_a_users_model_on_two_ranks_trains_what_one_process_does_through_migrations_and_a_resume(
        tmp_path: Path, max_diff, widths: str) -> None:
    world = 2
    exact = _exact(widths)
    stream = SyntheticStream(HISTORY)
    values, _ = stream.sparse(stream.take(0, WINDOW + BATCH * STEPS))
    ids = np.unique(values)
    rng = np.random.default_rng(5)
    owners = rng.integers(0, world, ids.size)
    reps = tuple(np.sort(rng.choice(ids[owners != w], 200, replace=False)) for w in range(world))
    schedule = ((2, _graph().with_version(1)), (6, Placement(2, world, ids, owners, reps)),
                (9, Placement.hash(world, 3)))
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                          migration_chunk_bytes=96 * 1500)
    ranks = run_threads(run_rank, Job(SOURCE, **exact, placement=Placement.hash(2),
                                      online=online, schedule=schedule,
                                      observers=(ReturnState, AuditRun)), world)
    dense, emb = max_diff(_reference(widths), ranks)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
    assert [e["version"] for e in ranks[0].online["events"]
            if e["event"] == "migration_done"] == [1, 2, 3]
    half = replace(online, checkpoint_dir=str(tmp_path), max_records=BATCH * STEPS // 2)
    run_threads(run_rank, Job(SOURCE, **exact, placement=_graph(), online=half), world)
    resume = replace(online, checkpoint_dir=str(tmp_path), resume=True)
    resumed = run_threads(run_rank, Job(SOURCE, **exact, placement=Placement.hash(2),
                                        online=resume, observers=(ReturnState,)), world)
    assert resumed[0].resumed_from == STEPS // 2 and resumed[0].steps == STEPS
    dense, emb = max_diff(_reference(widths), resumed)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)


@pytest.mark.parametrize(("factory", "said"), [
    ("user_models:missing_field", "reads a field this schema does not give it: 'clicked_ad'"),
    ("user_models:wrong_shape", "returned (3, 5) for 3 records"),
    ("user_models:nowhere", "'user_models' has no function 'nowhere'"),
    ("no_such_package.models:build", "cannot import 'no_such_package.models'"),
])
def test_a_model_that_cannot_train_on_the_schema_is_refused_in_one_line(factory: str,
                                                                        said: str) -> None:
    config = ModelConfig(model=factory, embed_dim=4)
    spec = ModelSpec.of_bags(config, Bags.of(HISTORY.schema), 6, 13)
    with pytest.raises(ModelError) as exc:
        check_model(build_model(config, 6, 13, spec), spec)
    line = str(exc.value)
    assert said in line and factory in line and "\n" not in line, line


def test_a_pooled_models_on_a_schema_with_a_sequence_is_refused_by_name() -> None:
    config = ModelConfig(model="deepfm", embed_dim=4)
    spec = ModelSpec.of_bags(config, Bags.of(HISTORY.schema), 6, 13)
    with pytest.raises(ModelError, match="model 'deepfm' reads pooled fields only"):
        build_model(config, 6, 13, spec)


def test_tables_of_three_widths_resume_on_another_number_of_ranks(tmp_path: Path,
                                                                  max_diff) -> None:
    # Two ranks checkpoint halfway, one rank goes on: the rows' blocks are read back a file at
    # a time whoever owns them now, and training ends where one process ends.
    exact = _exact(WIDTHS["three widths"])
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0)
    half = replace(online, checkpoint_dir=str(tmp_path), max_records=BATCH * STEPS // 2)
    run_threads(run_rank, Job(SOURCE, **exact, placement=_graph(), online=half), 2)
    resume = replace(online, checkpoint_dir=str(tmp_path), resume=True)
    resumed = run_rank(LocalComm(), Job(SOURCE, **exact, placement=Placement.hash(1),
                                        online=resume, observers=(ReturnState,)))
    assert resumed.resumed_from == STEPS // 2 and resumed.steps == STEPS
    dense, emb = max_diff(_reference(WIDTHS["three widths"]), [resumed])
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
