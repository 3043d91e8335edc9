"""The training step in one process (LocalComm): routing messages, learning, memory bound."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from hetgmp.partitioner import Placement
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.embedding.migrate import move_chunk
from hetgmp.trainer.embedding.replicas import ReplicaTable
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.run import graph_placement
from hetgmp.trainer.sources import SyntheticShard, SyntheticSpec, shard_bounds, synthetic_batch
from hetgmp.trainer.step import TrainConfig, Trainer
from hetgmp.trainer.step.message import pack_ids, unpack_ids

SYN = SyntheticConfig(vocab_max=5_000, seed=5)
SMALL = ModelConfig(model="deepfm", embed_dim=8, hidden=(16,))


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_routing_message_round_trips_exactly() -> None:
    batch = synthetic_batch(SyntheticStream(SYN), 0, 50)
    back = unpack_ids(pack_ids(batch), 26, 13)
    assert np.array_equal(back.ids, batch.ids)
    assert np.array_equal(back.labels, batch.labels) and np.array_equal(back.dense, batch.dense)


def test_shards_split_each_global_batch_in_order() -> None:
    spec = SyntheticSpec(SYN, start=100, records=1000)
    whole = synthetic_batch(SyntheticStream(SYN), 100, 1000)
    shards = [SyntheticShard(spec, 300, r, 3) for r in range(3)]
    assert all(s.steps == 4 for s in shards)  # 300, 300, 300, 100
    for step in range(4):
        parts = [s.next_batch() for s in shards]
        size = min(300, 1000 - 300 * step)
        assert [len(p) for p in parts] == [hi - lo for lo, hi in
                                           (shard_bounds(size, r, 3) for r in range(3))]
        glued = np.concatenate([p.ids for p in parts])
        assert np.array_equal(glued, whole.ids[300 * step:300 * step + size])
    assert all(s.exhausted and len(s.next_batch()) == 0 for s in shards)


def _train(model: ModelConfig, steps: int, tail: int = 0
           ) -> tuple[Trainer, list[float], SyntheticShard]:
    """One rank trained on ``steps`` batches of 256 and, with ``tail``, a last one of that many
    records: the trainer, its losses, the spent shard."""
    trainer = Trainer(LocalComm(), Placement.hash(1), 26, 13, model=model,
                      train=TrainConfig(global_batch=256, dense_lr=3e-3))
    shard = SyntheticShard(SyntheticSpec(SYN, records=256 * steps + tail), 256, 0, 1)
    losses = []
    while not shard.exhausted:
        c = trainer.step(shard.next_batch())
        assert c is not None
        if c.loss_samples:  # a step's counters carry the loss of the step before
            losses.append(c.loss_sum / c.loss_samples)
    trainer.finish_step()  # the last step's loss, read back into the totals
    assert trainer.totals.loss_samples == 256 * steps + tail  # every sample's loss, once
    return trainer, losses, shard


def test_training_lowers_the_loss_and_prediction_creates_no_rows() -> None:
    trainer, losses, shard = _train(SMALL, 60)
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.02
    rows = len(trainer.store)
    unseen = synthetic_batch(SyntheticStream(SyntheticConfig(seed=99)), 0, 100)
    p = trainer.predict(unseen)
    assert p.shape == (100,) and ((p > 0) & (p < 1)).all()
    assert len(trainer.store) == rows
    assert trainer.step(shard.next_batch(), exhausted=True) is None  # the one-rank job is over


@pytest.mark.slow
def test_eviction_bounds_the_store_on_an_endless_stream() -> None:
    store = StoreConfig(evict_after=8, max_rows=3_000)
    trainer = Trainer(LocalComm(), Placement.hash(1), 26, 13, model=SMALL, store=store,
                      train=TrainConfig(global_batch=128))
    shard = SyntheticShard(SyntheticSpec(SyntheticConfig(seed=1), records=128 * 80), 128, 0, 1)
    sizes = []
    while not shard.exhausted:
        trainer.step(shard.next_batch())
        sizes.append(len(trainer.store))
    assert trainer.store.stats.evicted > 0
    # The cap holds at the end of every step (it used to be checked every 16 steps only, and
    # a store ran 8% over it in between); the rows of one step are the most it is passed by.
    assert max(sizes) <= 3_000
    assert sum(s >= trainer.store.low_water for s in sizes) >= 10  # the cap did the work


def test_the_replica_budget_basis_reaches_the_partitioner() -> None:
    ids = SyntheticStream(SyntheticConfig(seed=4)).feature_ids(0, 4000)
    distinct = np.unique(ids).size
    table = graph_placement(ids, 2, TrainConfig(replica_fraction=0.02), seed=4)
    touched = graph_placement(ids, 2, TrainConfig(replica_fraction=0.02,
                                                  replica_basis="touched"), seed=4)
    # Counted against the whole window (the default), every rank gets 2% of all its rows (it
    # has more candidates than that); counted against its own rows, fewer.
    assert table.replica_counts().tolist() == [int(0.02 * distinct)] * 2
    assert (touched.replica_counts() < table.replica_counts()).all()


def test_a_copy_of_a_row_about_to_move_here_stops_the_chunk() -> None:
    # A placement never replicates a row where it is owned, so a chunk never finds one; if
    # replica sets and placement ever fell out of step, the copy's unpushed updates would be
    # lost when the rank starts reading the row itself: the chunk refuses instead.
    trainer = Trainer(LocalComm(), Placement.hash(1), 26, 13, model=SMALL,
                      train=TrainConfig(global_batch=64))
    to_me = np.zeros(2, np.int32)
    report = move_chunk(trainer.comm, trainer.store, trainer.replicas, np.array([5, 9]), to_me, to_me, 0)
    assert report.ids == 2 and report.rows_sent == 0
    trainer.replicas = ReplicaTable(np.array([7, 9]), SMALL.row_dim, trainer.store.optimizer,
                                    dtype=trainer.dtype, device=trainer.comm.device)
    with pytest.raises(RuntimeError, match=r"holds copies of 1 row\(s\) it is about to own "
                                           r"\(e.g. id 9\)"):
        move_chunk(trainer.comm, trainer.store, trainer.replicas, np.array([5, 9]), to_me, to_me, 0)


@pytest.mark.slow
def test_bf16_autocast_trains_in_float32_with_bf16_matmuls() -> None:
    # --autocast bf16: the model's forward runs under bf16 autocast (its logits differ from
    # float32's by bf16 rounding, not more), the loss falls as in float32, and parameters and
    # rows stay float32.
    full, full_losses, _ = _train(replace(SMALL, autocast="off"), 40)
    half, half_losses, _ = _train(replace(SMALL, autocast="bf16"), 40)
    assert np.mean(half_losses[-10:]) < np.mean(half_losses[:10]) - 0.02
    assert abs(np.mean(half_losses[-10:]) - np.mean(full_losses[-10:])) < 0.01
    gap = (half.last_logits - full.last_logits).abs().max().item()
    assert 0 < gap < 0.5, gap
    assert half.dense.flat.dtype == torch.float32 and half.store.export()[1].dtype == torch.float32
    with pytest.raises(ValueError, match="float32"):
        ModelConfig(dtype="float64", autocast="bf16")


@pytest.mark.slow
def test_compiled_model_trains_as_the_eager_one() -> None:
    # --compile on: the training forward and backward run through torch.compile. In float64 the
    # compiled kernels may sum in another order, nothing more: over 11 steps of 256 and a short
    # last one of 100 (which the dynamic batch dimension takes without recompiling) every loss
    # a step carries (each the step before's),
    # the dense parameters and the rows match eager training to 1e-9.
    f64 = replace(SMALL, dtype="float64")
    eager, eager_losses, _ = _train(f64, 11, tail=100)
    compiled, compiled_losses, _ = _train(replace(f64, compile="on"), 11, tail=100)
    assert compiled.train_forward is not compiled.model and len(compiled_losses) == 11
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-9)
    np.testing.assert_allclose(compiled.dense.flat.numpy(), eager.dense.flat.numpy(),
                               rtol=1e-9, atol=1e-12)
    ids, rows = eager.store.export()[:2]
    np.testing.assert_allclose(compiled.store.peek(ids).numpy(), rows.numpy(),
                               rtol=1e-9, atol=1e-12)
