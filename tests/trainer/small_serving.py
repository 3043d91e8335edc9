"""A small serving model with rows, without a training job: the serving tests that need a model
but no broker (imported by its plain name, as ``serve_process`` is)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetgmp.streaming import ClickBatch
from hetgmp.trainer.model import FlatParameters, build_model
from hetgmp.trainer.serving import ServingModel, log_version
from hetgmp.trainer.serving.model import model_config

# DeepFM, 3 sparse fields of 16 + 1 values a row, 2 dense features.
SHAPE: dict[str, Any] = {"model": "deepfm", "row_dim": 17, "hidden": [8], "cross_layers": 0,
                         "fields": 3, "dense": 2, "row_seed": 0, "row_init_scale": 0.01}
SCHEMA = "2,3"  # dense, sparse: as --schema takes it
LINEAGE = "0123456789abcdef"
GEN, PUBLISHES = 3, 40  # the checkpoint the model stands for: generation 3, publish 40
IDS = np.arange(100, 140, dtype=np.int64)


def numel() -> int:
    """Dense parameters of :data:`SHAPE`'s model."""
    return FlatParameters(build_model(model_config(SHAPE), SHAPE["fields"], SHAPE["dense"])).numel


def small_model() -> ServingModel:
    """The model as a checkpoint of generation :data:`GEN` would give it, rows :data:`IDS`."""
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(numel()).astype(np.float32) * 0.1
    model = ServingModel(SHAPE, flat, lineage=LINEAGE, version=log_version(GEN, PUBLISHES),
                         world=2, step=400)
    model.table.upsert(IDS, rng.standard_normal((IDS.size, 17)).astype(np.float32),
                       log_version(GEN, PUBLISHES))
    return model


def small_batch() -> ClickBatch:
    """16 records of held ids."""
    ids = np.stack([IDS[:16], IDS[16:32], IDS[::-1][:16]], axis=1)
    dense = np.linspace(0, 1, 32, dtype=np.float32).reshape(16, 2)
    none = np.full(16, -1, np.int64)
    return ClickBatch.of_ids(labels=np.zeros(16, np.float32), dense=dense, ids=ids,
                      partitions=none.astype(np.int32), offsets=none, timestamps_ms=none)
