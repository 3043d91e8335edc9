"""One rank's training step: :class:`Trainer` routes the samples, reads their rows through the
embedding path, runs the model's forward and backward and averages the dense gradients; and
its settings (:class:`TrainConfig`) and the counter of its waits for the device
(:class:`SyncCounter`)."""

from trainer.step.config import TrainConfig
from trainer.step.syncs import SyncCounter
from trainer.step.trainer import ModelState, Trainer, to_device

__all__ = ["ModelState", "SyncCounter", "TrainConfig", "Trainer", "to_device"]
