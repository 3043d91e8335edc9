"""The placement a job starts with: given, hash, resumed, or graph from a warm-up window.

A graph placement is computed on rank 0 from an access window and broadcast (torchrec's planner
pattern). The window is either a range of synthetic records before the training range
(``Job.window``), or the first ``warmup`` records the ranks read, which are then trained on
too. With online repartitioning the job starts from hash and the online loop places it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hetgmp.partitioner import FullPartitioner, PartitionConfig, Placement, Samples, WindowGraph, as_csr
from hetgmp.runtime import Clock
from hetgmp.streaming import ClickBatch, SyntheticConfig, SyntheticStream
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.dist import Comm
from hetgmp.trainer.model import Widths
from hetgmp.trainer.run.job import Job
from hetgmp.trainer.sources import Source
from hetgmp.trainer.step import TrainConfig

__all__ = ["Start", "graph_placement", "initial_placement"]


@dataclass
class Start:
    """The placement a job starts with, and what was read to compute it.

    Attributes:
        placement: The placement.
        buffered: Batches read to compute it, to be trained first.
        info: A summary for the report (kind, partition time, explicit ids, replicas).
    """

    placement: Placement
    buffered: list[ClickBatch] = field(default_factory=list)
    info: dict[str, object] = field(default_factory=dict)


def graph_placement(ids: Samples, world: int, train: TrainConfig, seed: int = 0) -> Placement:
    """The graph placement (METIS partition plus replicas) of an access window (``[n, F]``, or
    ``(indptr, ids)`` for samples of any length)."""
    config = PartitionConfig(num_workers=world, global_batch=train.global_batch,
                             replica_fraction=train.replica_fraction,
                             replica_basis=train.replica_basis, seed=seed)
    return FullPartitioner(config).partition(WindowGraph(*as_csr(ids)), None)


def initial_placement(job: Job, comm: Comm, source: Source, clock: Clock,
                      manifest: ckpt.Manifest | None = None,
                      widths: Widths | None = None) -> Start:
    """The job's first placement (collective: every rank calls it); ``widths``: the rows'
    blocks, each placed as a row (the records read are expanded to a column of ids a block)."""
    world, train = comm.world, job.train
    kind: str = "given" if job.placement else train.placement
    start = Start(Placement.hash(world))
    if manifest is not None:
        kind = "resumed"
        if manifest.world == world:
            start.placement = ckpt.load_placement(manifest)
        else:
            # Owners of N ranks mean nothing to M: hash until the online loop places again.
            start.placement = Placement.hash(world, version=manifest.placement_version + 1)
    elif job.placement is not None:
        start.placement = job.placement
    elif job.partitions_online:
        kind = "online"
    elif train.placement in ("graph", "auto") and world > 1:  # auto without an interval
        kind = "graph"
        t0 = clock.monotonic()
        ids = _window_ids(job, comm, source, start.buffered, widths)
        computed = graph_placement(ids, world, train, job.seed) if ids is not None else None
        start.placement = comm.broadcast_object(computed)
        start.info["partition_s"] = clock.monotonic() - t0
    p = start.placement
    start.info.update(kind=kind, explicit_ids=int(p.ids.size),
                      replicas=[int(r.size) for r in p.replicas])
    return start


def synthetic_samples(config: SyntheticConfig, start: int, records: int,
                      widths: Widths | None = None) -> Samples:
    """Records ``start ..`` of a synthetic stream as the access graph reads them: each
    record's ids, a column of ids a block of each row with ``widths``."""
    stream = SyntheticStream(config)
    read = ClickBatch.of_lists(*stream.sparse(stream.take(start, records)))
    if widths is not None:
        read = widths.expand(read)
    return read.indptr, read.values


def _window_ids(job: Job, comm: Comm, source: Source, buffered: list[ClickBatch],
                widths: Widths | None = None) -> Samples | None:
    """Rank 0: the access window's ids; the first ``warmup`` records read go to ``buffered``."""
    if job.window is not None:
        w = job.window
        if comm.rank != 0:
            return None
        return synthetic_samples(w.config, w.start, w.records, widths)
    share = math.ceil(job.train.warmup / comm.world)
    got = 0
    while got < share and not source.exhausted and not comm.stop_requested():
        batch = source.next_batch()
        buffered.append(batch)
        got += len(batch)
    read = ClickBatch.concat(buffered) if buffered else None
    if read is not None and widths is not None:
        read = widths.expand(read)
    local = (np.diff(read.indptr), read.values) if read is not None else None
    gathered = [g for g in comm.all_gather_object(local) if g is not None]
    if comm.rank != 0:
        return None
    sizes = np.concatenate([g[0] for g in gathered]) if gathered else np.zeros(0, np.int64)
    values = np.concatenate([g[1] for g in gathered]) if gathered else np.zeros(0, np.int64)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), values
