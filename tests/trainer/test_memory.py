"""Memory stays bounded on an endless stream: the store at its cap, every per-record and
per-step structure of the loop bounded, resident memory flat once the store is full."""

from __future__ import annotations

import resource
import tracemalloc

import numpy as np
import pytest

from partitioner import Placement
from streaming import SyntheticConfig
from streaming.runtime import SystemClock
from trainer.dist import LocalComm
from trainer.dist.allocator import keep_freed_memory
from trainer.online import OnlineLoop
from trainer.step import Trainer
from trainer.testing import StreamSource
from trainer.types import Hooks, ModelConfig, OnlineConfig, StoreConfig, TrainConfig

BATCH, STEPS, CAP, HISTORY = 512, 600, 20_000, 100


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="Linux only")
def test_resident_memory_is_flat_once_the_store_is_full() -> None:
    keep_freed_memory()  # as every rank does: freed blocks are reused, not mapped again
    comm, train = LocalComm(), TrainConfig(global_batch=BATCH, log_every=0)
    # A large vocabulary keeps new ids coming at every step, so the cap works all the time.
    # (No drift: the generator keeps each drift epoch's hot sets, which would grow here.)
    source = StreamSource(SyntheticConfig(seed=5, vocab_max=2_000_000, drift_every=10**9),
                          BATCH, STEPS)
    trainer = Trainer(comm, Placement.hash(1), 26, 13, train=train,
                      model=ModelConfig(embed_dim=8, hidden=(16,)),
                      store=StoreConfig(max_rows=CAP))
    loop = OnlineLoop(comm, trainer, source, OnlineConfig(repartition_interval="0"), train,
                      SystemClock(), hooks=Hooks(history=HISTORY))
    sizes, rss, heap = [], [], []
    tracemalloc.start()  # numpy reports its buffers to it: every array kept shows
    with loop:
        for step in range(STEPS):
            loop.between_steps(loop.control())
            batch = source.next_batch()
            c = trainer.step(batch)
            source.mark_trained()
            assert c is not None
            loop.after_step(batch, c, 0.0, False)
            sizes.append(len(trainer.store))
            if step >= STEPS // 3 and step % 20 == 0:
                rss.append(_rss_mb())
                heap.append(tracemalloc.get_traced_memory()[0] / 2**20)
    tracemalloc.stop()
    assert trainer.store.stats.evicted > 0 and max(sizes) <= CAP
    assert len(loop.stats.history) == HISTORY  # the last steps, not every step
    assert loop.stats.freshness.count == BATCH * STEPS  # every record counted, none kept
    # Once the store is full, in MB per 100 steps (the slope of a line through the samples):
    # what Python and numpy hold, and resident memory. A float kept per record, as the loop
    # used to keep freshness, adds 0.39 to the first (resident memory hides it for a while in
    # the space freed by every step's temporaries).
    step = np.arange(len(rss)) * 20
    held = np.polyfit(step, heap, 1)[0] * 100
    resident = np.polyfit(step, rss, 1)[0] * 100
    print(f"held {held:.3f} MB, resident {resident:.3f} MB per 100 steps")
    assert held < 0.1, heap
    assert resident < 0.2, rss
