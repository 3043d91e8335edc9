"""The CTR models (Wide&Deep, DeepFM, DCN, DCN-v2, DLRM) and their dense parameters as one flat
buffer with its optimizer (replicated on every rank, summed by one all-reduce a step), and their
settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.model.config import ModelConfig
    from hetgmp.trainer.model.dense import DenseOptimizer, FlatParameters
    from hetgmp.trainer.model.models import build_model
    from hetgmp.trainer.model.pooling import Bags, pool_bags

__all__ = [
    "Bags",
    "DenseOptimizer",
    "FlatParameters",
    "ModelConfig",
    "build_model",
    "pool_bags",
]

__getattr__ = lazy_exports(__name__, {
    "Bags": "hetgmp.trainer.model.pooling",
    "DenseOptimizer": "hetgmp.trainer.model.dense",
    "FlatParameters": "hetgmp.trainer.model.dense",
    "ModelConfig": "hetgmp.trainer.model.config",
    "build_model": "hetgmp.trainer.model.models",
    "pool_bags": "hetgmp.trainer.model.pooling",
})
