"""A job and its run on one rank: the job as a value (:class:`Job`) and what a rank reports
(:class:`RankResult`), :func:`run_rank` from the checkpoint lookup and the source to the final
report, the first placement, scoring, the rank's Prometheus metrics, and the check of a job's
settings against the machine before any rank starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime import lazy_exports

if TYPE_CHECKING:
    from trainer.run.evaluation import Progressive, score_batches, score_heldout
    from trainer.run.job import Job, RankResult
    from trainer.run.metrics import TrainerMetrics, check_metrics_port, serve_rank
    from trainer.run.placement import Start, graph_placement, initial_placement
    from trainer.run.rank import find_checkpoint, gather_totals, model_shape, run_jobs, run_rank
    from trainer.run.resources import check_resources

__all__ = [
    "Job",
    "Progressive",
    "RankResult",
    "Start",
    "TrainerMetrics",
    "check_metrics_port",
    "check_resources",
    "find_checkpoint",
    "gather_totals",
    "graph_placement",
    "initial_placement",
    "model_shape",
    "run_jobs",
    "run_rank",
    "score_batches",
    "score_heldout",
    "serve_rank",
]

__getattr__ = lazy_exports(__name__, {
    "Job": "trainer.run.job",
    "Progressive": "trainer.run.evaluation",
    "RankResult": "trainer.run.job",
    "Start": "trainer.run.placement",
    "TrainerMetrics": "trainer.run.metrics",
    "check_metrics_port": "trainer.run.metrics",
    "check_resources": "trainer.run.resources",
    "find_checkpoint": "trainer.run.rank",
    "gather_totals": "trainer.run.rank",
    "graph_placement": "trainer.run.placement",
    "initial_placement": "trainer.run.placement",
    "model_shape": "trainer.run.rank",
    "run_jobs": "trainer.run.rank",
    "run_rank": "trainer.run.rank",
    "score_batches": "trainer.run.evaluation",
    "score_heldout": "trainer.run.evaluation",
    "serve_rank": "trainer.run.metrics",
})
