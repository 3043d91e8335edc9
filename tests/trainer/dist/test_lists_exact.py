"""Lists on N ranks train what one process does (s = 0, float64): multi-valued and
shared-table fields through graph placement, batch-aware routing, live migrations and a
resume, and weighted bags routed between ranks. Ranks are threads (``ThreadComm``)."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hetgmp.partitioner import Placement
from hetgmp.streaming import ClickBatch, SyntheticStream
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import LocalComm, run_threads
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import Bags, ModelConfig, pool_bags
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, graph_placement, run_jobs, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.step import TrainConfig, Trainer
from hetgmp.trainer.testing import AuditRun, ReturnState

# A history of 8 items sharing the item table (mean pooling), and MLPerf's first 8 bag sizes
# (3, 2, 1, 2, 6, 1, 1, 1; mean pooling): weighted sums come with the hand-made batches below.
HISTORY = SyntheticConfig(shape="user_history", users=1_500, items=2_500, history_len=8,
                          n_sparse=6, seed=4)
MULTI_HOT = SyntheticConfig(shape="multi_hot", n_sparse=8, vocab_max=20_000, seed=3)
WINDOW = 6_000
BATCH = 240
STEPS = 16
TRAIN = TrainConfig(staleness=0, global_batch=BATCH, replica_fraction=0.05, log_every=0,
                    dense_optimizer="adam")
EXACT = dict(model=ModelConfig(model="dlrm", embed_dim=8, hidden=(16,), dtype="float64"),
             store=StoreConfig(optimizer="adagrad", lr=0.05), train=TRAIN)
STATE = (ReturnState,)


def _source(config: SyntheticConfig) -> SyntheticSpec:
    return SyntheticSpec(config, start=WINDOW, records=BATCH * STEPS)


def _window(config: SyntheticConfig) -> tuple[np.ndarray, np.ndarray]:
    stream = SyntheticStream(config)
    return stream.sample_csr(stream.take(0, WINDOW))


@functools.lru_cache(maxsize=None)
def _graph(config: SyntheticConfig) -> Placement:
    return graph_placement(_window(config), 2, TRAIN)


@functools.lru_cache(maxsize=None)
def _reference(config: SyntheticConfig):
    torch.set_num_threads(1)
    return run_rank(LocalComm(), Job(_source(config), **EXACT, placement=Placement.hash(1),
                                     observers=STATE))


# multi_hot in the slow lane: the fast lane's 40 s budget (user_history covers the path).
@pytest.mark.parametrize("config", [HISTORY, pytest.param(MULTI_HOT, marks=pytest.mark.slow)],
                         ids=["user_history", "multi_hot"])
def test_lists_on_two_ranks_equal_one_process(config: SyntheticConfig, max_diff) -> None:
    graph = _graph(config)
    assert graph.replica_counts().min() > 0
    routed = replace(TRAIN, route_rounds=3, route_epsilon=0.25)
    jobs = [Job(_source(config), **EXACT, placement=Placement.hash(2), observers=STATE),
            Job(_source(config), EXACT["model"], EXACT["store"], routed, placement=graph,
                observers=STATE)]
    per_rank = run_threads(run_jobs, jobs, 2)
    for job in range(len(jobs)):
        ranks = [r[job] for r in per_rank]
        dense, emb = max_diff(_reference(config), ranks)
        assert dense <= 1e-6 and emb <= 1e-6, (job, dense, emb)
        totals = ranks[0].job_totals
        assert totals.samples == BATCH * STEPS and totals.counts["remote_rows"] > 0
    routed_totals = per_rank[0][1].job_totals
    assert routed_totals.counts["replica_pushes"] > 0
    assert routed_totals.counts["samples_routed_out"] > 0


def test_the_graph_of_a_shared_table_reads_one_row_for_an_item_in_either_field() -> None:
    # The history looks up the item table: the same item in the item field and in a history
    # is one id, one row, one vertex of the graph.
    stream = SyntheticStream(HISTORY)
    block = stream.take(0, 2_000)
    values, lengths = stream.sparse(block)
    starts = np.concatenate([[0], np.cumsum(lengths.reshape(-1))[:-1]]).reshape(lengths.shape)
    items = values[starts[:, 1]]
    history = np.concatenate([values[s:s + n] for s, n in zip(starts[:, 2], lengths[:, 2])])
    assert np.intersect1d(items, history).size > 100


def test_lists_stay_exact_through_live_migrations_and_a_resume(tmp_path: Path,
                                                                max_diff) -> None:
    world, config = 2, HISTORY
    stream = SyntheticStream(config)
    values, _ = stream.sparse(stream.take(0, WINDOW + BATCH * STEPS))
    ids = np.unique(values)
    rng = np.random.default_rng(5)
    owners = rng.integers(0, world, ids.size)
    reps = tuple(np.sort(rng.choice(ids[owners != w], 200, replace=False)) for w in range(world))
    schedule = ((2, _graph(config).with_version(1)), (6, Placement(2, world, ids, owners, reps)),
                (11, Placement.hash(world, 3)))
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                          migration_chunk_bytes=96 * 1500)
    ranks = run_threads(run_rank, Job(_source(config), **EXACT, placement=Placement.hash(2),
                                      online=online, schedule=schedule,
                                      observers=(ReturnState, AuditRun)), world)
    dense, emb = max_diff(_reference(config), ranks)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
    done = [e for e in ranks[0].online["events"] if e["event"] == "migration_done"]
    assert [e["version"] for e in done] == [1, 2, 3]
    assert ranks[0].observed["owner_checks"] >= 3
    # Half a run checkpointed on two ranks, resumed on two: the same model.
    half = replace(online, checkpoint_dir=str(tmp_path), max_records=BATCH * STEPS // 2)
    first = run_threads(run_rank, Job(_source(config), **EXACT, placement=_graph(config),
                                      online=half), world)
    assert first[0].steps == STEPS // 2
    resume = replace(online, checkpoint_dir=str(tmp_path), resume=True)
    resumed = run_threads(run_rank, Job(_source(config), **EXACT, placement=Placement.hash(2),
                                        online=resume, observers=STATE), world)
    assert resumed[0].resumed_from == STEPS // 2 and resumed[0].steps == STEPS
    dense, emb = max_diff(_reference(config), resumed)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)


# -- weighted bags, step by step ---------------------------------------------------------------

FIELDS, DENSE = 3, 2
BAGS = Bags(mean=(False, True, False), jagged=True, weighted=True)


def _weighted_batches(steps: int, size: int) -> list[ClickBatch]:
    """Random global batches: a one-value field, a mean-pooled list, a weighted list (empty
    bags among them), ids from a small vocabulary so that rows repeat across samples."""
    rng = np.random.default_rng(11)
    out = []
    for _ in range(steps):
        lengths = np.stack([np.ones(size), rng.integers(0, 5, size), rng.integers(0, 4, size)],
                           axis=1).astype(np.int32)
        nnz = int(lengths.sum())
        values = rng.integers(0, 400, nnz, dtype=np.int64)
        weights = rng.uniform(0.1, 2.0, nnz).astype(np.float32)
        unknown = np.full(size, -1, np.int64)
        out.append(ClickBatch(rng.integers(0, 2, size).astype(np.float32),
                              rng.normal(size=(size, DENSE)).astype(np.float32), values, lengths,
                              unknown.astype(np.int32), unknown, unknown.copy(), weights))
    return out


def _train(comm, batches: list[ClickBatch]) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    world = comm.world
    placement = Placement.hash(world)
    trainer = Trainer(comm, placement, FIELDS, DENSE, model=EXACT["model"], store=EXACT["store"],
                      train=replace(TRAIN, global_batch=batches[0].labels.size, route_rounds=2,
                                    route_epsilon=0.5), bags=BAGS)
    for batch in batches:
        n = len(batch)
        share = batch.take(slice(comm.rank * n // world, (comm.rank + 1) * n // world))
        trainer.step(share)
    trainer.flush()
    state = trainer.state()
    rows = dict(zip(state.ids.tolist(), state.rows.numpy()))
    return rows, [v.numpy() for v in state.dense.values()]


def test_weighted_bags_routed_between_ranks_train_what_one_process_does() -> None:
    batches = _weighted_batches(8, 120)
    torch.set_num_threads(1)
    one_rows, one_dense = _train(LocalComm(), batches)
    ranks = run_threads(lambda comm, _: _train(comm, batches), None, 2)
    rows: dict[int, np.ndarray] = {}
    for r, _ in ranks:
        rows.update(r)
    assert rows.keys() == one_rows.keys()
    assert max(float(np.abs(rows[k] - one_rows[k]).max()) for k in rows) <= 1e-9
    for dense in (d for _, d in ranks):
        assert max(float(np.abs(a - b).max()) for a, b in zip(dense, one_dense)) <= 1e-9


def test_a_batch_of_lists_pools_each_bag_as_embedding_bag_does() -> None:
    batch = _weighted_batches(1, 50)[0]
    rows = torch.randn(batch.values.size, 8, dtype=torch.float64)
    pooled = pool_bags(rows, torch.from_numpy(batch.lengths), torch.from_numpy(batch.weights),
                       torch.tensor(BAGS.mean))
    at = 0
    for b, row in enumerate(batch.lengths.tolist()):
        for f, n in enumerate(row):
            bag = rows[at:at + n] * torch.from_numpy(batch.weights[at:at + n]).double()[:, None]
            want = bag.sum(0) / (max(n, 1) if BAGS.mean[f] else 1)
            assert torch.allclose(pooled[b, f], want), (b, f)
            at += n



@pytest.mark.parametrize("longest,vocab", [(4, 300), (300, 1_000), (70_000, 1 << 40)],
                         ids=["bytes", "uint16-lengths", "uint32-lengths-and-positions"])
def test_a_routed_block_of_lists_reads_back_whole(longest: int, vocab: int) -> None:
    from hetgmp.trainer.step.message import pack_lists, unpack_lists

    rng = np.random.default_rng(longest)
    n = 40
    lengths = rng.integers(0, 4, (n, FIELDS)).astype(np.int32)
    lengths[3, 1] = longest  # one long list sets the width of the block's lengths
    nnz = int(lengths.sum())
    batch = ClickBatch(rng.integers(0, 2, n).astype(np.float32),
                       rng.normal(size=(n, DENSE)).astype(np.float32),
                       rng.integers(0, vocab, nnz, dtype=np.int64), lengths,
                       np.full(n, -1, np.int32), np.full(n, -1, np.int64),
                       np.full(n, -1, np.int64), rng.uniform(0, 1, nnz).astype(np.float32))
    counts = np.array([15, 0, 25])  # three ranks' blocks, one empty
    words, sizes = pack_lists(batch, counts, weighted=True)
    back = unpack_lists(words, counts, sizes, FIELDS, DENSE, weighted=True)
    for name in ("labels", "dense", "values", "lengths", "weights"):
        assert np.array_equal(getattr(back, name), getattr(batch, name)), name
