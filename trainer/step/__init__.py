"""One rank's training step: :class:`Trainer` routes the samples, reads their rows through the
embedding path, runs the model's forward and backward and averages the dense gradients; and
its settings (:class:`TrainConfig`) and the counter of its waits for the device
(:class:`SyncCounter`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.step.config import Scaling, TrainConfig, scaled
    from trainer.step.message import as_words, compact_ids, expand_ids, from_words
    from trainer.step.route_choice import AUTO_ROUNDS, ROUTE_AUTO, RouteChoice
    from trainer.step.syncs import SyncCounter
    from trainer.step.trainer import Trainer

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
    "SyncCounter": "trainer.step.syncs",
    "TrainConfig": "trainer.step.config",
    "Scaling": "trainer.step.config",
    "scaled": "trainer.step.config",
    "AUTO_ROUNDS": "trainer.step.route_choice",
    "ROUTE_AUTO": "trainer.step.route_choice",
    "RouteChoice": "trainer.step.route_choice",
    "Trainer": "trainer.step.trainer",
    "as_words": "trainer.step.message",
    "compact_ids": "trainer.step.message",
    "expand_ids": "trainer.step.message",
    "from_words": "trainer.step.message",
})
