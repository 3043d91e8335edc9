"""Process and port helpers shared by every long-running part: the broker child, trainer ranks,
metrics servers."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import threading
import time
from typing import Callable, Iterator, Protocol, TypeVar

__all__ = ["die_with_parent", "free_port", "free_ports", "port_free", "stop_on_signals",
           "when_gone"]

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As a server binds it: connections in TIME_WAIT from an earlier broker do not count,
        # a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(start: int, count: int, host: str = "127.0.0.1") -> int:
    """The first port from ``start`` that begins ``count`` ports in a row free on ``host``.

    For servers that bind a while later (rank r serves on ``base + r`` once started): a port
    below the kernel's ephemeral range (32768 and up by default) cannot meanwhile become the
    local end of some outgoing connection, as one :func:`free_port` returned can.
    """
    for base in range(start, min(start + 1000, 65537 - count), count):
        if all(port_free(host, p) for p in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} free ports in a row from {start}")


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send this process ``sig`` when its parent dies (Linux; elsewhere a
    no-op): used between fork and exec for the broker, and at start-up by trainer ranks."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def when_gone(pid: int, callback: Callable[[], None]) -> None:
    """Call ``callback`` on a daemon thread once process ``pid`` has exited (at once if it is
    gone already).

    For a process that is not this one's parent, where ``PR_SET_PDEATHSIG`` cannot help: a
    trainer rank forked by multiprocessing's fork server watches the launcher that asked for
    it. Waits on a pidfd (Linux 5.3 and later, no polling); elsewhere checks every half second.
    """
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        callback()
        return
    except (AttributeError, OSError):
        fd = None

    def wait() -> None:
        if fd is not None:
            try:
                select.select([fd], [], [])  # readable once the process has exited
            finally:
                os.close(fd)
        else:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(0.5)
        callback()

    threading.Thread(target=wait, name=f"when-gone-{pid}", daemon=True).start()


class _Settable(Protocol):
    def set(self) -> None: ...

    def is_set(self) -> bool: ...


S = TypeVar("S", bound=_Settable)


@contextlib.contextmanager
def stop_on_signals(stop: S) -> Iterator[S]:
    """Within the block, SIGINT and SIGTERM set ``stop`` (a ``threading`` or
    ``multiprocessing`` event) for a graceful end; a second signal raises KeyboardInterrupt
    (give up on the graceful path). The previous handlers are back afterwards. Main thread
    only, as Python's signal handlers are."""

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.info("%s received: stopping after the current step", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
