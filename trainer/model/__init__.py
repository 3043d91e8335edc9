"""The CTR models (Wide&Deep, DeepFM, DCN) and their dense parameters as one flat buffer with
its optimizer (replicated on every rank, summed by one all-reduce a step), and their settings."""

from trainer.model.config import ModelConfig
from trainer.model.dense import DenseOptimizer, FlatParameters
from trainer.model.models import DCN, DeepFM, WideDeep, build_model

__all__ = ["DCN", "DeepFM", "DenseOptimizer", "FlatParameters", "ModelConfig", "WideDeep",
           "build_model"]
