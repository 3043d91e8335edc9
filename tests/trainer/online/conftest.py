"""Shared by the online-loop tests: a 2-rank job trained online from a produced topic."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hetgmp.streaming.consumer import ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.dist import LaunchConfig
from hetgmp.trainer.dist.launcher import launch
from hetgmp.trainer.model import ModelConfig
from hetgmp.trainer.online import OnlineConfig
from hetgmp.trainer.run import Job, RankResult, run_rank
from hetgmp.trainer.sources import KafkaSpec
from hetgmp.trainer.step import TrainConfig

OnlineRun = Callable[..., list[RankResult]]


@pytest.fixture()
def online_run(kafka: KafkaSettings, unique: Callable[[str], str]) -> OnlineRun:
    """``run(name, syn, records, placement, warmup, interval)``: produce ``records`` of ``syn``
    to a fresh 2-partition topic, train them on 2 CPU ranks with online repartitioning every
    ``interval`` records, and return every rank's result (all records trained, checked)."""

    def run(name: str, syn: SyntheticConfig, records: int, *, placement: str, warmup: int,
            interval: int, observers: tuple = ()) -> list[RankResult]:
        topic = unique(name)
        produce(kafka, ProduceConfig(topic=topic, count=records, partitions=2), syn)
        job = Job(
            KafkaSpec(kafka, ConsumerConfig(topic=topic, group_id=unique(f"{name}-group")),
                      idle_s=5.0, poll_s=0.05),
            ModelConfig(embed_dim=8, hidden=(16,)),
            train=TrainConfig(global_batch=1024, placement=placement,  # type: ignore[arg-type]
                              warmup=warmup, log_every=0),
            online=OnlineConfig(repartition_interval=str(interval), window=30_000,
                                max_records=records), observers=observers)
        results = launch(run_rank, job, LaunchConfig(device="cpu", workers=2, timeout_s=120))
        assert results[0].job_totals.samples == records
        return results

    return run
