"""Which rank is gone, when a collective fails.

gloo and NCCL report a dead peer as a broken connection ("Connection closed by peer
[127.0.0.1]:41623") or a timeout, naming an address, not a rank. At start every rank learns
every rank's host and process id; when a collective fails, the ranks on this host whose
processes are gone (or zombies) are named, and the ranks on other hosts are listed as the ones
to look at. The error says which collective, which ranks and why.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PeerLost", "Peers", "process_alive"]


class PeerLost(RuntimeError):
    """A collective failed because a rank of the job is gone (or unreachable).

    Attributes:
        lost: Ranks known to be gone (their processes on this host are dead).
        unknown: Ranks on other hosts, which this rank cannot look at.
    """

    def __init__(self, message: str, lost: list[int], unknown: list[int]) -> None:
        super().__init__(message)
        self.lost, self.unknown = lost, unknown


# What gloo, NCCL and the rendezvous store say when a peer went away or stopped answering.
_PEER_WORDS = ("connection", "closed by peer", "reset by peer", "timed out", "timeout",
               "broken pipe", "socket", "unreachable", "remote process exited",
               "nccl communicator was aborted")


# A peer's sockets close while its process exits, before the kernel marks it a zombie: the
# survivor reads "connection reset" while /proc still shows the peer running. How long a
# survivor that heard a peer's words watches for a process of this host to be gone before
# saying that none is (a killed torchrun agent's rank was named on a quiet machine, and
# not once beside a busy test suite).
_SETTLE_S = 3.0


def _looks_like_a_peer(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(w in text for w in _PEER_WORDS)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie, dead but not reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: os.kill's word is all there is
    return state not in ("Z", "X")


@dataclass(frozen=True)
class Peers:
    """Every rank's host and process id, and this rank's place among them.

    Attributes:
        rank: This rank.
        hosts: Host name of each rank.
        pids: Process id of each rank.
    """

    rank: int
    hosts: tuple[str, ...]
    pids: tuple[int, ...]

    @staticmethod
    def here() -> tuple[str, int]:
        """This process's (host, pid), what each rank contributes."""
        return socket.gethostname(), os.getpid()

    def lost(self, settle_s: float = 0.0) -> tuple[list[int], list[int]]:
        """(ranks of this host whose process is gone, ranks on other hosts); ``settle_s``:
        how long to watch for one to go when none is gone yet."""
        me = self.hosts[self.rank]
        local = [r for r, h in enumerate(self.hosts) if h == me and r != self.rank]
        deadline = time.monotonic() + settle_s
        while True:
            gone = [r for r in local if not process_alive(self.pids[r])]
            if gone or not local or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        elsewhere = [r for r, h in enumerate(self.hosts) if h != me]
        return gone, elsewhere

    @contextlib.contextmanager
    def watch(self, what: str) -> Iterator[None]:
        """Turn a failing collective into :class:`PeerLost` naming the ranks to blame."""
        try:
            yield
        except RuntimeError as exc:  # gloo's, NCCL's and the store's errors are RuntimeErrors
            if isinstance(exc, PeerLost):
                raise
            peer = _looks_like_a_peer(exc)
            gone, elsewhere = self.lost(_SETTLE_S if peer else 0.0)
            # Out of memory, a wrong split size, a local bug: not a peer's doing, unless one
            # is known to be gone.
            if not gone and not peer:
                raise
            if gone:
                who = ", ".join(f"rank {r} (pid {self.pids[r]})" for r in gone)
                head = f"{who} of this machine {'is' if len(gone) == 1 else 'are'} gone"
            elif elsewhere:
                head = (f"a rank on another machine is gone or unreachable (ranks "
                        f"{elsewhere}: see their logs)")
            else:
                head = "a peer did not answer"
            raise PeerLost(f"the {what} collective failed on rank {self.rank}: {head}; "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                           gone, elsewhere) from exc
