"""The ranks' metrics, scraped: what the live view and the report are drawn from.

The demo reads the very endpoints Prometheus would scrape, once a second, and sums (or
combines) every rank's figures into one :class:`Snapshot` of the job.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Snapshot", "Timeline", "combine", "quantile", "scrape", "total", "window_quantile"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str, timeout: float = 2.0) -> Samples:
    """Samples of a Prometheus endpoint: sample name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def total(samples: Samples, name: str, **match: str) -> float:
    """Sum of the samples of ``name`` whose labels match ``match``."""
    return sum(v for labels, v in samples.get(name, [])
               if all(labels.get(k) == want for k, want in match.items()))


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Quantile of a cumulative histogram [(upper bound, count)] (upper bound of its bucket)."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    target = q * buckets[-1][1]
    for le, count in buckets:
        if count >= target:
            return le
    return buckets[-1][0]


@dataclass
class Snapshot:
    """The job's figures at one moment, summed (or combined) over ranks."""

    t: float
    trained: float = 0.0
    not_held: float = 0.0
    consumed: float = 0.0
    version: float = 0.0
    repartitions: float = 0.0
    migrated: float = 0.0
    migrating_steps: float = 0.0
    loss_sum: float = 0.0
    auc: float = math.nan
    task_auc: dict[str, float] = field(default_factory=dict)  # several labels: by task
    staleness: list[tuple[float, float]] = field(default_factory=list)
    freshness: list[tuple[float, float]] = field(default_factory=list)
    checkpoint_age: float = math.nan
    refreshes: float = 0.0
    pushes: float = 0.0
    # hetgmp serve (nan / empty until it answers)
    serve_lag: float = math.nan
    serve_scored: float = 0.0
    serve_latency: list[tuple[float, float]] = field(default_factory=list)


def combine(t: float, per_rank: list[Samples], serve: Samples | None = None) -> Snapshot:
    """One snapshot of the job from every rank's samples (and a serve process's) at ``t``."""
    snap = Snapshot(t)
    if serve:
        lags = [v for _, v in serve.get("hetgmp_serve_model_lag_seconds", [])]
        snap.serve_lag = lags[0] if lags else math.nan
        snap.serve_scored = total(serve, "hetgmp_serve_records_scored_total")
        snap.serve_latency = sorted((float(labels["le"]), v) for labels, v in
                                    serve.get("hetgmp_serve_request_seconds_bucket", []))
    hists: dict[str, dict[float, float]] = {"staleness": {}, "freshness": {}}
    aucs, ages = [], []
    tasks: dict[str, list[float]] = {}
    for s in per_rank:
        snap.trained += total(s, "hetgmp_samples_trained_total")
        snap.loss_sum += total(s, "hetgmp_train_logloss_total")
        snap.not_held += total(s, "hetgmp_remote_rows_total") + total(
            s, "hetgmp_replica_refreshes_total")
        snap.consumed += total(s, "hetgmp_records_consumed_total")
        snap.repartitions = max(snap.repartitions, total(s, "hetgmp_repartitions_total"))
        snap.migrated += total(s, "hetgmp_migrated_rows_total")
        snap.migrating_steps = max(snap.migrating_steps, total(s, "hetgmp_migration_steps_total"))
        snap.refreshes += total(s, "hetgmp_replica_refreshes_total")
        snap.pushes += total(s, "hetgmp_replica_pushes_total")
        snap.version = max([snap.version] + [v for _, v in s.get("hetgmp_placement_version", [])])
        aucs += [v for _, v in s.get("hetgmp_heldout_auc", []) if v == v]
        for labels, v in s.get("hetgmp_task_auc", []):
            if v == v:
                tasks.setdefault(labels.get("task", ""), []).append(v)
        ages += [v for _, v in s.get("hetgmp_checkpoint_age_seconds", [])]
        for key, name in (("staleness", "hetgmp_replica_staleness_updates_bucket"),
                          ("freshness", "hetgmp_freshness_seconds_bucket")):
            for labels, v in s.get(name, []):
                le = float(labels["le"])
                hists[key][le] = hists[key].get(le, 0.0) + v
    snap.auc = float(np.mean(aucs)) if aucs else math.nan
    snap.task_auc = {task: float(np.mean(v)) for task, v in tasks.items()}
    snap.checkpoint_age = max(ages) if ages else math.nan
    snap.staleness = sorted(hists["staleness"].items())
    snap.freshness = sorted(hists["freshness"].items())
    return snap


def window_quantile(now: list[tuple[float, float]], then: list[tuple[float, float]],
                    q: float) -> float:
    """Quantile of what a cumulative histogram gained between two scrapes."""
    before = dict(then)
    return quantile([(le, c - before.get(le, 0.0)) for le, c in now], q)


@dataclass
class Timeline:
    """Every snapshot of a run, and the records produced by then."""

    snaps: list[Snapshot] = field(default_factory=list)
    produced: list[tuple[float, int]] = field(default_factory=list)
