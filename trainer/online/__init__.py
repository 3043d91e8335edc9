"""The online loop: repartitioning on the running stream, live migration, checkpoints and the
record budget, around the training steps (see :mod:`trainer.online.loop`).

The names below load on first use (PEP 562): the partitioner's process imports
:mod:`trainer.online.partition_process` and must not pay for torch and the loop on its way in
(it starts in well under a second that way; eagerly, several seconds, enough for a short run to
end before its first placement came back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.online.checkpointer import check_compatible, restore
    from trainer.online.config import Interval, OnlineConfig
    from trainer.online.loop import Diverged, OnlineLoop, build_parts
    from trainer.online.observe import Observer, ObserverFactory, Observers, RunView


__all__ = [
    "Diverged",
    "Interval",
    "Observer",
    "ObserverFactory",
    "Observers",
    "OnlineConfig",
    "OnlineLoop",
    "RunView",
    "build_parts",
    "check_compatible",
    "restore",
]

__getattr__ = lazy_exports(__name__, {
    "Diverged": "trainer.online.loop",
    "Interval": "trainer.online.config",
    "Observer": "trainer.online.observe",
    "ObserverFactory": "trainer.online.observe",
    "Observers": "trainer.online.observe",
    "OnlineConfig": "trainer.online.config",
    "OnlineLoop": "trainer.online.loop",
    "RunView": "trainer.online.observe",
    "build_parts": "trainer.online.loop",
    "check_compatible": "trainer.online.checkpointer",
    "restore": "trainer.online.checkpointer",
})
