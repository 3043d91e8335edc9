"""Ranks and their collectives: the communicator interface (gloo, NCCL, one rank, or threads in
one process), the launcher that starts a job's ranks (:class:`LaunchConfig`), and what a step
and the collectives count (bytes by purpose, :data:`KINDS`; :class:`StepCounters`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.dist.comm import Comm, LocalComm, Pending
    from trainer.dist.config import LaunchConfig
    from trainer.dist.counters import (
        EMBEDDING_KINDS,
        KINDS,
        ONLINE_KINDS,
        PHASES,
        StepCounters,
        Totals,
        Traffic,
    )
    from trainer.dist.launcher import (
        WorkerFailed,
        job_device,
        job_ranks,
        launch,
        resolve_device,
        run_torchrun,
        stop_event,
        under_torchrun,
    )
    from trainer.dist.peers import PeerLost
    from trainer.dist.threads import ThreadComm, run_threads

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
    "resolve_device",
    "run_threads",
    "run_torchrun",
    "stop_event",
    "under_torchrun",
]

__getattr__ = lazy_exports(__name__, {
    "EMBEDDING_KINDS": "trainer.dist.counters",
    "KINDS": "trainer.dist.counters",
    "LaunchConfig": "trainer.dist.config",
    "ONLINE_KINDS": "trainer.dist.counters",
    "PHASES": "trainer.dist.counters",
    "StepCounters": "trainer.dist.counters",
    "Totals": "trainer.dist.counters",
    "Traffic": "trainer.dist.counters",
    "Comm": "trainer.dist.comm",
    "LocalComm": "trainer.dist.comm",
    "Pending": "trainer.dist.comm",
    "PeerLost": "trainer.dist.peers",
    "ThreadComm": "trainer.dist.threads",
    "WorkerFailed": "trainer.dist.launcher",
    "job_device": "trainer.dist.launcher",
    "job_ranks": "trainer.dist.launcher",
    "launch": "trainer.dist.launcher",
    "resolve_device": "trainer.dist.launcher",
    "run_threads": "trainer.dist.threads",
    "run_torchrun": "trainer.dist.launcher",
    "stop_event": "trainer.dist.launcher",
    "under_torchrun": "trainer.dist.launcher",
})
