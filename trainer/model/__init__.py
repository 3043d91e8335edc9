"""The CTR models (Wide&Deep, DeepFM, DCN, DCN-v2, DLRM) and their dense parameters as one flat
buffer with its optimizer (replicated on every rank, summed by one all-reduce a step), and their
settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.model.config import ModelConfig
    from trainer.model.dense import DenseOptimizer, FlatParameters
    from trainer.model.models import build_model

__all__ = [
    "DenseOptimizer",
    "FlatParameters",
    "ModelConfig",
    "build_model",
]

__getattr__ = lazy_exports(__name__, {
    "DenseOptimizer": "trainer.model.dense",
    "FlatParameters": "trainer.model.dense",
    "ModelConfig": "trainer.model.config",
    "build_model": "trainer.model.models",
})
