"""The collectives the trainer uses, behind one small interface that counts every byte.

:class:`DistComm` wraps ``torch.distributed`` (gloo on CPU, NCCL on CUDA); :class:`LocalComm` is
the one-rank case (single-process training runs the very same code path with it, which is what
makes the ``s = 0`` equivalence test meaningful). Byte counts are per purpose
(:data:`hetgmp.trainer.dist.counters.KINDS`) and exclude a rank's messages to itself.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from hetgmp.trainer.dist.counters import Traffic
from hetgmp.trainer.dist.peers import Peers

__all__ = ["Comm", "Counts", "LocalComm", "DistComm", "Pending", "all_reduce_bytes",
           "all_to_all_bytes", "done"]

Counts = Sequence[int] | np.ndarray  # rows per rank (numpy arrays straight from the headers)

# All-reduces of at most this many bytes are done as an all-gather and a local sum (CPU only).
# Measured on 2 gloo ranks over loopback: 13 int64 took 2.1-2.4 ms by gloo's all_reduce and
# 0.8 ms by one all_to_all and the sum. For the 1.9 MB of dense gradients gloo's ring is the
# faster (3.6 ms, against 5.4 ms by reduce-scatter + all-gather over all_to_all), so it stays.
_GATHER_MAX_BYTES = 64 * 1024


class Comm(Protocol):
    """Collectives among the ranks of one job, with byte accounting."""

    rank: int
    world: int
    device: torch.device
    traffic: Traffic

    def all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> torch.Tensor:
        """Rows ``send[...]`` grouped by destination in, rows grouped by source out (dim 0)."""
        ...

    def start_all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> Pending:
        """:meth:`all_to_all` left running: ``wait()`` returns what it would have returned.
        ``send`` must not be touched before then; other collectives may be called meanwhile
        (every rank calling them in the same order). What a rank does between the two calls
        is done while it waits for its peers."""
        ...

    def exchange_counts(self, counts: np.ndarray, kind: str = "header") -> np.ndarray:
        """int64 ``[world, k]``: row ``d`` goes to rank ``d``; returns row ``s`` from rank ``s``
        (between hosts: never through the device)."""
        ...

    def host_all_to_all(
        self, send: np.ndarray, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> np.ndarray:
        """:meth:`all_to_all` of a host array, host to host: on NCCL a gloo side group carries
        it, so that host data (routed samples, headers) never waits for the device."""
        ...

    def host_all_reduce_sum(self, values: np.ndarray, kind: str = "control", *,
                            max_last: int = 0) -> np.ndarray:
        """Every rank's int64 ``values`` summed, host to host (a new array, exact); the last
        ``max_last`` of them combined by their maximum instead."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> None:
        """Sum ``tensor`` over ranks, in place (every rank gets the same bits)."""
        ...

    def start_all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> Pending:
        """:meth:`all_reduce_sum` left running: ``tensor`` holds the sum once ``wait()``
        returns (it returns ``tensor``), and must not be touched before. Other collectives may
        be called meanwhile (every rank calling them in the same order, as always). Small CPU
        tensors are summed before it returns (their all-gather beats gloo's ring, see
        ``_GATHER_MAX_BYTES``)."""
        ...

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Overwrite ``tensor`` with rank ``src``'s (set-up only; not counted)."""
        ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank (control-plane data; not counted)."""
        ...

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (control-plane data; not counted)."""
        ...

    def barrier(self) -> None:
        """Wait for every rank."""
        ...

    def stop_requested(self) -> bool:
        """Whether the job was asked to stop (SIGINT/SIGTERM in the launcher)."""
        ...


class Pending(Protocol):
    """A collective left running (:meth:`Comm.start_all_to_all`,
    :meth:`Comm.start_all_reduce_sum`)."""

    def wait(self) -> torch.Tensor:
        """Block until it is done (its bytes and wait are counted then); its result."""
        ...


class _Done:
    """A collective that finished before it was handed back (a blocking one, one rank's, or a
    small all-reduce)."""

    def __init__(self, result: torch.Tensor) -> None:
        self._result = result

    def wait(self) -> torch.Tensor:
        return self._result


class _Flag(Protocol):
    """A stop flag: ``threading.Event`` or a ``multiprocessing`` event."""

    def is_set(self) -> bool: ...


def done(result: torch.Tensor) -> Pending:
    """A collective that is already done, as a :class:`Pending`."""
    return _Done(result)


def _row_bytes(t: torch.Tensor) -> int:
    return int(t.element_size() * (t[0].numel() if t.dim() > 1 else 1))


def all_to_all_bytes(send: torch.Tensor, out: torch.Tensor, send_counts: list[int],
                     recv_counts: list[int], me: int) -> tuple[int, int]:
    """Bytes an all-to-all sends and receives, a rank's rows to itself left out."""
    row = _row_bytes(send) if send.numel() else _row_bytes(out) if out.numel() else 0
    return ((sum(send_counts) - send_counts[me]) * row,
            (sum(recv_counts) - recv_counts[me]) * row)


def small_all_reduce(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether an all-reduce of ``tensor`` goes as one all-gather and a local sum (see
    ``_GATHER_MAX_BYTES``)."""
    size = tensor.numel() * tensor.element_size()
    return device.type == "cpu" and size <= _GATHER_MAX_BYTES and tensor.is_contiguous()


def all_reduce_bytes(tensor: torch.Tensor, world: int, device: torch.device) -> int:
    """Bytes a rank sends (and receives) in an all-reduce of ``tensor``: every other rank's
    copy for a small one gathered, 2 (N - 1) / N of it for gloo's or NCCL's ring."""
    size = tensor.numel() * tensor.element_size()
    if small_all_reduce(tensor, device):
        return (world - 1) * size
    return int(2 * (world - 1) * size // world)


class _CommState:  # shared with trainer.dist.threads.ThreadComm
    """What every communicator holds: its place in the job, device, traffic and stop flag."""

    def __init__(self, rank: int, world: int, device: torch.device | str, stop: _Flag | None) -> None:
        self.rank = rank
        self.world = world
        self.device = torch.device(device)
        self.traffic = Traffic()
        self._stop = stop

    def stop_requested(self) -> bool:
        return self._stop is not None and self._stop.is_set()


class LocalComm(_CommState):
    """The one-rank job: every collective is the identity and nothing is sent."""

    def __init__(self, device: torch.device | str = "cpu", stop: _Flag | None = None) -> None:
        super().__init__(0, 1, device, stop)

    def all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> torch.Tensor:
        return send

    def start_all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> Pending:
        return _Done(send)

    def exchange_counts(self, counts: np.ndarray, kind: str = "header") -> np.ndarray:
        return np.asarray(counts, dtype=np.int64).copy()

    def host_all_to_all(
        self, send: np.ndarray, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> np.ndarray:
        return send

    def host_all_reduce_sum(self, values: np.ndarray, kind: str = "control", *,
                            max_last: int = 0) -> np.ndarray:
        return np.asarray(values, dtype=np.int64).copy()

    def all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> None:
        return None

    def start_all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> Pending:
        return _Done(tensor)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        return None

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        return None


def _timed(collective: Callable[[], object]) -> float:
    """Wall seconds of one collective call (its operands built before the clock starts)."""
    began = time.perf_counter()
    collective()
    return time.perf_counter() - began


class _InFlight:
    """An async ``torch.distributed`` collective; counted when waited for (the seconds are the
    wait, what the caller lost to it)."""

    def __init__(self, work: Any, buffers: tuple[torch.Tensor, ...], result: torch.Tensor,
                 count: Callable[[float], None], watch: Callable[[], Any]) -> None:
        # The buffers stay referenced here until the collective is done.
        self._work: Any = work
        self._buffers = buffers
        self._result, self._count, self._watch = result, count, watch

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            with self._watch():
                took = _timed(self._work.wait)
            self._work, self._buffers = None, ()
            self._count(took)
        return self._result


class DistComm(_CommState):
    """Collectives of the default ``torch.distributed`` process group, and of a gloo group
    beside it for host data when the default one is not gloo (NCCL)."""

    def __init__(self, device: torch.device | str = "cpu", stop: _Flag | None = None, *,
                 host_group: bool | None = None) -> None:
        """Bind to the initialised default group (collective: every rank constructs one).

        Args:
            device: Where the trainer's tensors are.
            stop: A stop flag (``stop_requested``).
            host_group: Carry host data on a gloo group of its own: None (the default) where
                the default group is not gloo; True also on gloo (tests of that path).
        """
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised (see trainer.dist.launcher)")
        self._dist = dist
        super().__init__(dist.get_rank(), dist.get_world_size(), device, stop)
        if host_group is None:
            host_group = dist.get_backend() != "gloo"
        self.host_group: Any = dist.new_group(backend="gloo") if host_group else None
        # Every rank's host and pid, so that a failing collective can say which rank is gone.
        placed: list[Any] = [None] * self.world
        dist.all_gather_object(placed, Peers.here())
        self.peers = Peers(self.rank, tuple(h for h, _ in placed), tuple(p for _, p in placed))

    def all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> torch.Tensor:
        return self._all_to_all(send, send_counts, recv_counts, kind, wait=True).wait()

    def start_all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> Pending:
        return self._all_to_all(send, send_counts, recv_counts, kind, wait=False)

    def _all_to_all(
        self, send: torch.Tensor, send_counts: Counts, recv_counts: Counts, kind: str, *,
        wait: bool, group: Any = None
    ) -> Pending:
        send_counts = [int(c) for c in send_counts]
        recv_counts = [int(c) for c in recv_counts]
        out = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=send.device)
        send = send.contiguous()
        sent, received = all_to_all_bytes(send, out, send_counts, recv_counts, self.rank)

        def count(took: float) -> None:
            self.traffic.add(kind, sent, received, took)

        began = time.perf_counter()
        with self.peers.watch(kind):
            work = self._dist.all_to_all_single(out, send, output_split_sizes=recv_counts,
                                                input_split_sizes=send_counts, async_op=not wait,
                                                group=group)
        if wait:
            count(time.perf_counter() - began)
            return _Done(out)
        return _InFlight(work, (send,), out, count, lambda: self.peers.watch(kind))

    def exchange_counts(self, counts: np.ndarray, kind: str = "header") -> np.ndarray:
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        if counts.shape[0] != self.world:
            raise ValueError("counts needs one row per rank")
        ones = [1] * self.world
        return self.host_all_to_all(counts, ones, ones, kind)

    def host_all_to_all(
        self, send: np.ndarray, send_counts: Counts, recv_counts: Counts, kind: str
    ) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(send))
        return self._all_to_all(t, send_counts, recv_counts, kind, wait=True,
                                group=self.host_group).wait().numpy()

    def host_all_reduce_sum(self, values: np.ndarray, kind: str = "control", *,
                            max_last: int = 0) -> np.ndarray:
        flat = torch.from_numpy(np.array(values, dtype=np.int64).reshape(-1))
        self._gathered_sum(flat, kind, self.host_group, max_last)
        return flat.numpy().reshape(np.shape(values))

    def all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> None:
        self.start_all_reduce_sum(tensor, kind).wait()

    def start_all_reduce_sum(self, tensor: torch.Tensor, kind: str = "dense") -> Pending:
        n = self.world
        moved = all_reduce_bytes(tensor, n, self.device)
        if small_all_reduce(tensor, self.device):
            self._gathered_sum(tensor.view(-1), kind)
            return _Done(tensor)

        def count(took: float) -> None:
            self.traffic.add(kind, moved, moved, took)

        with self.peers.watch(kind):
            work = self._dist.all_reduce(tensor, async_op=True)
        return _InFlight(work, (), tensor, count, lambda: self.peers.watch(kind))

    def _gathered_sum(self, flat: torch.Tensor, kind: str, group: Any = None,
                      max_last: int = 0) -> None:
        """Sum a small CPU tensor in place (its last ``max_last`` values: their maximum):
        every rank gathers every copy (one all-to-all) and combines the same copies the same
        way, so every rank gets the same bits."""
        n = self.world
        copies = torch.empty((n, flat.numel()), dtype=flat.dtype)
        repeated = flat.repeat(n)
        with self.peers.watch(kind):
            took = _timed(lambda: self._dist.all_to_all_single(copies, repeated, group=group))
        torch.sum(copies, dim=0, out=flat)
        if max_last:
            flat[-max_last:] = copies[:, -max_last:].amax(dim=0)
        moved = all_reduce_bytes(flat, n, torch.device("cpu"))
        self.traffic.add(kind, moved, moved, took)

    def broadcast_(self, tensor: torch.Tensor, src: int = 0) -> None:
        with self.peers.watch("broadcast"):
            self._dist.broadcast(tensor, src=src)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        with self.peers.watch("broadcast"):
            self._dist.broadcast_object_list(box, src=src, device=self._object_device())
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        with self.peers.watch("gather"):
            self._dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        with self.peers.watch("barrier"):
            self._dist.barrier()

    def _object_device(self) -> torch.device | None:
        return self.device if self.device.type == "cuda" else None
