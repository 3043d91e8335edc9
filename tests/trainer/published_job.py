"""The settings of the serving tests' training jobs, and helpers to read what they published.
A plain module (as ``exact_jobs``), imported by name by the serving tests and their conftest."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetgmp.streaming import ClickBatch
from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import RankResult
from hetgmp.trainer.serving.follower import Follower
from hetgmp.trainer.serving.model import ServingModel
from hetgmp.trainer.sources import KafkaSpec
from hetgmp.trainer.step import TrainConfig

SYN = SyntheticConfig(vocab_max=20_000, seed=9)
RECORDS = 9_600
PER_MESSAGE = 4
MODEL = ModelConfig(model="deepfm", embed_dim=8, hidden=(16,), dtype="float32")
# Rows unused for 4 steps are evicted: tombstones in the log.
STORE = StoreConfig(optimizer="adagrad", lr=0.05, evict_after=4, seed=3, init_scale=0.02)
TRAIN = TrainConfig(staleness=0, global_batch=480, replica_fraction=0.05, log_every=0)
LAUNCH = LaunchConfig(device="cpu", workers=2, timeout_s=120)


def online_config(root: Path, **kw: object) -> OnlineConfig:
    return OnlineConfig(repartition_interval="0", drift_threshold=0.0, checkpoint_dir=str(root),
                        checkpoint_interval=str(4 * TRAIN.global_batch), keep_checkpoints=50,
                        publish_interval=0.05, **kw)  # type: ignore[arg-type]


def kafka_spec(kafka: KafkaSettings, topic: str, group: str, client: str = "auto") -> KafkaSpec:
    """The job's source; ``client`` is also the library its ranks publish deltas with."""
    return KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=group, client=client),  # type: ignore[arg-type]
                     idle_s=3.0, poll_s=0.05)


def checkpoints(root: Path) -> list[ckpt.Manifest]:
    return [ckpt.read_manifest(d) for d in sorted(root.glob("step-*"))
            if (d / ckpt.MANIFEST).exists()]


def follow(kafka: KafkaSettings, manifest: ckpt.Manifest, **tier: object
           ) -> tuple[ServingModel, Follower]:
    """A serving model from ``manifest`` caught up with the log (``tier``: its memory_rows and
    disk_dir)."""
    model = ServingModel.from_checkpoint(manifest, **tier)  # type: ignore[arg-type]
    assert manifest.model is not None
    follower = Follower(kafka, manifest.model.topic, model, manifest.model.offsets)
    follower.catch_up(timeout_s=60)
    return model, follower


def trainer_model(results: list[RankResult]) -> tuple[np.ndarray, np.ndarray, dict]:
    """Every rank's rows (ids sorted) and the dense parameters, as the trainer ended."""
    states = [r.observed["state"] for r in results]
    ids = np.concatenate([s.ids for s in states])
    rows = np.concatenate([s.rows.numpy() for s in states])
    order = np.argsort(ids)
    return ids[order], rows[order], states[0].dense


def trainer_forward(results: list[RankResult], batch: ClickBatch) -> np.ndarray:
    """Click probabilities of ``batch`` from the trainer's model as the job ended: its dense
    parameters, its rows, the initial value of ids it holds no row of."""
    import torch

    from hetgmp.trainer.embedding.optimizer import initial_rows
    from hetgmp.trainer.model import Features, build_model

    ids, rows, dense = trainer_model(results)
    module = build_model(MODEL, batch.ids.shape[1], batch.dense.shape[1])
    module.load_state_dict(dense)
    uniq, inverse = np.unique(batch.ids, return_inverse=True)
    pos = np.minimum(np.searchsorted(ids, uniq), ids.size - 1)
    held = ids[pos] == uniq
    table = initial_rows(uniq, MODEL.row_dim, STORE.seed, STORE.init_scale).astype(np.float32)
    table[held] = rows[pos[held]]
    emb = torch.from_numpy(table)[torch.from_numpy(inverse.reshape(-1))]
    fields = batch.ids.shape[1]
    features = Features(tuple(f"f{i}" for i in range(fields)),
                        emb.view(len(batch), fields, -1), torch.from_numpy(batch.dense))
    with torch.no_grad():
        logits = module(features)
    return torch.sigmoid(logits).numpy()
