"""Start the ranks of a job: N processes on this machine, or this process under torchrun.

:func:`launch` starts one process per rank, each from a clean interpreter: no forked Kafka
client, thread or socket of the launcher's. CPU ranks are forked from multiprocessing's fork
server, a fresh process that has imported torch and the trainer once (a rank then starts in
milliseconds instead of importing torch, 1.5-3 s of CPU each); CUDA ranks are spawned, so that
nothing that may have touched the driver is ever forked. Each joins a ``torch.distributed``
group (gloo on CPU, NCCL on CUDA, one GPU per rank) with a timeout on every collective, runs
``fn(comm, arg)`` and sends back its result or its exception with the traceback. The parent
watches every rank: the first failure (an exception, or a rank that died without a word, e.g.
killed by the OOM killer) stops the others (terminate -> join(timeout) -> kill) and raises
:class:`WorkerFailed` naming the rank and the cause, so a dead rank never leaves its peers
hanging in a collective.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) :func:`run_torchrun` runs the
one rank of this process; torchrun itself takes the job down when a rank dies.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, TypeVar

import torch

from hetgmp.runtime import die_with_parent, env_value, setup_logging, when_gone
from hetgmp.trainer.dist.allocator import keep_freed_memory
from hetgmp.trainer.dist.comm import Comm, DistComm, LocalComm
from hetgmp.trainer.dist.config import LaunchConfig
from hetgmp.trainer.dist.peers import PeerLost

__all__ = [
    "WorkerFailed",
    "gpus_needed",
    "job_device",
    "job_ranks",
    "launch",
    "resolve_device",
    "run_torchrun",
    "stop_event",
    "under_torchrun",
]

log = logging.getLogger(__name__)

A = TypeVar("A")
R = TypeVar("R")

_STOP_GRACE_S = 5.0
# A rank whose launcher died stops gracefully within this many collective timeouts, or exits.
_ORPHAN_GRACE = 2.0
_ORPHAN_EXIT = 75  # EX_TEMPFAIL: resume from the last checkpoint
_LOOPBACK = "127.0.0.1"
# What the fork server imports once for every CPU rank it forks (a failed import is skipped).
_PRELOAD = ["torch", "torch.distributed", "hetgmp.trainer.run.rank", "hetgmp.trainer.online.loop"]


class WorkerFailed(RuntimeError):
    """A rank of the job failed; the job was stopped.

    Attributes:
        rank: The first rank that failed.
        detail: Its exception and traceback, or how it died.
        summary: One line: the exception's type and message, or how it died.
    """

    def __init__(self, rank: int, detail: str, summary: str | None = None) -> None:
        super().__init__(f"rank {rank} failed: {detail}")
        self.rank = rank
        self.detail = detail
        self.summary = summary or detail.splitlines()[0]


def resolve_device(kind: str, needed: int = 1, *, warn: bool = True) -> Literal["cpu", "cuda"]:
    """``cpu`` or ``cuda`` for a device setting of ``auto``, ``cpu`` or ``cuda``.

    A CUDA job gives each rank of a machine a GPU of its own: NCCL refuses two ranks on one
    device. ``needed`` is how many GPUs this process must see for that (see
    :func:`gpus_needed`). ``auto`` is CUDA only when it sees that many, and otherwise falls back
    to CPU (gloo), saying so unless ``warn`` is off; ``cuda`` with too few is an error.

    Raises:
        ValueError: ``cuda`` asked for, and torch sees no CUDA device or fewer than
            ``needed``; or an unknown ``kind``.
    """
    if kind not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {kind!r}: expected auto, cpu or cuda")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    advice = ("run as many ranks per machine as it has GPUs (--workers, or torchrun's "
              "--nproc-per-node)")
    if kind == "auto":
        if warn and 0 < gpus < needed:
            log.warning("%d rank(s) on this machine but %d GPU(s), one needed per rank: "
                        "running on CPU (gloo); to use the GPUs, %s", needed, gpus, advice)
        return "cuda" if 0 < gpus and needed <= gpus else "cpu"
    if kind == "cuda" and gpus == 0:
        raise ValueError("--device cuda, but torch sees no CUDA device")
    if kind == "cuda" and gpus < needed:
        raise ValueError(f"--device cuda with {needed} ranks on this machine needs a GPU "
                         f"per rank (NCCL), but torch sees {gpus}: {advice}, or use "
                         f"--device cpu")
    return "cuda" if kind == "cuda" else "cpu"


def gpus_needed(config: LaunchConfig) -> int:
    """GPUs this process must see so that every rank of its machine gets one of its own.

    Ranks this launcher starts use ``cuda:0`` .. ``cuda:workers-1``. A torchrun rank uses
    ``cuda:(LOCAL_RANK % visible)``: it needs ``LOCAL_WORLD_SIZE`` visible GPUs (``WORLD_SIZE``
    when the launcher does not say), or one, when ``CUDA_VISIBLE_DEVICES`` gives each process
    a single device of its own (as ``srun --gpus-per-task=1`` does).
    """
    if not under_torchrun():
        return config.workers
    visible = env_value("CUDA_VISIBLE_DEVICES")
    if visible is not None and len([d for d in visible.split(",") if d.strip()]) == 1:
        return 1
    return int(env_value("LOCAL_WORLD_SIZE") or env_value("WORLD_SIZE") or 1)


def job_device(config: LaunchConfig) -> Literal["cpu", "cuda"]:
    """The device of this process's ranks for ``config.device``, checked before any starts.

    Under torchrun with ranks on several machines, ``auto`` is refused: each machine would
    decide alone, and one picking NCCL while another picks gloo hangs the rendezvous.

    Raises:
        ValueError: See :func:`resolve_device`; or ``auto`` across machines.
    """
    if under_torchrun() and config.device == "auto":
        local = env_value("LOCAL_WORLD_SIZE")
        if local is not None and job_ranks(config) > int(local):
            raise ValueError("--device auto with ranks on several machines: each machine would "
                             "choose alone (NCCL on one, gloo on another hangs the job); pass "
                             "--device cuda or --device cpu")
    # Under torchrun every rank of the machine resolves the device: one of them says why.
    warn = not under_torchrun() or int(env_value("LOCAL_RANK") or 0) == 0
    return resolve_device(config.device, gpus_needed(config), warn=warn)


@dataclass(frozen=True)
class _Rendezvous:
    rank: int
    world: int
    init_method: str
    device: str
    timeout_s: float
    threads: int
    log_level: int = logging.INFO
    keep_freed_memory: bool = True
    store_port: int | None = None
    # The launcher's environment when it started the rank: a forked rank would otherwise see
    # the fork server's, as it was when the server started.
    env: tuple[tuple[str, str], ...] = ()
    launcher_pid: int = 0


def _device_for(kind: str, local_rank: int) -> torch.device:
    if kind == "cuda":
        # Below the count whenever gpus_needed() held, except for a process that sees the one
        # GPU of its own (CUDA_VISIBLE_DEVICES): device 0 then.
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _init_group(rv: _Rendezvous, local_rank: int, stop: Any = None) -> DistComm:
    import torch.distributed as dist

    torch.set_num_threads(rv.threads)
    if rv.keep_freed_memory:
        keep_freed_memory()
    device = _device_for(rv.device, local_rank)
    timeout = datetime.timedelta(seconds=rv.timeout_s)
    where: dict[str, Any] = {"init_method": rv.init_method}
    if rv.store_port is not None:  # every rank a client of the launcher's loopback store
        where = {"store": dist.TCPStore(_LOOPBACK, rv.store_port, is_master=False,
                                        timeout=timeout)}
    dist.init_process_group(
        "nccl" if rv.device == "cuda" else "gloo",
        rank=rv.rank,
        world_size=rv.world,
        timeout=timeout,
        # Binds the NCCL group to this rank's GPU (else barrier() guesses the device, and warns).
        device_id=device if device.type == "cuda" else None,
        **where,
    )
    return DistComm(device, stop)


class LoopbackStore:
    """A rendezvous store served on 127.0.0.1 only, for the ranks of one machine.

    ``init_process_group("tcp://127.0.0.1:PORT")`` has rank 0 serve the store on every
    interface (IPv4 and IPv6) for the whole run, readable and writable by anyone who can reach
    the machine: the host only tells clients where to connect. Here the launcher binds the
    listening socket itself and hands it to the store (``master_listen_fd``); the ranks are its
    clients.

    Args:
        timeout_s: How long a rank may wait on the store.
    """

    def __init__(self, timeout_s: float) -> None:
        import torch.distributed as dist

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((_LOOPBACK, 0))
        sock.listen(128)
        self.port = int(sock.getsockname()[1])
        # The store's server takes the socket over (and closes it when it goes).
        self._store: Any = dist.TCPStore(
            _LOOPBACK, self.port, None, True, datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False, master_listen_fd=sock.detach())

    def close(self) -> None:
        """Stop serving."""
        self._store = None


def _loopback_interface() -> str | None:
    """Name of the loopback interface (``lo`` on Linux), for gloo's and NCCL's own sockets."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n == "lo" or n.startswith("lo")), None)


def _child(rv: _Rendezvous, fn: Callable[[Comm, Any], Any], arg: Any,
           conn: mpc.Connection, stop: Any) -> None:
    """Body of a rank: run ``fn`` and report the outcome through ``conn``."""
    import torch.distributed as dist

    if rv.env:
        os.environ.clear()
        os.environ.update(rv.env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # SIGTERM to a rank (a process-group SIGTERM from systemd or `kill -- -PGID`, or the
    # launcher dying) asks the whole job to stop gracefully through the shared stop event: last
    # step, checkpoint, commit. A rank stuck in a collective with a dead peer does not run the
    # handler; the launcher's stop then kills it after a grace period. A forked rank's parent is
    # the fork server, not the launcher, so the rank watches the launcher itself.
    launcher_gone = threading.Event()

    def on_term(_signum: int, _frame: Any) -> None:
        stop.set()
        if launcher_gone.is_set():
            # The launcher is gone (killed -9): nobody kills this rank after a grace period if
            # the graceful stop hangs (the broker gone too, a peer dead in a collective). It
            # exits by itself then; the last complete checkpoint stands (MANIFEST is last).
            timer = threading.Timer(_ORPHAN_GRACE * rv.timeout_s,
                                    lambda: os._exit(_ORPHAN_EXIT))
            timer.daemon = True
            timer.start()

    def on_launcher_gone() -> None:
        launcher_gone.set()
        os.kill(os.getpid(), signal.SIGTERM)  # without a stop event: the default, exit

    if stop is not None:
        signal.signal(signal.SIGTERM, on_term)
    if rv.launcher_pid:
        when_gone(rv.launcher_pid, on_launcher_gone)
    setup_logging(rv.log_level, f"%(asctime)s %(levelname)s rank{rv.rank} %(name)s: %(message)s",
                  kafka_level=logging.WARNING)
    try:
        comm = _init_group(rv, rv.rank, stop)
        result = fn(comm, arg)
        # Plain pickle, not the connection's: multiprocessing's reducer would pass tensors as
        # shared-memory handles, which die with this process before the parent reads them.
        conn.send_bytes(pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:
        with contextlib.suppress(Exception):
            summary = f"{type(exc).__name__}: {exc}"
            conn.send_bytes(pickle.dumps(("error", (summary, traceback.format_exc()))))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        conn.close()


@contextlib.contextmanager
def _child_env(threads: int) -> Iterator[None]:
    """What spawned children inherit at start: thread caps, and gloo's and NCCL's sockets on
    the loopback interface (they would listen on the address the host name resolves to) unless
    the user chose an interface."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    values = {k: str(threads) for k in keys}
    loop = _loopback_interface()
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if loop is not None and env_value(key) is None:
            values[key] = loop
    saved = {k: env_value(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code} without reporting a result"


def _stop(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(_STOP_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(_STOP_GRACE_S)


def _context(device: str) -> Any:
    """The start method of a rank on ``device`` (see the module's docstring)."""
    if device == "cuda":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts, ignored afterwards
    return ctx


def stop_event() -> Any:
    """An event that :func:`launch` hands to every rank (``comm.stop_requested()``)."""
    return mp.get_context("spawn").Event()


def launch(fn: Callable[[Comm, A], R], arg: A, config: LaunchConfig | None = None,
           stop: Any = None) -> list[R]:
    """Run ``fn(comm, arg)`` on ``config.workers`` ranks of this machine; results by rank.

    One worker runs in this process with a :class:`~hetgmp.trainer.dist.comm.LocalComm` (no group).
    ``fn`` and ``arg`` must be picklable (a module-level function and plain data).

    Args:
        fn: The rank's work.
        arg: Its argument.
        config: Ranks, device, collective timeout, threads.
        stop: An event from :func:`stop_event`; once set, ``comm.stop_requested()`` is true
            on every rank (graceful stop: the ranks agree on a last step themselves).

    Raises:
        WorkerFailed: A rank raised or died; the other ranks have been stopped.
    """
    config = config or LaunchConfig()
    device = resolve_device(config.device, config.workers)
    if config.workers == 1:
        torch.set_num_threads(config.threads)
        if config.keep_freed_memory:
            keep_freed_memory()
        return [fn(LocalComm(_device_for(device, 0), stop), arg)]
    ctx = _context(device)
    store = LoopbackStore(config.timeout_s)
    procs, conns = [], []
    try:
        with _child_env(config.threads):
            for rank in range(config.workers):
                rv = _Rendezvous(rank, config.workers, "", device, config.timeout_s,
                                 config.threads, logging.getLogger().getEffectiveLevel(),
                                 config.keep_freed_memory, store_port=store.port,
                                 env=tuple(os.environ.items()), launcher_pid=os.getpid())
                parent_end, child_end = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child, args=(rv, fn, arg, child_end, stop),
                                name=f"hetgmp-rank{rank}", daemon=False)
                p.start()
                child_end.close()  # the parent keeps only its end: EOF means the child is gone
                procs.append(p)
                conns.append(parent_end)
        return _collect(procs, conns)
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        store.close()


def _collect(procs: list[Any], conns: list[mpc.Connection]) -> list[Any]:
    results: list[Any] = [None] * len(procs)
    waiting = dict(enumerate(conns))
    while waiting:
        ready = mpc.wait(list(waiting.values()), timeout=1.0)
        for rank, conn in list(waiting.items()):
            if conn not in ready:
                continue
            outcome = _outcome(procs, rank, conn)
            if isinstance(outcome, WorkerFailed):
                if outcome.summary.startswith(f"{_PEER_LOST}:"):
                    # A peer's loss is a symptom: the rank that died or raised is the cause,
                    # whichever the launcher heard first (on a loaded machine the survivor's
                    # collective can fail before the dead rank's pipe closes).
                    del waiting[rank]
                    raise _cause(procs, waiting) or outcome from None
                raise outcome from None
            results[rank] = outcome
            del waiting[rank]
    for p in procs:
        p.join(_STOP_GRACE_S)
    return results


_PEER_LOST = PeerLost.__name__


def _outcome(procs: list[Any], rank: int, conn: mpc.Connection) -> Any:
    """What rank ``rank`` sent on ``conn`` (which is ready): its result, or a
    :class:`WorkerFailed` for an error it reported or its death."""
    try:
        status, payload = pickle.loads(conn.recv_bytes())
    except EOFError:
        procs[rank].join(_STOP_GRACE_S)
        return WorkerFailed(rank, _describe_exit(procs[rank].exitcode))
    if status != "ok":
        summary, trace = payload
        return WorkerFailed(rank, f"{summary}\n{trace}", summary)
    return payload


def _cause(procs: list[Any], waiting: dict[int, mpc.Connection]) -> WorkerFailed | None:
    """The failure of another rank, one that is not itself a lost peer, heard within
    :data:`_STOP_GRACE_S` (None: none came)."""
    deadline = time.monotonic() + _STOP_GRACE_S
    while waiting and (left := deadline - time.monotonic()) > 0:
        for conn in mpc.wait(list(waiting.values()), timeout=left):
            rank = next(r for r, c in waiting.items() if c is conn)
            del waiting[rank]
            outcome = _outcome(procs, rank, conn)  # type: ignore[arg-type]
            if isinstance(outcome, WorkerFailed) and \
                    not outcome.summary.startswith(f"{_PEER_LOST}:"):
                return outcome
    return None


def under_torchrun() -> bool:
    """Whether this process is a rank started by torchrun (or any launcher setting RANK)."""
    return env_value("RANK") is not None and env_value("WORLD_SIZE") is not None


def job_ranks(config: LaunchConfig) -> int:
    """Ranks of the whole job: torchrun's ``WORLD_SIZE`` under it, else ``config.workers``."""
    return int(env_value("WORLD_SIZE") or 1) if under_torchrun() else config.workers


def run_torchrun(fn: Callable[[Comm, A], R], arg: A, config: LaunchConfig | None = None,
                 stop: Any = None) -> R:
    """Run this process's rank of a torchrun job (``env://`` rendezvous); its result."""
    import torch.distributed as dist

    config = config or LaunchConfig()
    rank = int(env_value("RANK") or 0)
    world = int(env_value("WORLD_SIZE") or 1)
    local_rank = int(env_value("LOCAL_RANK") or 0)
    # An agent that dies without stopping its ranks (SIGKILL, the OOM killer) is a machine
    # gone: its ranks go too, and their peers' next collective names them (PeerLost).
    die_with_parent(signal.SIGKILL)
    rv = _Rendezvous(rank, world, "env://", job_device(config), config.timeout_s, config.threads,
                     keep_freed_memory=config.keep_freed_memory)
    comm = _init_group(rv, local_rank, stop)
    try:
        return fn(comm, arg)
    finally:
        dist.destroy_process_group()
