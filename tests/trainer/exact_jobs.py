"""The small float64 jobs whose models must not depend on how training is spread: over ranks
(``test_distributed``) or onto a GPU (``test_cuda``). A plain module, imported by name as
``launch_targets`` is, so both compare against the same reference settings."""

from __future__ import annotations

from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.sources import SyntheticSpec
from hetgmp.trainer.step import TrainConfig

SYN = SyntheticConfig(vocab_max=20_000, seed=3)
# The records a graph placement is fitted to, and the ones trained after them.
WINDOW = SyntheticSpec(SYN, start=0, records=20_000)
BATCH = 240  # divisible by 2, 3 and 4 ranks
STEPS = 50
SOURCE = SyntheticSpec(SYN, start=WINDOW.records, records=BATCH * STEPS)
# DeepFM with row-wise Adagrad, synchronous (s = 0), 5% replicas.
EXACT = dict(
    model=ModelConfig(model="deepfm", embed_dim=8, hidden=(16,), dtype="float64"),
    store=StoreConfig(optimizer="adagrad", lr=0.05),
    train=TrainConfig(staleness=0, global_batch=BATCH, replica_fraction=0.05, log_every=0),
)
# DCN with plain SGD, the same training settings.
DCN_SGD = dict(
    model=ModelConfig(model="dcn", embed_dim=8, hidden=(16,), cross_layers=2, dtype="float64"),
    store=StoreConfig(optimizer="sgd", lr=0.1),
    train=EXACT["train"],
)
