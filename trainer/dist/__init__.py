"""Ranks and their collectives: the communicator interface (gloo, NCCL, one rank, or threads in
one process) and the launcher that starts a job's ranks."""

from trainer.dist.comm import Comm, Counts, DistComm, LocalComm, Pending
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
from trainer.dist.resources import check_resources
from trainer.dist.threads import ThreadComm, ThreadGroup, run_threads

__all__ = [
    "Comm",
    "Counts",
    "DistComm",
    "LocalComm",
    "Pending",
    "PeerLost",
    "ThreadComm",
    "ThreadGroup",
    "WorkerFailed",
    "check_resources",
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
