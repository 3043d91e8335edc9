"""The online loop: repartitioning on the running stream, live migration, checkpoints and the
record budget, around the training steps (see :mod:`trainer.online.loop`)."""

from trainer.online.budget import RecordBudget, budget_share
from trainer.online.checkpointer import Checkpointer, check_compatible, restore
from trainer.online.control import Control, Proposal
from trainer.online.drift import DriftDetector
from trainer.online.loop import Diverged, LoopParts, OnlineLoop, build_parts
from trainer.online.observe import Observer, ObserverFactory, Observers, RunView
from trainer.online.stats import FreshnessHistogram, LoopStats, StepRecord

__all__ = [
    "Checkpointer",
    "Control",
    "Diverged",
    "DriftDetector",
    "FreshnessHistogram",
    "LoopParts",
    "LoopStats",
    "Observer",
    "ObserverFactory",
    "Observers",
    "OnlineLoop",
    "Proposal",
    "RecordBudget",
    "RunView",
    "StepRecord",
    "budget_share",
    "build_parts",
    "check_compatible",
    "restore",
]
