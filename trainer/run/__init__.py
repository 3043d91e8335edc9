"""A job and its run on one rank: the job as a value (:class:`Job`) and what a rank reports
(:class:`RankResult`), :func:`run_rank` from the checkpoint lookup and the source to the final
report, the first placement, scoring, the rank's Prometheus metrics, and the check of a job's
settings against the machine before any rank starts."""

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
