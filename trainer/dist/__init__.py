"""Ranks and their collectives: the communicator interface (gloo, NCCL, one rank, or threads in
one process), the launcher that starts a job's ranks (:class:`LaunchConfig`), and what a step
and the collectives count (bytes by purpose, :data:`KINDS`; :class:`StepCounters`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.dist.comm import Comm, LocalComm, Pending
    from hetgmp.trainer.dist.config import LaunchConfig
    from hetgmp.trainer.dist.counters import (
        EMBEDDING_KINDS,
        KINDS,
        ONLINE_KINDS,
        PHASES,
        StepCounters,
        Totals,
        Traffic,
    )
    from hetgmp.trainer.dist.launcher import (
        WorkerFailed,
        job_device,
        job_ranks,
        launch,
        resolve_device,
        run_torchrun,
        stop_event,
        under_torchrun,
    )
    from hetgmp.trainer.dist.peers import PeerLost, process_alive
    from hetgmp.trainer.dist.threads import ThreadComm, run_threads

__all__ = [
    "EMBEDDING_KINDS",
    "KINDS",
    "LaunchConfig",
    "ONLINE_KINDS",
    "PHASES",
    "StepCounters",
    "Totals",
    "Traffic",
    "Comm",
    "LocalComm",
    "Pending",
    "PeerLost",
    "ThreadComm",
    "WorkerFailed",
    "job_device",
    "job_ranks",
    "launch",
    "process_alive",
    "resolve_device",
    "run_threads",
    "run_torchrun",
    "stop_event",
    "under_torchrun",
]

__getattr__ = lazy_exports(__name__, {
    "EMBEDDING_KINDS": "hetgmp.trainer.dist.counters",
    "KINDS": "hetgmp.trainer.dist.counters",
    "LaunchConfig": "hetgmp.trainer.dist.config",
    "ONLINE_KINDS": "hetgmp.trainer.dist.counters",
    "PHASES": "hetgmp.trainer.dist.counters",
    "StepCounters": "hetgmp.trainer.dist.counters",
    "Totals": "hetgmp.trainer.dist.counters",
    "Traffic": "hetgmp.trainer.dist.counters",
    "Comm": "hetgmp.trainer.dist.comm",
    "LocalComm": "hetgmp.trainer.dist.comm",
    "Pending": "hetgmp.trainer.dist.comm",
    "PeerLost": "hetgmp.trainer.dist.peers",
    "ThreadComm": "hetgmp.trainer.dist.threads",
    "WorkerFailed": "hetgmp.trainer.dist.launcher",
    "job_device": "hetgmp.trainer.dist.launcher",
    "job_ranks": "hetgmp.trainer.dist.launcher",
    "launch": "hetgmp.trainer.dist.launcher",
    "process_alive": "hetgmp.trainer.dist.peers",
    "resolve_device": "hetgmp.trainer.dist.launcher",
    "run_threads": "hetgmp.trainer.dist.threads",
    "run_torchrun": "hetgmp.trainer.dist.launcher",
    "stop_event": "hetgmp.trainer.dist.launcher",
    "under_torchrun": "hetgmp.trainer.dist.launcher",
})
