"""The online loop: repartitioning on the running stream, live migration, checkpoints and the
record budget, around the training steps (see :mod:`hetgmp.trainer.online.loop`).

The names below load on first use (PEP 562): the partitioner's process imports
:mod:`hetgmp.trainer.online.partition_process` and must not pay for torch and the loop on its way in
(it starts in well under a second that way; eagerly, several seconds, enough for a short run to
end before its first placement came back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.online.checkpointer import check_compatible, restore
    from hetgmp.trainer.online.config import Interval, OnlineConfig
    from hetgmp.trainer.online.loop import Diverged, OnlineLoop, build_parts
    from hetgmp.trainer.online.observe import Observer, ObserverFactory, Observers, RunView


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
    "Diverged": "hetgmp.trainer.online.loop",
    "Interval": "hetgmp.trainer.online.config",
    "Observer": "hetgmp.trainer.online.observe",
    "ObserverFactory": "hetgmp.trainer.online.observe",
    "Observers": "hetgmp.trainer.online.observe",
    "OnlineConfig": "hetgmp.trainer.online.config",
    "OnlineLoop": "hetgmp.trainer.online.loop",
    "RunView": "hetgmp.trainer.online.observe",
    "build_parts": "hetgmp.trainer.online.loop",
    "check_compatible": "hetgmp.trainer.online.checkpointer",
    "restore": "hetgmp.trainer.online.checkpointer",
})
