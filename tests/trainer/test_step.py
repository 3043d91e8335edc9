"""One rank's step waits for the device once a step, and carries its loss to the next.

On a CPU nothing waits; the sync counter's audit (``trainer.step.syncs``) counts what would wait on
CUDA. The store's numpy initialiser, a CPU-only shortcut, is turned off so that the audited
path is the one CUDA takes; on a GPU (``cuda`` mark) torch counts the waits itself.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from exact_jobs import EXACT, SYN

from hetgmp.partitioner import Placement
from hetgmp.trainer.dist import StepCounters
from hetgmp.trainer.dist.comm import LocalComm
from hetgmp.trainer.embedding import EmbeddingStore, StoreConfig
from hetgmp.trainer.step import SyncCounter, Trainer
from hetgmp.trainer.testing import StreamSource

BATCH, WARMUP, STEPS = 256, 2, 12


def _trainer(store: StoreConfig, device: str = "cpu") -> Trainer:
    settings = {**EXACT, "train": replace(EXACT["train"], global_batch=BATCH), "store": store}
    return Trainer(LocalComm(device), Placement.hash(1), len(SYN.schema.sparse),
                   len(SYN.schema.dense), **settings)  # type: ignore[arg-type]


def _steps(trainer: Trainer, source: StreamSource, n: int) -> list[StepCounters]:
    out = []
    for _ in range(n):
        c = trainer.step(source.next_batch())
        assert c is not None
        out.append(c)
    return out


def _losses_read_at_once(store: StoreConfig, n: int) -> list[float]:
    """Each step's own summed loss, read back right after it (a trainer that finishes every
    step: the totals grow by that step's loss)."""
    trainer, source, out, before = _trainer(store), StreamSource(SYN, BATCH, n), [], 0.0
    for _ in range(n):
        assert trainer.step(source.next_batch()) is not None
        trainer.finish_step()
        total = trainer.totals.loss_sum
        out.append(total - before)
        before = total
    return out


CUDA = [pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("admit_after", [0, pytest.param(2, marks=pytest.mark.slow)],
                         ids=["all admitted", "admission"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_a_step_waits_once(device: str, admit_after: int) -> None:
    trainer = _trainer(replace(EXACT["store"], admit_after=admit_after), device)
    store = trainer.store
    store.cpu_shortcuts = False
    source = StreamSource(SYN, BATCH, WARMUP + STEPS)
    _steps(trainer, source, WARMUP)
    rows, nbytes = len(store), store.nbytes
    with SyncCounter(device) as waits:
        _steps(trainer, source, STEPS)
    # New ids kept coming: rows were created and the store's tensors grew, without a wait.
    assert len(store) > rows and store.nbytes > nbytes
    assert not admit_after or store.stats.not_admitted_reads > 0
    # One wait: the step's counts and the last loss.
    assert waits.count == STEPS, dict(waits.seen)
    assert device == "cuda" or waits.seen == {"tolist": STEPS}, dict(waits.seen)


@pytest.mark.parametrize("store", [
    pytest.param(StoreConfig(optimizer="adagrad", lr=0.05, admit_after=3), marks=pytest.mark.slow),
    StoreConfig(optimizer="sgd", lr=0.1, admit_after=2, evict_after=3, max_rows=2_000),
], ids=["admission", "admission, eviction, cap"])
def test_cudas_branch_trains_what_the_cpus_shortcuts_train(store: StoreConfig) -> None:
    host = _trainer(store)  # a CPU's default: numpy initial rows, the count read first
    device = _trainer(store)
    device.store.cpu_shortcuts = False
    _steps(host, StreamSource(SYN, BATCH, 16), 16)
    _steps(device, StreamSource(SYN, BATCH, 16), 16)
    want, got = host.state(), device.state()
    assert host.store.stats.not_admitted_reads > 0
    assert store.max_rows == 0 or host.store.stats.evicted > 0
    assert host.store.stats == device.store.stats
    np.testing.assert_array_equal(want.ids, got.ids)
    np.testing.assert_array_equal(want.versions, got.versions)
    assert torch.equal(want.rows, got.rows)
    assert all(torch.equal(want.dense[k], got.dense[k]) for k in want.dense)


def test_a_step_reports_each_loss_one_step_late() -> None:
    own = _losses_read_at_once(EXACT["store"], 6)
    device = _trainer(EXACT["store"])
    b = _steps(device, StreamSource(SYN, BATCH, 6), 6)
    assert b[0].loss_sum == 0.0 and b[0].loss_samples == 0
    assert [c.loss_sum for c in b[1:]] == pytest.approx(own[:-1], rel=1e-12)
    assert [c.loss_samples for c in b[1:]] == [BATCH] * 5
    assert device.totals.loss_samples == 5 * BATCH
    device.finish_step()  # training ends: the last loss is booked
    assert device.totals.loss_samples == 6 * BATCH
    assert device.totals.loss_sum == pytest.approx(sum(own), rel=1e-12)


def test_a_whole_run_waits_once_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # run_rank's loop around the step (control agreement, progressive scores, metrics-free
    # logs) adds no wait a step at one rank: two runs differ by exactly their step counts.
    from exact_jobs import SOURCE

    from hetgmp.trainer.run import Job, run_rank

    init = EmbeddingStore.__init__

    def audited(self: EmbeddingStore, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        self.cpu_shortcuts = False

    monkeypatch.setattr(EmbeddingStore, "__init__", audited)
    waits = {}
    for steps in (5, 20):
        job = Job(replace(SOURCE, records=240 * steps), **EXACT,  # type: ignore[arg-type]
                  placement=Placement.hash(1), progressive=480)
        with SyncCounter("cpu") as counter:
            run_rank(LocalComm(), job)
        waits[steps] = counter.count
    assert waits[20] - waits[5] == 15, waits


def test_a_loss_read_back_early_is_carried_by_the_next_step() -> None:
    # flush / predict / state / checkpoints finish the step and read its loss back: the next
    # step's counters still carry it, so the per-step losses (the metric) miss none.
    own = _losses_read_at_once(EXACT["store"], 6)
    device = _trainer(EXACT["store"])
    source = StreamSource(SYN, BATCH, 6)
    b = _steps(device, source, 2)
    device.flush()
    assert device.loss_finite
    b += _steps(device, source, 4)
    assert [c.loss_sum for c in b[1:]] == pytest.approx(own[:-1], rel=1e-12)
    device.flush()
    assert device.totals.loss_sum == pytest.approx(sum(own), rel=1e-12)
    assert device.totals.loss_samples == 6 * BATCH


def test_a_diverged_step_is_caught_before_the_next_checkpoint() -> None:
    device = _trainer(EXACT["store"])
    source = StreamSource(SYN, BATCH, 2)
    _steps(device, source, 1)
    with torch.no_grad():
        device.dense.flat.fill_(float("nan"))  # the next step's loss is NaN
    c = device.step(source.next_batch())
    assert c is not None and np.isfinite(c.loss_sum)  # it carries the step before's loss
    assert not device.loss_finite  # read back now: what a checkpoint or publish asks first
