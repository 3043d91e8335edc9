"""A job and its run on one rank: the job as a value (:class:`Job`) and what a rank reports
(:class:`RankResult`), :func:`run_rank` from the checkpoint lookup and the source to the final
report, the first placement, scoring, the rank's Prometheus metrics, and the check of a job's
settings against the machine before any rank starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetgmp.runtime import lazy_exports

if TYPE_CHECKING:
    from hetgmp.trainer.run.api import check_job, factory_path, train
    from hetgmp.trainer.run.job import Job, RankResult
    from hetgmp.trainer.run.metrics import check_metrics_port
    from hetgmp.trainer.run.placement import graph_placement, synthetic_samples
    from hetgmp.trainer.run.rank import gather_totals, run_jobs, run_rank
    from hetgmp.trainer.run.resources import check_disk_tier, check_resources

__all__ = [
    "Job",
    "RankResult",
    "check_disk_tier",
    "check_job",
    "check_metrics_port",
    "check_resources",
    "factory_path",
    "gather_totals",
    "graph_placement",
    "run_jobs",
    "run_rank",
    "synthetic_samples",
    "train",
]

__getattr__ = lazy_exports(__name__, {
    "Job": "hetgmp.trainer.run.job",
    "RankResult": "hetgmp.trainer.run.job",
    "check_disk_tier": "hetgmp.trainer.run.resources",
    "check_metrics_port": "hetgmp.trainer.run.metrics",
    "check_resources": "hetgmp.trainer.run.resources",
    "gather_totals": "hetgmp.trainer.run.rank",
    "graph_placement": "hetgmp.trainer.run.placement",
    "run_jobs": "hetgmp.trainer.run.rank",
    "run_rank": "hetgmp.trainer.run.rank",
    "check_job": "hetgmp.trainer.run.api",
    "factory_path": "hetgmp.trainer.run.api",
    "train": "hetgmp.trainer.run.api",
    "synthetic_samples": "hetgmp.trainer.run.placement",
})
