"""Ranks and their collectives: the communicator interface (gloo, NCCL, one rank, or threads in
one process), the launcher that starts a job's ranks (:class:`LaunchConfig`), and what a step
and the collectives count (bytes by purpose, :data:`KINDS`; :class:`StepCounters`)."""

from trainer.dist.comm import Comm, Counts, DistComm, LocalComm, Pending
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
from trainer.dist.launch import (
    WorkerFailed,
    gpus_needed,
    job_device,
    job_ranks,
    launch,
    resolve_device,
    run_torchrun,
    stop_event,
    under_torchrun,
)
from trainer.dist.peers import PeerLost
from trainer.dist.threads import ThreadComm, ThreadGroup, run_threads

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
    "Counts",
    "DistComm",
    "LocalComm",
    "Pending",
    "PeerLost",
    "ThreadComm",
    "ThreadGroup",
    "WorkerFailed",
    "gpus_needed",
    "job_device",
    "job_ranks",
    "launch",
    "resolve_device",
    "run_threads",
    "run_torchrun",
    "stop_event",
    "under_torchrun",
]
