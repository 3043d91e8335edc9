"""Models: the contract a model trains on (:class:`Features` in, logits out), the factories that
build one (the built-ins of :mod:`hetgmp.trainer.model.zoo`, or a user's ``module:function``),
their dense parameters as one flat buffer with its optimizer (replicated on every rank, summed
by one all-reduce a step), and their settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.model.config import ModelConfig
    from hetgmp.trainer.model.dense import DenseOptimizer, FlatParameters
    from hetgmp.trainer.model.export import (
        EXPORTED,
        ExportError,
        call_exported,
        export_model,
        load_exported,
        param_names,
    )
    from hetgmp.trainer.model.features import Features, Sequence
    from hetgmp.trainer.model.pooling import Bags, FieldReader, batch_features, pool_bags
    from hetgmp.trainer.model.spec import (
        ModelError,
        ModelSpec,
        build_model,
        check_model,
        resolve_factory,
    )
    from hetgmp.trainer.model.widths import Widths, block_ids

__all__ = [
    "EXPORTED",
    "Bags",
    "DenseOptimizer",
    "ExportError",
    "Features",
    "FieldReader",
    "FlatParameters",
    "ModelConfig",
    "ModelError",
    "ModelSpec",
    "Sequence",
    "Widths",
    "batch_features",
    "block_ids",
    "build_model",
    "call_exported",
    "check_model",
    "export_model",
    "load_exported",
    "param_names",
    "pool_bags",
    "resolve_factory",
]

__getattr__ = lazy_exports(__name__, {
    "EXPORTED": "hetgmp.trainer.model.export",
    "ExportError": "hetgmp.trainer.model.export",
    "call_exported": "hetgmp.trainer.model.export",
    "export_model": "hetgmp.trainer.model.export",
    "load_exported": "hetgmp.trainer.model.export",
    "param_names": "hetgmp.trainer.model.export",
    "Bags": "hetgmp.trainer.model.pooling",
    "FieldReader": "hetgmp.trainer.model.pooling",
    "DenseOptimizer": "hetgmp.trainer.model.dense",
    "FlatParameters": "hetgmp.trainer.model.dense",
    "ModelConfig": "hetgmp.trainer.model.config",
    "Features": "hetgmp.trainer.model.features",
    "ModelError": "hetgmp.trainer.model.spec",
    "ModelSpec": "hetgmp.trainer.model.spec",
    "Sequence": "hetgmp.trainer.model.features",
    "batch_features": "hetgmp.trainer.model.pooling",
    "build_model": "hetgmp.trainer.model.spec",
    "check_model": "hetgmp.trainer.model.spec",
    "resolve_factory": "hetgmp.trainer.model.spec",
    "pool_bags": "hetgmp.trainer.model.pooling",
    "Widths": "hetgmp.trainer.model.widths",
    "block_ids": "hetgmp.trainer.model.widths",
})
