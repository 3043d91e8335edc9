"""Serving a log with lists: the serving model scores TSV lists and JSON arrays with the
trainer's own scores, for every model, with the pooling the schema gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hetgmp.partitioner import Placement
from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist import LocalComm
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import Bags, ModelConfig
from hetgmp.trainer.run import Job
from hetgmp.trainer.run.rank import model_shape
from hetgmp.trainer.serving import ServingModel, log_version
from hetgmp.trainer.sources import SyntheticSpec, synthetic_batch
from hetgmp.trainer.step import TrainConfig, Trainer

SYN = SyntheticConfig(shape="user_history", users=800, items=1_200, history_len=6, n_sparse=5,
                      seed=9)
BATCH = 256


def _trained_and_served(syn: SyntheticConfig, model: ModelConfig
                        ) -> tuple[SyntheticStream, Trainer, ServingModel]:
    """A trainer six steps into ``syn``'s stream, and a serving model holding its rows and
    dense parameters as a checkpoint and the log would give them."""
    torch.set_num_threads(1)
    stream, schema = SyntheticStream(syn), syn.schema
    store = StoreConfig(optimizer="adagrad", lr=0.05)
    train = TrainConfig(global_batch=BATCH, log_every=0)
    bags = Bags.of(schema)
    trainer = Trainer(LocalComm(), Placement.hash(1), len(schema.sparse), len(schema.dense),
                      model=model, store=store, train=train, bags=bags)
    for step in range(6):
        trainer.step(synthetic_batch(stream, step * BATCH, BATCH))
    trainer.flush()
    state = trainer.state()
    job = Job(SyntheticSpec(syn, 0, BATCH), model, store, train)
    shape = model_shape(job, len(schema.sparse), len(schema.dense), bags)
    version = log_version(1, 1)
    served = ServingModel(shape, trainer.dense.flat.detach().numpy().astype(np.float32),
                          lineage="0123456789abcdef", version=version, world=1, step=6)
    served.table.upsert(state.ids, state.rows.numpy().astype(np.float32), version)
    return stream, trainer, served


@pytest.mark.parametrize("kind", ["widedeep", "deepfm", "dcn", "dcnv2", "dlrm"])
def test_served_scores_of_lists_are_the_trainers(kind: str) -> None:
    schema = SYN.schema
    assert Bags.of(schema).jagged and Bags.of(schema).mean == (False, False, True, False, False)
    model = ModelConfig(model=kind, embed_dim=8, hidden=(16,), cross_layers=2, cross_rank=4,
                        bottom=(8,))
    stream, trainer, served = _trained_and_served(SYN, model)
    # Records after the trained ones: their rows, and rows nobody trained (initial values).
    lines = stream.lines(6 * BATCH, 64)
    tsv = Decoder(schema).decode([b"\n".join(lines)]).batch
    assert not tsv.one_value and tsv.lengths[:, 2].max() == SYN.history_len
    expected = trainer.predict(tsv)
    np.testing.assert_allclose(served.score(tsv), expected, rtol=0, atol=1e-5)
    # The same records as JSON lines with arrays: the same batch, the same scores.
    records = []
    for line in lines:
        fields = line.decode().split("\t")
        record: dict[str, object] = {"label": int(fields[0])}
        record |= {n: int(v) for n, v in zip(schema.dense, fields[1:14]) if v}
        sparse = fields[14:]
        record |= {f.name: (v.split(",") if v else []) if f.multi_valued else v
                   for f, v in zip(schema.sparse_fields, sparse)}
        records.append(json.dumps(record).encode())
    as_json = Decoder(schema, DecodeConfig(format="json")).decode([b"\n".join(records)]).batch
    assert np.array_equal(as_json.values, tsv.values)
    np.testing.assert_allclose(served.score(as_json), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["din", "user_models:build"])
def test_served_scores_of_a_sequence_model_are_the_trainers(kind: str) -> None:
    # The history kept as a sequence: DIN, and a model of the user's served by import path.
    syn = SyntheticConfig(shape="user_history", users=800, items=1_200, history_len=6,
                          n_sparse=5, seed=9, history_pooling="none", repeat_prob=0.3)
    assert Bags.of(syn.schema).sequence == (False, False, True, False, False)
    stream, trainer, served = _trained_and_served(syn, ModelConfig(model=kind, embed_dim=8,
                                                                   hidden=(16,)))
    lines = stream.lines(6 * BATCH, 64)
    batch = Decoder(syn.schema).decode([b"\n".join(lines)]).batch
    assert batch.lengths[:, 2].max() == syn.history_len
    np.testing.assert_allclose(served.score(batch), trainer.predict(batch), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("kind", "pooling", "widths"), [
    ("mmoe", "mean", ""), ("user_models:build", "none", ""),
    ("mmoe", "mean", "C2=16,C4=4"), ("user_models:build", "none", "C2=16,C4=4"),
    ("din", "none", "C2=12")])
def test_served_scores_of_a_two_task_model_are_the_trainers_per_task(
        kind: str, pooling: str, widths: str) -> None:
    # Click and conversion: the built-in MMoE on the pooled history, and a model of the user's
    # on the history as a sequence; serve answers a score a task, each the trainer's. With
    # tables of several widths (the items 16 wide, C4 4, the rest 8: rows cut in blocks of 4)
    # serve cuts and joins the rows as the trainer does.
    syn = SyntheticConfig(shape="user_history", users=800, items=1_200, history_len=6,
                          n_sparse=5, seed=9, history_pooling=pooling, conversion=kind != "din")
    stream, trainer, served = _trained_and_served(syn, ModelConfig(model=kind, embed_dim=8,
                                                                   hidden=(16,),
                                                                   table_dims=widths))
    if widths:
        assert trainer.widths.columns > 5 and served.row_dim == trainer.widths.row_dim < 8
    batch = Decoder(syn.schema).decode([b"\n".join(stream.lines(6 * BATCH, 64))]).batch
    scores = served.score(batch)
    np.testing.assert_allclose(scores, trainer.predict(batch), rtol=0, atol=1e-5)
    if kind == "din":
        return
    assert batch.labels.shape == (64, 2)
    assert scores.shape == (64, 2) and served.bags.labels == ("label", "conversion")
    assert np.abs(scores[:, 0] - scores[:, 1]).max() > 1e-3  # two heads, not one copied


@pytest.mark.parametrize("widths", ["", "C2=16,C4=4"])
def test_a_users_model_is_served_from_its_exported_program_without_its_code(
        tmp_path, widths: str) -> None:
    # A checkpoint of a user's model carries it as a torch.export program; serve scores it
    # where the user's package is gone, as the trainer does (with tables of several widths,
    # the program takes one pooled tensor a field).
    from hetgmp.trainer import checkpoint as ckpt
    from hetgmp.trainer.online import OnlineConfig
    from hetgmp.trainer.run import run_rank

    syn = SyntheticConfig(shape="user_history", users=800, items=1_200, history_len=6,
                          n_sparse=5, seed=9, history_pooling="none", repeat_prob=0.3,
                          conversion=True)
    model = ModelConfig(model="user_models:build", embed_dim=8, hidden=(16,), table_dims=widths)
    store, train = StoreConfig(optimizer="adagrad", lr=0.05), TrainConfig(global_batch=BATCH,
                                                                         log_every=0)
    online = OnlineConfig(checkpoint_dir=str(tmp_path), checkpoint_interval=str(4 * BATCH))
    run_rank(LocalComm(), Job(SyntheticSpec(syn, 0, 6 * BATCH), model, store, train,
                              placement=Placement.hash(1), online=online))
    manifest = ckpt.latest(tmp_path)
    assert manifest is not None and "model.pt2" in manifest.files
    ids, values, _, _ = ckpt.load_rows(manifest)
    flat = ckpt.load_dense(manifest)["flat"]
    program = manifest.read("model.pt2")

    def served(shape: dict, program: bytes | None, dense: np.ndarray = flat) -> ServingModel:
        s = ServingModel(shape, dense, lineage="0123456789abcdef", version=log_version(1, 1),
                         world=1, step=manifest.step, program=program)
        s.table.upsert(ids, values.astype(np.float32), log_version(1, 1))
        return s

    stream = SyntheticStream(syn)
    batch = Decoder(syn.schema).decode([b"\n".join(stream.lines(6 * BATCH, 64))]).batch
    by_code = served(manifest.extra, None).score(batch)
    # The package is gone: the path imports nothing, and the program is all there is.
    gone = {**manifest.extra, "model": "no_such_package.models:build"}
    without_code = served(gone, program).score(batch)
    assert without_code.shape == (64, 2)
    np.testing.assert_allclose(without_code, by_code, rtol=0, atol=1e-6)
    # The program holds the parameters of the checkpoint it was made at; the ones served are
    # the checkpoint's (and the log's) own.
    assert manifest.step == 6
    halved = served(gone, program, flat * 0.5).score(batch)
    assert np.abs(halved - without_code).max() > 1e-3
    with pytest.raises(Exception, match="cannot import"):
        served(gone, None)
