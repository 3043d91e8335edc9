"""The fast lane: ranks as threads of one process (``ThreadComm``), and the multi-rank protocols
on it. The same invariants the spawned gloo tests check, in seconds: s = 0 training on N ranks
equals one process, live migrations keep it exact, copies never lag more than s updates."""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from exact_jobs import BATCH, DCN_SGD, EXACT, SYN, WINDOW

from hetgmp.partitioner import Placement
from hetgmp.streaming import SyntheticStream
from hetgmp.trainer.dist import LocalComm, ThreadComm, run_threads
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, graph_placement, run_jobs, run_rank
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.testing import AuditRun, ReturnState

STATE = (ReturnState,)
# Fewer steps than the gloo tests' (exact_jobs.STEPS): the lane's budget is seconds.
STEPS = 24
SOURCE = SyntheticSpec(SYN, start=WINDOW.records, records=BATCH * STEPS)
# The progressive AUC's window: not a whole number of steps, nor of a rank's share of one.
PROGRESSIVE = 5 * BATCH + 7


# -- the communicator -------------------------------------------------------------------------


def _collectives(comm: ThreadComm, _: None) -> dict[str, object]:
    me, world = comm.rank, comm.world
    # Rank r sends r + d + 1 rows of (r, d) to rank d: uneven splits, empty ones for none.
    counts = [me + d + 1 for d in range(world)]
    send = torch.cat([torch.tensor([[me, d]] * n) for d, n in enumerate(counts)])
    got = comm.all_to_all(send, counts, [s + me + 1 for s in range(world)], "route")
    heard = comm.exchange_counts(np.arange(world)[:, None] * 10 + me)
    summed = torch.tensor([0.1 * (me + 1), 1e-9 * me], dtype=torch.float64)
    comm.all_reduce_sum(summed)
    big = torch.full((20_000,), float(me))  # past the gather threshold: the ring's bytes
    pending = comm.start_all_reduce_sum(big)
    dense_before_wait = int(comm.traffic.sent[7])  # as gloo's: counted when waited for
    pending.wait()
    seed = torch.full((3,), float(me))
    comm.broadcast_(seed, src=1)
    return {"got": got, "heard": heard, "summed": summed, "big": big, "seed": seed,
            "objects": comm.all_gather_object(me * me), "from_2": comm.broadcast_object(me, 2),
            "traffic": comm.traffic, "dense_before_wait": dense_before_wait}


def test_thread_collectives_move_what_gloo_would() -> None:
    world = 3
    out = run_threads(_collectives, None, world)
    for me, r in enumerate(out):
        expected = torch.cat([torch.tensor([[s, me]] * (s + me + 1)) for s in range(world)])
        assert torch.equal(r["got"], expected)
        assert r["heard"][:, 0].tolist() == [me * 10 + s for s in range(world)]
        assert r["objects"] == [0, 1, 4] and r["from_2"] == 2
        assert torch.equal(r["seed"], torch.full((3,), 1.0))
        assert torch.equal(r["big"], torch.full((20_000,), 3.0))
    # Every rank gets the same bits of a sum.
    assert all(torch.equal(r["summed"], out[0]["summed"]) for r in out)
    traffic = out[1]["traffic"]
    route, dense = 0, 7  # trainer.dist.counters.KINDS
    rows = 16  # two int64 a row
    assert traffic.sent[route] == (sum(1 + d + 1 for d in range(world)) - 3) * rows
    assert traffic.received[route] == (sum(s + 1 + 1 for s in range(world)) - 3) * rows
    # Written out, not computed with the function that counts: the small sum goes as a
    # gather (every other rank's 16 bytes), the large one as a ring (2 (N - 1) / N of 80 kB).
    assert out[1]["dense_before_wait"] == 2 * 16
    assert traffic.sent[dense] == 2 * 16 + 2 * 2 * 80_000 // 3


def test_a_failing_rank_fails_the_job_at_once_not_after_the_timeout() -> None:
    def work(comm: ThreadComm, _: None) -> None:
        if comm.rank == 1:
            raise ValueError("rank 1 broke")
        comm.barrier()  # would wait for rank 1 for ever

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 failed: ValueError: rank 1 broke"):
        run_threads(work, None, 3, timeout_s=60)
    assert time.monotonic() - t0 < 10


# -- the protocols ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _graph(world: int) -> Placement:
    ids = SyntheticStream(SYN).feature_ids(WINDOW.start, WINDOW.records)
    return graph_placement(ids, world, EXACT["train"])


@pytest.fixture(scope="module")
def reference() -> dict[str, object]:
    torch.set_num_threads(1)
    one = Placement.hash(1)
    return {name: run_rank(LocalComm(), Job(SOURCE, **settings, placement=one, observers=STATE,
                                            progressive=PROGRESSIVE))
            for name, settings in (("deepfm", EXACT), ("dcn", DCN_SGD))}


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_s0_on_threads_equals_one_process(world: int, reference, max_diff) -> None:
    graph = _graph(world)
    assert graph.replica_counts().min() > 0
    jobs = [Job(SOURCE, **EXACT, placement=Placement.hash(world), observers=STATE),
            Job(SOURCE, **EXACT, placement=graph, observers=STATE),
            Job(SOURCE, **DCN_SGD, placement=graph, observers=STATE),
            # Batch-aware routing moves samples between ranks: what is computed must not change.
            Job(SOURCE, EXACT["model"], EXACT["store"],
                replace(EXACT["train"], route_rounds=3, route_epsilon=0.25), placement=graph,
                observers=STATE)]
    jobs = [replace(job, progressive=PROGRESSIVE) for job in jobs]
    per_rank = run_threads(run_jobs, jobs, world)
    for job, model in enumerate(["deepfm", "deepfm", "dcn", "deepfm"]):
        ranks = [r[job] for r in per_rank]
        dense, emb = max_diff(reference[model], ranks)
        assert dense <= 1e-6 and emb <= 1e-6, (job, dense, emb)
        totals = ranks[0].job_totals
        assert totals.samples == BATCH * STEPS and totals.counts["remote_rows"] > 0
        if job:
            assert totals.counts["replica_pushes"] > 0 and totals.max_staleness == 0
        # The progressive AUC is over the job's last samples, however unequal the ranks'
        # shares of them (graph placement, routing): one process's figure (the ranks' scores
        # differ from its own in the last bits only).
        one = reference[model]
        assert ranks[0].progressive_auc == pytest.approx(one.progressive_auc, abs=1e-9), job
        assert ranks[0].progressive_logloss == pytest.approx(one.progressive_logloss,
                                                             rel=1e-9), job


def _schedule(world: int) -> tuple[tuple[int, Placement], ...]:
    rng = np.random.default_rng(5)
    ids = np.unique(SyntheticStream(SYN).feature_ids(0, WINDOW.records + BATCH * STEPS))
    owners = rng.integers(0, world, ids.size)
    reps = tuple(np.sort(rng.choice(ids[owners != w], 300, replace=False)) for w in range(world))
    return ((3, _graph(world).with_version(1)), (9, Placement(2, world, ids, owners, reps)),
            (16, Placement.hash(world, 3)))


def test_live_migrations_on_threads_keep_s0_training_exact(reference, max_diff) -> None:
    online = OnlineConfig(repartition_interval="0", drift_threshold=0.0,
                          migration_chunk_bytes=96 * 6000)
    job = Job(SOURCE, **EXACT, placement=Placement.hash(2), online=online,
              schedule=_schedule(2), observers=(ReturnState, AuditRun))
    ranks = run_threads(run_rank, job, 2)
    dense, emb = max_diff(reference["deepfm"], ranks)
    assert dense <= 1e-6 and emb <= 1e-6, (dense, emb)
    done = [e for e in ranks[0].online["events"] if e["event"] == "migration_done"]
    assert [e["version"] for e in done] == [1, 2, 3]
    assert sum(1 for h in ranks[0].online["history"] if h[6]) >= 3  # steps during migrations
    assert ranks[0].observed["owner_checks"] >= 3  # invariant 1 checked after every chunk


@pytest.mark.slow  # the bound on gloo ranks: tests/trainer/test_distributed.py
def test_copies_on_threads_never_lag_more_than_s(recount_lags) -> None:
    # The exchange keeps the copies' flags and lags as tensors: the bound holds, recounted from
    # what the owners applied.
    s = 3
    job = Job(SOURCE, EXACT["model"], EXACT["store"], replace(EXACT["train"], staleness=s),
              placement=_graph(3), observers=(AuditRun,))
    ranks = run_threads(run_rank, job, 3)
    hist = ranks[0].job_totals.staleness
    assert ranks[0].job_totals.max_staleness <= s and hist[s] > 0
    lags = recount_lags(ranks)  # from what the owners applied, not from the lags they kept
    assert lags.size == ranks[0].job_totals.counts["replica_reads"] and lags.max() <= s
    assert np.array_equal(np.bincount(lags, minlength=hist.size), hist)


def test_a_local_error_in_a_collective_is_not_blamed_on_a_peer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from hetgmp.trainer.dist import PeerLost, peers
    from hetgmp.trainer.dist.peers import Peers

    monkeypatch.setattr(peers, "_SETTLE_S", 0.2)  # both "peers" here live on: no wait for them
    alone = Peers(0, ("here", "here"), (os.getpid(), os.getpid()))  # both ranks alive
    with pytest.raises(RuntimeError, match="split sizes") as info:
        with alone.watch("route"):
            raise RuntimeError("split sizes do not add up")
    assert not isinstance(info.value, PeerLost)
    with pytest.raises(PeerLost, match="the route collective failed on rank 0: a peer"):
        with alone.watch("route"):
            raise RuntimeError("Connection closed by peer [127.0.0.1]:41623")
    gone = Peers(0, ("here", "here"), (os.getpid(), 2**22 + 12345))  # no such process
    with pytest.raises(PeerLost, match=r"rank 1 \(pid \d+\) of this machine is gone"):
        with gone.watch("dense"):
            raise RuntimeError("CUDA out of memory")


def test_a_peer_still_exiting_when_its_connection_breaks_is_named() -> None:
    # A peer's sockets close while its process exits, before /proc stops showing it: the
    # survivor hears "reset by peer" from a process still there for a moment. Here the peer
    # is killed half a second after the error.
    import os
    import subprocess
    import sys
    import threading

    from hetgmp.trainer.dist import PeerLost
    from hetgmp.trainer.dist.peers import Peers

    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reaper = threading.Timer(0.5, lambda: (peer.kill(), peer.wait()))
    try:
        peers = Peers(0, ("here", "here"), (os.getpid(), peer.pid))
        reaper.start()
        with pytest.raises(PeerLost, match=rf"rank 1 \(pid {peer.pid}\) of this machine is gone"):
            with peers.watch("window"):
                raise RuntimeError("Read error [127.0.0.1]:8386: Connection reset by peer")
    finally:
        reaper.cancel()
        peer.kill()
        peer.wait()
