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
    from trainer.model.pooling import Bags, pool_bags

__all__ = [
    "Bags",
    "DenseOptimizer",
    "FlatParameters",
    "ModelConfig",
    "build_model",
    "pool_bags",
]

__getattr__ = lazy_exports(__name__, {
    "Bags": "trainer.model.pooling",
    "DenseOptimizer": "trainer.model.dense",
    "FlatParameters": "trainer.model.dense",
    "ModelConfig": "trainer.model.config",
    "build_model": "trainer.model.models",
    "pool_bags": "trainer.model.pooling",
})
