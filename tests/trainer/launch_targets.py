"""Rank functions for the launcher tests (a plain module: spawned ranks import it by name)."""

from __future__ import annotations

import os
import time

from trainer.comm import Comm


def gather_ranks(comm: Comm, tag: str) -> tuple[str, list[int], str]:
    """Every rank's id, through a collective."""
    return tag, comm.all_gather_object(comm.rank), str(comm.device)


def raise_on(comm: Comm, rank: int) -> None:
    """Rank ``rank`` raises; the others wait in a collective that can never complete."""
    if comm.rank == rank:
        raise ValueError(f"boom on rank {rank}")
    comm.barrier()


def die_on(comm: Comm, rank: int) -> None:
    """Rank ``rank`` exits without a word (as if killed); the others wait in a collective."""
    if comm.rank == rank:
        os._exit(3)
    comm.barrier()


def reduce_sums(comm: Comm, sizes: list[int]) -> list[tuple[list[float], int, int, float]]:
    """``all_reduce_sum`` of a rank-dependent float64 tensor of each size: (result, bytes sent,
    collectives timed, seconds in them)."""
    import torch

    out = []
    for n in sizes:
        x = torch.arange(n, dtype=torch.float64) * (comm.rank + 1) + 0.1 * comm.rank
        comm.barrier()  # every rank starts together ...
        before = comm.traffic.copy()
        if comm.rank == 0:
            time.sleep(0.5)  # ... and the others wait for rank 0 inside the collective
        comm.all_reduce_sum(x, "control")
        moved = comm.traffic - before
        out.append((x.tolist(), int(moved.sent.sum()), int(moved.calls.sum()),
                    float(moved.seconds.sum())))
    return out


def route_steps(comm: Comm, sizes: list[list[int]]) -> list[tuple[bool, list, int]]:
    """``Trainer._route`` of steps whose per-rank batch sizes are ``sizes[step][rank]``, with
    a global batch of twice the first step's first size.

    Returns per step: whether the header rode with the samples, the samples trained here (their
    ids, as lists) and the route and header bytes this rank sent.
    """
    import numpy as np

    from streaming.synthetic import SyntheticConfig, SyntheticStream
    from trainer.counters import KINDS, StepCounters
    from trainer.sources import synthetic_batch
    from trainer.step import Trainer
    from trainer.types import ModelConfig, TrainConfig
    from trainer.worker import graph_placement

    stream = SyntheticStream(SyntheticConfig(vocab_max=5_000, seed=5))
    train = TrainConfig(global_batch=2 * sizes[0][0], replica_fraction=0.05, route_epsilon=0.0)
    placement = graph_placement(stream.feature_ids(0, 5_000), comm.world, train)
    trainer = Trainer(comm, placement, 26, 13, model=ModelConfig(embed_dim=4, hidden=(8,)),
                      train=train)
    out, start = [], 5_000
    for step in sizes:
        lo = start + int(np.sum(step[:comm.rank]))
        kinds = [KINDS.index("route"), KINDS.index("header")]
        before = int(comm.traffic.sent[kinds].sum())
        merged = trainer._whole_batches
        routed = trainer._route(synthetic_batch(stream, lo, step[comm.rank]), False,
                                StepCounters())
        assert routed is not None
        sent = int(comm.traffic.sent[kinds].sum()) - before
        out.append((merged, routed[0].ids.tolist(), sent))
        start += int(np.sum(step))
    return out
