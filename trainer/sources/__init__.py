"""Where a rank's samples come from: its share of each global batch, from memory or from Kafka.

Every source keeps the :class:`Source` contract; :func:`open_source` opens the one a spec
describes, for one rank, at the point a checkpoint recorded.
"""

from __future__ import annotations

from typing import Callable

from hetgmp.trainer.sources.base import ResetOffsets, Resume, Source
from hetgmp.trainer.sources.kafka import KafkaShard, KafkaSpec
from hetgmp.trainer.sources.synthetic import SyntheticShard, SyntheticSpec, shard_bounds, synthetic_batch

__all__ = [
    "KafkaShard",
    "KafkaSpec",
    "ResetOffsets",
    "Resume",
    "Source",
    "SourceSpec",
    "SyntheticShard",
    "SyntheticSpec",
    "open_source",
    "shard_bounds",
    "synthetic_batch",
]

SourceSpec = SyntheticSpec | KafkaSpec


def open_source(spec: SourceSpec, global_batch: int, rank: int, world: int, *,
                resume: Resume | None = None, max_records: int = 0,
                stop: Callable[[], bool] | None = None) -> Source:
    """The source ``spec`` describes, for one rank of ``world``.

    Args:
        spec: What to read.
        global_batch: Samples per step over all ranks.
        rank: This rank.
        world: Ranks in the job.
        resume: Where a resumed run goes on (None: from the start).
        max_records: The run's record budget over all ranks (0: none); a synthetic range is cut
            to it, a Kafka source is capped step by step by the online loop.
        stop: The job's stop flag: a Kafka source gives up waiting for a broker once it is set.
    """
    if isinstance(spec, SyntheticSpec):  # the one place that tells the specs apart
        return SyntheticShard(spec.remaining(resume, max_records), global_batch, rank, world)
    return KafkaShard(spec, global_batch, rank, world, resume=resume, stop=stop)
