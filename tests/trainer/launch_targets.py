"""Rank functions for the launcher tests (a plain module: spawned ranks import it by name)."""

from __future__ import annotations

import os

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


def reduce_sums(comm: Comm, sizes: list[int]) -> list[tuple[list[float], int]]:
    """``all_reduce_sum`` of a rank-dependent float64 tensor of each size: (result, bytes sent)."""
    import torch

    out = []
    for n in sizes:
        before = int(comm.traffic.sent.sum())
        x = torch.arange(n, dtype=torch.float64) * (comm.rank + 1) + 0.1 * comm.rank
        comm.all_reduce_sum(x, "control")
        out.append((x.tolist(), int(comm.traffic.sent.sum()) - before))
    return out
