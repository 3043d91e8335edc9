"""One rank's device step (``--store-index device``) waits for the device once a step.

On a CPU nothing waits; the sync counter's audit (``trainer.syncs``) counts what would wait on
CUDA. The store's numpy initialiser, a CPU-only shortcut, is turned off so that the audited
path is the one CUDA takes; on a GPU (``cuda`` mark) torch counts the waits itself.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from exact_jobs import EXACT, SYN

from partitioner import Placement
from trainer.counters import StepCounters
from trainer.dist.comm import LocalComm
from trainer.embedding import DeviceStore
from trainer.step import Trainer
from trainer.syncs import SyncCounter
from trainer.testing import StreamSource
from trainer.types import StoreConfig

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


CUDA = [pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize(("device", "design"), [
    ("cpu", "sorted"), ("cpu", "stash"), pytest.param("cuda", "auto", marks=CUDA)])
def test_the_device_step_waits_once(device: str, design: str) -> None:
    trainer = _trainer(replace(EXACT["store"], index="device", index_design=design), device)
    store = trainer.store
    assert isinstance(store, DeviceStore)
    store.host_init = False
    source = StreamSource(SYN, BATCH, WARMUP + STEPS)
    _steps(trainer, source, WARMUP)
    rows, nbytes = len(store), store.nbytes
    with SyncCounter(device) as waits:
        _steps(trainer, source, STEPS)
    # New ids kept coming: rows were created and the store's tensors grew, without a wait.
    assert len(store) > rows and store.nbytes > nbytes
    if design != "stash":  # the design CUDA uses: one wait, the step's counts and last loss
        assert waits.count == STEPS, dict(waits.seen)
        assert device == "cuda" or waits.seen == {"tolist": STEPS}, dict(waits.seen)
    else:  # the stash's inserts read their overflow count back
        assert waits.count >= 2 * STEPS, dict(waits.seen)


def test_the_device_step_reports_each_loss_one_step_late() -> None:
    host = _trainer(EXACT["store"])
    device = _trainer(replace(EXACT["store"], index="device"))
    a = _steps(host, StreamSource(SYN, BATCH, 6), 6)
    b = _steps(device, StreamSource(SYN, BATCH, 6), 6)
    assert b[0].loss_sum == 0.0 and b[0].loss_samples == 0
    assert [(c.loss_sum, c.loss_samples) for c in b[1:]] == \
        [(c.loss_sum, c.loss_samples) for c in a[:-1]]
    assert device.totals.loss_samples == 5 * BATCH
    device.finish_step()  # training ends: the last loss is booked
    host.finish_step()
    assert device.totals.loss_samples == host.totals.loss_samples == 6 * BATCH
    assert device.totals.loss_sum == host.totals.loss_sum
