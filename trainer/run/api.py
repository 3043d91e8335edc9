"""Training from Python: ``hetgmp.train(source, model, ...)``, what ``hetgmp train`` runs.

A model is a built-in's name, a factory's import path (``mypkg.models:build``), or the factory
itself: a module-level function taking a :class:`~hetgmp.trainer.model.ModelSpec` and
returning a ``torch.nn.Module``, which every rank imports by its module and name (the ranks are
processes of their own), and which checkpoints record the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hetgmp.streaming import parse_schema
from hetgmp.trainer.dist import LaunchConfig, job_device, job_ranks, launch, under_torchrun
from hetgmp.trainer.embedding import StoreConfig
from hetgmp.trainer.model import (
    Bags,
    ModelConfig,
    ModelError,
    ModelSpec,
    build_model,
    check_model,
)
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run.job import Job, RankResult
from hetgmp.trainer.run.rank import run_rank
from hetgmp.trainer.run.resources import check_disk_tier, check_resources
from hetgmp.trainer.sources import SourceSpec, SyntheticSpec
from hetgmp.trainer.step import TrainConfig

__all__ = ["check_job", "factory_path", "train"]

Factory = Callable[[ModelSpec], Any]

#: Recent samples behind the progressive AUC (``hetgmp train --eval-window``'s default).
PROGRESSIVE = 20_000


def factory_path(model: str | Factory) -> str:
    """``--model``'s value for ``model``: a name or path as it is, a function as
    ``module:name``.

    Raises:
        ModelError: A function the ranks could not import by name (a lambda, a nested
            function, a method).
    """
    if isinstance(model, str):
        return model
    module, name = getattr(model, "__module__", None), getattr(model, "__qualname__", "")
    if not module or not name or "<" in name or "." in name:
        raise ModelError(f"model {model!r}: pass a module-level function (the ranks import it "
                         "by its module and name), or its path, package.module:function")
    return f"{module}:{name}"


def check_job(job: Job, launch_config: LaunchConfig) -> None:
    """Refuse ranks, threads or a model this machine cannot hold, or a model that cannot
    train on the source's schema, before any rank starts.

    Raises:
        ValueError: What is wrong, in one line (a :class:`ModelError` for the model).
    """
    schema = (job.source.config.schema if isinstance(job.source, SyntheticSpec)
              else parse_schema(job.source.consumer.schema))
    world = job_ranks(launch_config)
    here = 1 if under_torchrun() else launch_config.workers
    # The model on this schema, run once on a small batch: a model that reads a field the
    # schema lacks, or returns the wrong shape, is refused in one line naming it before any
    # rank starts (a factory of the user's is imported here, so an import error is said too).
    # The size first (counted on the meta device): a model too large for this machine is
    # refused before check_model allocates it.
    bags = Bags.of(schema)
    spec = ModelSpec.of_bags(job.model, bags, len(schema.sparse), len(schema.dense))
    check_resources(launch_config, job.model, job.train, ranks_here=here, world=world,
                    n_fields=len(schema.sparse), n_dense=len(schema.dense),
                    device=launch_config.device, spec=spec)
    check_model(build_model(job.model, len(schema.sparse), len(schema.dense), spec), spec)
    check_disk_tier(job.store, job.model, here,
                    bags.widths(job.model, len(schema.sparse)).row_dim)
    job.train.loss_weights(schema.tasks)  # --task-weights one a label


def train(source: SourceSpec, model: ModelConfig | str | Factory = "deepfm", *,
          store: StoreConfig | None = None, train: TrainConfig | None = None,
          online: OnlineConfig | None = None, launch_config: LaunchConfig | None = None,
          heldout: SyntheticSpec | None = None, seed: int = 0, **job: Any) -> RankResult:
    """Train on ``source`` with ``launch_config.workers`` ranks of this machine, as ``hetgmp
    train`` does; rank 0's result (``heldout_auc``, ``tasks``, ``job_totals``, ...).

    Args:
        source: The records: ``KafkaSpec(KafkaSettings(...), ConsumerConfig(topic=...,
            schema=...))`` or ``SyntheticSpec(SyntheticConfig(...), start, records)``.
        model: A :class:`ModelConfig`, or its ``model``: a built-in's name, a factory's path,
            or a module-level factory function (the other settings at their defaults).
        store, train, online: The embedding store, the loop, the online loop (repartitions,
            checkpoints, the delta log); defaults as the command line's.
        launch_config: Ranks, device, threads (default one rank on the CPU).
        heldout: Synthetic records scored after training.
        seed: Seed of the model, the store's initial rows and the partitioner.
        job: Any other :class:`~hetgmp.trainer.run.Job` setting (``placement``,
            ``heldout_after_ms``, ``metrics_port``, ``progressive``: the samples behind the
            progressive AUC, default 20,000, ...).

    Raises:
        ModelError: The model cannot train on the source's schema (one line naming it).
        ValueError: A setting this machine cannot run.
        WorkerFailed: A rank failed (the others were stopped).
    """
    config = model if isinstance(model, ModelConfig) else \
        ModelConfig(model=factory_path(model), seed=seed)
    job.setdefault("progressive", PROGRESSIVE)
    spec = Job(source, config, store or StoreConfig(seed=seed), train or TrainConfig(),
               online=online or OnlineConfig(), heldout=heldout, seed=seed, **job)
    launched = launch_config or LaunchConfig()
    launched = replace(launched, device=job_device(launched))
    check_job(spec, launched)
    return launch(run_rank, spec, launched)[0]
