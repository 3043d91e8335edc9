"""Ranks as threads of one process: the fast lane for multi-rank protocols.

:class:`ThreadComm` has the :class:`~hetgmp.trainer.dist.Comm` interface of the gloo communicator, with
the same byte accounting, over shared memory: every collective is a rendezvous of the job's
threads (publish, barrier, read, barrier). So the row exchange, the staleness protocol, the
migrations and the online loop run on N ranks as a unit test that takes seconds, with no
process to spawn and no socket to open (dask distributed's ``gen_cluster`` idea). The spawned
gloo tests stay for the real transport.

Collectives return when they are done (``start_*`` hand back a finished one, counted, like
DistComm's, when waited for), which a caller of the interface cannot tell apart from a fast
network. Sums are one ``torch.sum`` over every rank's copy, as DistComm sums a small tensor:
every rank gets the same bits (a large tensor goes by gloo's ring there, whose bits differ).

:func:`run_threads` runs ``fn(comm, arg)`` on every rank and re-raises the first failure; a
failing rank breaks the rendezvous, so its peers fail at once instead of waiting for ever.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
import torch

from hetgmp.trainer.dist.comm import (
    Counts,
    Pending,
    _CommState,
    all_reduce_bytes,
    all_to_all_bytes,
    done,
    small_all_reduce,
)

__all__ = ["ThreadComm", "ThreadGroup", "run_threads"]

A = TypeVar("A")
R = TypeVar("R")


class ThreadGroup:
    """The rendezvous of a job's threads.

    Args:
        world: Ranks (threads) in the job.
        timeout_s: A rank waiting longer at a rendezvous fails (a peer is gone).
    """

    def __init__(self, world: int, timeout_s: float = 120.0) -> None:
        self.world = world
        self.timeout_s = timeout_s
        self._barrier = threading.Barrier(world, timeout=timeout_s)
        self._slots: list[Any] = [None] * world

    def gather(self, rank: int, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (every rank calls it)."""
        self._slots[rank] = obj
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()  # nobody overwrites a slot before every rank has read it
        return out

    def abort(self) -> None:
        """Fail every rank waiting at (or coming to) the rendezvous."""
        self._barrier.abort()


class ThreadComm(_CommState):
    """One rank of a :class:`ThreadGroup` (see the module docstring).

    Args:
        group: The job's rendezvous.
        rank: This rank.
        stop: A stop flag shared by the ranks (``comm.stop_requested()``).
    """

    def __init__(self, group: ThreadGroup, rank: int, stop: threading.Event | None = None
                 ) -> None:
        super().__init__(rank, group.world, "cpu", stop)
        self.group = group

    def all_to_all(self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts,
                   kind: str) -> torch.Tensor:
        sizes = [int(c) for c in send_counts]
        recv = [int(c) for c in recv_counts]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        # Copies: the caller may reuse its buffer once this returns, before a slower peer
        # has read from it.
        chunks = [send[bounds[d]:bounds[d + 1]].clone() for d in range(self.world)]
        got = [chunks_of[self.rank] for chunks_of in self.group.gather(self.rank, chunks)]
        if [int(g.shape[0]) for g in got] != recv:
            raise RuntimeError(f"rank {self.rank} expected {recv} rows by source in an "
                               f"all-to-all ({kind}), got {[int(g.shape[0]) for g in got]}")
        out = torch.cat(got) if got else send[:0]
        self.traffic.add(kind, *all_to_all_bytes(send, out, sizes, recv, self.rank), 0.0)
        return out

    def start_all_to_all(self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts,
                         kind: str) -> Pending:
        return done(self.all_to_all(send, send_counts, recv_counts, kind))

    def exchange_counts(self, counts: np.ndarray, kind: str = "header") -> np.ndarray:
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        if counts.shape[0] != self.world:
            raise ValueError("counts needs one row per rank")
        ones = [1] * self.world
        return self.host_all_to_all(counts, ones, ones, kind)

    def host_all_to_all(self, send: np.ndarray, send_counts: Counts, recv_counts: Counts,
                        kind: str) -> np.ndarray:
        # numpy throughout: no tensor, so the sync audit sees no copy out (there is none).
        sizes = [int(c) for c in send_counts]
        recv = [int(c) for c in recv_counts]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        chunks = [send[bounds[d]:bounds[d + 1]].copy() for d in range(self.world)]
        got = [chunks_of[self.rank] for chunks_of in self.group.gather(self.rank, chunks)]
        if [len(g) for g in got] != recv:
            raise RuntimeError(f"rank {self.rank} expected {recv} rows by source in an "
                               f"all-to-all ({kind}), got {[len(g) for g in got]}")
        out = np.concatenate(got) if got else send[:0]
        self.traffic.add(kind, *all_to_all_bytes(torch.from_numpy(send), torch.from_numpy(out),
                                                 sizes, recv, self.rank), 0.0)
        return out

    def host_all_reduce_sum(self, values: np.ndarray, kind: str = "control", *,
                            max_last: int = 0) -> np.ndarray:
        mine = np.array(values, dtype=np.int64)
        copies = np.stack(self.group.gather(self.rank, mine.reshape(-1)))
        out = copies.sum(axis=0, dtype=np.int64)
        if max_last:
            out[-max_last:] = copies[:, -max_last:].max(axis=0)
        moved = all_reduce_bytes(torch.from_numpy(mine), self.world, self.device)
        self.traffic.add(kind, moved, moved, 0.0)
        return np.asarray(out).reshape(mine.shape)

    def _sum(self, tensor: torch.Tensor) -> None:
        # Summed as DistComm sums a small tensor (torch.sum over the stacked copies): the same
        # bits as gloo's gather path, and the same on every rank.
        copies = self.group.gather(self.rank, tensor.detach().clone())
        torch.sum(torch.stack(copies), dim=0, out=tensor)

    def all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> None:
        self.start_all_reduce_sum(tensor, kind).wait()

    def start_all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> Pending:
        self._sum(tensor)
        moved = all_reduce_bytes(tensor, self.world, self.device)
        if small_all_reduce(tensor, self.device):
            self.traffic.add(kind, moved, moved, 0.0)
            return done(tensor)
        # gloo's ring is counted when it is waited for (DistComm's _InFlight): so is this.
        return _Counted(tensor, lambda: self.traffic.add(kind, moved, moved, 0.0))

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        tensor.copy_(self.group.gather(self.rank, tensor.detach().clone())[src])

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return self.group.gather(self.rank, obj)[src]

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self.group.gather(self.rank, obj)

    def barrier(self) -> None:
        self.group.gather(self.rank, None)


class _Counted:
    """A finished collective whose bytes are counted when it is waited for."""

    def __init__(self, result: torch.Tensor, count: Callable[[], None]) -> None:
        self._result, self._count = result, count

    def wait(self) -> torch.Tensor:
        if self._count is not None:
            self._count()
            self._count = None  # type: ignore[assignment]
        return self._result


def run_threads(fn: Callable[[ThreadComm, A], R], arg: A | Sequence[A], world: int, *,
                per_rank: bool = False, timeout_s: float = 120.0,
                stop: threading.Event | None = None) -> list[R]:
    """Run ``fn(comm, arg)`` on ``world`` ranks as threads; results by rank.

    Args:
        fn: The rank's work.
        arg: Its argument (with ``per_rank``: one argument per rank).
        world: Ranks.
        per_rank: ``arg`` holds one argument per rank.
        timeout_s: How long a rank may wait on its peers.
        stop: A stop flag every rank sees.

    Raises:
        BaseException: The first rank's failure (the others are broken out of the rendezvous).
    """
    group = ThreadGroup(world, timeout_s)
    results: list[Any] = [None] * world
    errors: list[tuple[int, BaseException]] = []

    first: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def body(rank: int) -> None:
        try:
            a = arg[rank] if per_rank else arg  # type: ignore[index]
            results[rank] = fn(ThreadComm(group, rank, stop), a)  # type: ignore[arg-type]
        except threading.BrokenBarrierError as exc:
            errors.append((rank, exc))  # a peer failed first: its error is the one raised
        except BaseException as exc:
            with lock:
                first.append((rank, exc))
            group.abort()

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
               for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if first or errors:
        rank, exc = (first or errors)[0]
        raise RuntimeError(f"rank {rank} failed: {type(exc).__name__}: {exc}") from exc
    return results
