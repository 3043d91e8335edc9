"""The row exchange at more ranks (``RowExchange``), on ranks that are threads (``ThreadComm``).

The exchange takes one of two branches: CUDA's (the padded ids searched whole, owners found on
the device, nothing read before the split sizes) and a CPU's shortcuts (the distinct count read
first, owners found in numpy). Each test trains one job per branch on the same stream and
compares what they hold bit for bit, with every part of the protocol exercised; the waits are
the sync counter's audit of CUDA's branch (what would wait on CUDA). That s = 0 on N ranks
equals one process is ``tests/trainer/dist/test_threads.py``'s.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import replace

import numpy as np
import pytest
import torch
from exact_jobs import EXACT, SYN

from hetgmp.partitioner import Placement
from hetgmp.runtime import FakeClock
from hetgmp.streaming import ClickBatch, SyntheticStream
from hetgmp.trainer.dist import ThreadComm, run_threads
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.embedding.exchange import DevicePlacement
from hetgmp.trainer.step import SyncCounter, Trainer
from hetgmp.trainer.testing import StreamSource

BATCH, STEPS = 240, 10


def _explicit(world: int, replicas: int = 0) -> Placement:
    """Every id of the stream's first records placed at random (none where hash would put it
    by design), ``replicas`` copies a rank."""
    rng = np.random.default_rng(7)
    ids = np.unique(SyntheticStream(SYN).feature_ids(0, BATCH * STEPS))
    owners = rng.integers(0, world, ids.size).astype(np.int32)
    reps = tuple(np.sort(rng.choice(ids[owners != w], replicas, replace=False))
                 for w in range(world))
    return Placement(1, world, ids, owners, reps)


@functools.cache
def _batches(steps: int) -> tuple[ClickBatch, ...]:
    """The global batches of the test's stream, made once for every rank and run."""
    source = StreamSource(SYN, BATCH, steps)
    return tuple(source.next_batch() for _ in range(steps))


def _share(step: int, comm: ThreadComm, steps: int = 0) -> ClickBatch:
    """This rank's share of global batch ``step`` (of a stream of ``steps``, STEPS by
    default)."""
    return _batches(steps or STEPS)[step].take(np.arange(comm.rank, BATCH, comm.world))


def _copies(world: int, n: int, version: int) -> Placement:
    """Hash owners, and ``n`` copies a rank of rows it does not own."""
    rng = np.random.default_rng(version)
    ids = np.unique(SyntheticStream(SYN).feature_ids(0, BATCH * STEPS))
    owners = Placement.hash(world).owner_of(ids)
    reps = tuple(np.sort(rng.choice(ids[owners != w], n, replace=False)) for w in range(world))
    return Placement(version, world, ids, owners.astype(np.int32), reps)


def test_the_device_placement_owns_what_the_placement_owns() -> None:
    rng = np.random.default_rng(1)
    extremes = np.array([0, -1, 1, 2**63 - 1, -2**63], np.int64)
    # 3, 5, 17 and 257 divide 2**16 - 1: the limbs' order would not show under them alone.
    for placement in (Placement.hash(2), Placement.hash(7), Placement.hash(64),
                      _explicit(3), _explicit(4)):
        placed = placement.ids[rng.integers(0, max(1, placement.ids.size), 500)] \
            if placement.ids.size else extremes
        ids = np.concatenate([placed, extremes, rng.integers(-2**63, 2**63 - 1, 5000,
                                                             dtype=np.int64)])
        got = DevicePlacement(placement, torch.device("cpu")).owner_of(torch.from_numpy(ids))
        np.testing.assert_array_equal(got.numpy(), placement.owner_of(ids))


def _train(comm: ThreadComm, task: dict[str, object]) -> dict[str, object]:
    train = replace(EXACT["train"], global_batch=BATCH, staleness=int(task.get("s", 0)))
    settings = {**EXACT, "train": train, "store": task["store"]}
    trainer = Trainer(comm, task["placement"], len(SYN.schema.sparse), len(SYN.schema.dense),
                      clock=FakeClock(), **settings)  # type: ignore[arg-type]
    # CUDA's branch, unless the test asks for the CPU's.
    trainer.store.cpu_shortcuts = bool(task.get("shortcuts", False))
    # Counting waits dispatches every op through Python: only where the test looks at them.
    counter = SyncCounter("cpu")
    for step in range(STEPS):
        with counter if step >= 2 and task.get("waits") else contextlib.nullcontext():
            c = trainer.step(_share(step, comm))
        assert c is not None
    trainer.finish_step()
    totals = trainer.totals
    return {"state": trainer.state(), "stats": trainer.store.stats,
            "versions": trainer.store.versions(trainer.store.ids()),
            "counts": totals.counts, "traffic": totals.traffic, "staleness": totals.staleness,
            "copies": torch.cat([trainer.replicas.values, trainer.replicas.state,
                                 trainer.replicas.pending_grad], 1),
            "loss": (totals.loss_sum, totals.loss_samples),
            "waits": counter.count / (STEPS - 2), "seen": dict(counter.seen)}


STORES = [
    StoreConfig(optimizer="adagrad", lr=0.05),
    StoreConfig(optimizer="adagrad", lr=0.05, admit_after=3),
    StoreConfig(optimizer="sgd", lr=0.1, admit_after=2, evict_after=3, max_rows=1_500),
]


def _cases() -> list[object]:
    """Each placement (hash, explicit owners, explicit owners with copies at s = 0 and s = 3)
    at 3 ranks with the store that does everything (admission, eviction, a cap), marked slow;
    at 2 ranks, in the fast lane, each store config once and each placement at least once.
    The branches differ in how the exchange finds owners and splits ids, which the placement
    and the ranks drive; the store's options ride along (one case each is enough for them)."""
    names = ["plain", "admission", "admission, eviction, cap"]
    chosen = [(3, "hash", 0, 2), (3, "explicit", 0, 2), (3, "copies", 0, 2), (3, "copies", 3, 2),
              (2, "hash", 0, 0), (2, "explicit", 0, 1), (2, "copies", 0, 2), (2, "copies", 3, 1)]
    out = []
    for world, kind, s, k in chosen:
        placement = Placement.hash(world) if kind == "hash" else \
            _explicit(world, 150 if kind == "copies" else 0)
        marks = (pytest.mark.slow,) if world == 3 or k == 1 else ()
        out.append(pytest.param(world, placement, s, STORES[k], marks=marks,
                                id=f"{world} ranks, {kind}, s={s}, {names[k]}"))
    return out


@pytest.mark.parametrize(("world", "placement", "s", "store"), _cases())
def test_cudas_branch_trains_what_the_cpus_shortcuts_train(
        world: int, placement: Placement, s: int, store: StoreConfig) -> None:
    _compare(world, placement, store, s=s)


def _compare(world: int, placement: Placement, store: StoreConfig, *, s: int) -> None:
    host = run_threads(_train, {"store": store, "placement": placement, "s": s,
                                "shortcuts": True}, world)
    device = run_threads(_train, {"store": store, "placement": placement, "s": s}, world)
    assert host[0]["counts"]["remote_rows"] > 0 and host[0]["counts"]["rows_served"] > 0
    if any(r.size for r in placement.replicas):  # the copies' protocol ran, every part of it
        counts = host[0]["counts"]
        assert min(counts["replica_reads"], counts["replica_refreshes"],
                   counts["replica_pushes"]) > 0, counts
        assert s == 0 or host[0]["staleness"][1:].sum() > 0  # reads within the bound, behind
    if store.admit_after:
        assert sum(r["stats"].not_admitted_reads for r in host) > 0
    if store.max_rows:
        assert sum(r["stats"].evicted for r in host) > 0
    for want, got in zip(host, device):
        a, b = want["state"], got["state"]
        np.testing.assert_array_equal(a.ids, b.ids)
        assert torch.equal(a.rows, b.rows)
        assert all(torch.equal(a.dense[k], b.dense[k]) for k in a.dense)
        np.testing.assert_array_equal(want["versions"], got["versions"])
        assert want["stats"] == got["stats"]
        assert want["counts"] == got["counts"]  # reads, copies read, refreshed, pushed ...
        np.testing.assert_array_equal(want["staleness"], got["staleness"])
        assert torch.equal(want["copies"], got["copies"])
        # The same messages: bytes sent and received of every kind.
        assert np.array_equal(want["traffic"].sent, got["traffic"].sent)
        assert np.array_equal(want["traffic"].received, got["traffic"].received)
        assert want["loss"][1] == got["loss"][1]
        assert got["loss"][0] == pytest.approx(want["loss"][0], rel=1e-12)
    assert sum(r["loss"][1] for r in device) == BATCH * STEPS  # routed: not a share each


@pytest.mark.slow  # counting the waits dispatches every op through Python
@pytest.mark.parametrize(("world", "copies"), [(2, 0), (2, 150), (3, 0), (3, 150)])
def test_a_step_at_more_ranks_waits_twice(world: int, copies: int) -> None:
    # The split sizes (with the last loss) and the owner's lookup (with the refresh counts
    # and the lags read), with copies or without. The step's header and the routed samples
    # go host to host (Comm.host_all_to_all): no copy out of the device.
    placement = _explicit(world, copies) if copies else Placement.hash(world)
    got = run_threads(_train, {"store": STORES[1], "placement": placement, "s": 3,
                               "waits": True}, world)
    for r in got:
        assert r["waits"] == 2 and r["seen"] == {"tolist": 2 * (STEPS - 2)}, r["seen"]


def test_copies_that_change_between_steps_stay_exact() -> None:
    _copies_change()


def _copies_change() -> None:
    # Copies come (step 4) and go (step 8) between steps, as the online loop changes them:
    # flush, new replica sets, a new placement. The exchange follows each change (sync) and
    # CUDA's branch trains what the CPU's does, at s = 2 (copies behind their owners across
    # the changes).
    def run(comm: ThreadComm, shortcuts: bool) -> dict[str, object]:
        settings = {**EXACT, "train": replace(EXACT["train"], global_batch=BATCH, staleness=2),
                    "store": STORES[1]}
        trainer = Trainer(comm, Placement.hash(2), len(SYN.schema.sparse),
                          len(SYN.schema.dense), clock=FakeClock(),
                          **settings)  # type: ignore[arg-type]
        trainer.store.cpu_shortcuts = shortcuts
        for step in range(12):
            if step in (4, 8):  # the same owners throughout; only the copies change
                trainer.flush()
                placement = _copies(2, 60 if step == 4 else 0, step)
                trainer.replace_replicas(placement.replicas)
                trainer.set_placement(placement)
            assert trainer.step(_share(step, comm, 12)) is not None
        trainer.finish_step()
        totals = trainer.totals
        return {"state": trainer.state(), "counts": totals.counts,
                "loss": (totals.loss_sum, totals.loss_samples)}

    host = run_threads(run, True, 2)
    device = run_threads(run, False, 2)
    assert host[0]["counts"]["replica_pushes"] > 0
    for want, got in zip(host, device):
        assert got["counts"] == want["counts"]
        assert got["loss"][1] == want["loss"][1]
        assert got["loss"][0] == pytest.approx(want["loss"][0], rel=1e-12)
        assert torch.equal(want["state"].rows, got["state"].rows)
        assert all(torch.equal(want["state"].dense[k], got["state"].dense[k])
                   for k in want["state"].dense)


@pytest.mark.slow
def test_the_branches_agree_on_a_loaded_machine(hog: None) -> None:
    # Each comparison again, twice, with a busy process beside the test and its threads
    # switched every 10 us: both jobs of a comparison must take the same decisions whatever
    # the machine does. They did not while the routing choice (--route-rounds -1) read the
    # wall clock: a probe on a loaded machine turned batch-aware routing on in one job and off
    # in the other, which then routed, read and trained other rows (hence the FakeClock).
    for _ in range(2):
        for world, placement, s, store in [(p.values[:4]) for p in _cases()
                                           if p.values[0] == 2]:
            _compare(world, placement, store, s=s)  # type: ignore[arg-type]
        _copies_change()
