"""Rank 0's partitioner in a process of its own.

Kept in a module of its own that imports no torch: the spawned process imports only what the
partitioner needs (numpy, pymetis, the window), so it starts in well under a second.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
import traceback
from typing import Any

import numpy as np

from hetgmp.partitioner import (
    IncrementalPartitioner,
    PartitionConfig,
    PassReport,
    Placement,
    WindowGraph,
)
from hetgmp.streaming import AccessWindow, WindowConfig

__all__ = ["PartitionerProcess"]


class PartitionerProcess:
    """Rank 0's partitioner in a process of its own: the access window and the incremental
    partitioner live there, so their numpy and METIS work never holds the training process's
    GIL. Samples go in and placements come back through a pipe; the process exits when the
    pipe closes (the rank ended or died).

    Args:
        fields: Ids per sample.
        window: Samples in the access window.
        config: Partitioner settings.
    """

    def __init__(self, fields: int, window: int, config: PartitionConfig) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_partitioner_main, args=(child, fields, window, config),
                                 name="hetgmp-partitioner", daemon=True)
        self._proc.start()
        child.close()

    def partition(self, parts: list[tuple[np.ndarray, np.ndarray]], current: Placement | None,
                  version: int) -> tuple[Placement, float, str, PassReport | None]:
        """Roll ``parts`` into the window and place it: (placement, seconds, kind, and what an
        incremental pass moved)."""
        try:
            self._conn.send((parts, current, version))
            status, payload = self._conn.recv()
        except (EOFError, OSError) as exc:  # the pipe broke: the process is gone
            self._proc.join(1.0)
            code = self._proc.exitcode
            how = (f"was killed by signal {-code}" if code is not None and code < 0
                   else f"exited with code {code}" if code is not None else "stopped answering")
            hint = " (SIGKILL is often the kernel's OOM killer: a smaller --window needs less " \
                   "memory)" if code == -signal.SIGKILL else ""
            raise RuntimeError(f"the partitioner process (pid {self._proc.pid}) {how}{hint}"
                               ) from exc
        if status != "ok":
            raise RuntimeError(f"partitioner failed: {payload}")
        return payload

    def close(self) -> None:
        """End the process."""
        self._conn.close()
        self._proc.join(5.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5.0)


def _partitioner_main(conn: Any, fields: int, window_size: int, config: PartitionConfig) -> None:
    """Body of the partitioner process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job handles Ctrl-C
    window = AccessWindow(fields, WindowConfig(capacity=window_size))
    partitioner = IncrementalPartitioner(config)
    while True:
        try:
            parts, current, version = conn.recv()
        except (EOFError, OSError):
            return
        try:
            t0 = time.monotonic()
            for p in parts:
                window.add(p)
            indptr, indices = window.csr()
            placement = partitioner.partition(WindowGraph(indptr, indices, start=window.start),
                                              current)
            if placement.version <= version:
                placement = placement.with_version(version + 1)
            kind = "full" if current is None else "incremental"
            reply: tuple[str, Any] = ("ok", (placement, time.monotonic() - t0, kind,
                                             partitioner.last_pass))
        except Exception as exc:  # reported to rank 0, which fails the job
            reply = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        try:
            conn.send(reply)
        except OSError:  # the rank closed the pipe while this placement was computed: job over
            return
