"""One rank's training step: :class:`Trainer` routes the samples, reads their rows through the
embedding path, runs the model's forward and backward and averages the dense gradients; and
its settings (:class:`TrainConfig`) and the counter of its waits for the device
(:class:`SyncCounter`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.step.config import Scaling, TrainConfig, scaled
    from hetgmp.trainer.step.message import as_words, compact_ids, expand_ids, from_words
    from hetgmp.trainer.step.route_choice import AUTO_ROUNDS, ROUTE_AUTO, RouteChoice
    from hetgmp.trainer.step.syncs import SyncCounter
    from hetgmp.trainer.step.trainer import Trainer

__all__ = [
    "AUTO_ROUNDS",
    "ROUTE_AUTO",
    "RouteChoice",
    "Scaling",
    "SyncCounter",
    "TrainConfig",
    "Trainer",
    "as_words",
    "compact_ids",
    "expand_ids",
    "from_words",
    "scaled",
]

__getattr__ = lazy_exports(__name__, {
    "SyncCounter": "hetgmp.trainer.step.syncs",
    "TrainConfig": "hetgmp.trainer.step.config",
    "Scaling": "hetgmp.trainer.step.config",
    "scaled": "hetgmp.trainer.step.config",
    "AUTO_ROUNDS": "hetgmp.trainer.step.route_choice",
    "ROUTE_AUTO": "hetgmp.trainer.step.route_choice",
    "RouteChoice": "hetgmp.trainer.step.route_choice",
    "Trainer": "hetgmp.trainer.step.trainer",
    "as_words": "hetgmp.trainer.step.message",
    "compact_ids": "hetgmp.trainer.step.message",
    "expand_ids": "hetgmp.trainer.step.message",
    "from_words": "hetgmp.trainer.step.message",
})
