"""Writes dashboards/hetgmp.json: the Grafana dashboard, kept as code so panels stay reviewable.

Run: python deploy/grafana/make_dashboard.py   (rewrites the JSON next to this file)
"""

from __future__ import annotations

import json
from pathlib import Path

RATE = "[1m]"
SAMPLES = f"sum(rate(hetgmp_samples_trained_total{RATE}))"

# (title, unit, [(expression, legend)]) in display order, two panels a row.
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Throughput", "ops", [
        (SAMPLES, "samples/s trained"),
        (f"sum(rate(hetgmp_records_consumed_total{RATE}))", "records/s consumed"),
        (f"sum(rate(hetgmp_records_produced_total{RATE}))", "records/s produced"),
    ]),
    ("Remote rows per sample (repartitions marked)", "short", [
        (f"sum(rate(hetgmp_remote_rows_total{RATE})) / {SAMPLES}", "remote rows / sample"),
    ]),
    ("Bytes exchanged per sample", "bytes", [
        (f'sum(rate(hetgmp_exchanged_bytes_total{{direction="sent",kind!~"dense|eval"}}{RATE})) / {SAMPLES}',
         "embedding traffic / sample"),
        (f'sum(rate(hetgmp_exchanged_bytes_total{{direction="sent",kind="dense"}}{RATE})) / {SAMPLES}',
         "dense all-reduce / sample"),
    ]),
    ("Step time", "s", [
        (f"histogram_quantile(0.5, sum by (le) (rate(hetgmp_step_duration_seconds_bucket{RATE})))", "p50"),
        (f"histogram_quantile(0.99, sum by (le) (rate(hetgmp_step_duration_seconds_bucket{RATE})))", "p99"),
    ]),
    ("Replica staleness at reads (updates behind)", "short", [
        (f"histogram_quantile(0.5, sum by (le) (rate(hetgmp_replica_staleness_updates_bucket{RATE})))", "p50"),
        (f"histogram_quantile(0.99, sum by (le) (rate(hetgmp_replica_staleness_updates_bucket{RATE})))", "p99"),
        ("max(hetgmp_staleness_bound_updates)", "bound s"),
    ]),
    ("Replica refreshes and pushes", "ops", [
        (f"sum(rate(hetgmp_replica_refreshes_total{RATE}))", "refreshes/s"),
        (f"sum(rate(hetgmp_replica_pushes_total{RATE}))", "pushes/s"),
    ]),
    ("Migration", "short", [
        (f"sum(rate(hetgmp_migrated_rows_total{RATE}))", "rows/s migrated"),
        (f"histogram_quantile(0.99, sum by (le) (rate(hetgmp_migration_duration_seconds_bucket{RATE})))",
         "migration p99 (s)"),
        ("max(hetgmp_placement_version)", "placement version"),
    ]),
    ("Imbalance (max / mean over ranks)", "short", [
        ('max(hetgmp_imbalance_ratio{what="samples"})', "samples per step"),
        ('max(hetgmp_imbalance_ratio{what="rows"})', "rows owned"),
    ]),
    ("Rows held per rank", "short", [
        ("hetgmp_rows_owned", "owned, rank {{rank}}"),
        ("hetgmp_rows_replicated", "replicas, rank {{rank}}"),
    ]),
    ("Loss and held-out AUC", "short", [
        ("avg(hetgmp_train_loss)", "training log-loss"),
        ("max(hetgmp_heldout_auc)", "rolling held-out AUC"),
    ]),
    ("Freshness: Kafka append -> gradient applied", "s", [
        (f"histogram_quantile(0.5, sum by (le) (rate(hetgmp_freshness_seconds_bucket{RATE})))", "p50"),
        (f"histogram_quantile(0.99, sum by (le) (rate(hetgmp_freshness_seconds_bucket{RATE})))", "p99"),
    ]),
    ("Consumer: decode errors, dead letters, checkpoint age", "short", [
        (f"sum by (reason) (rate(hetgmp_decode_errors_total{RATE}))", "decode errors/s {{reason}}"),
        (f"sum(rate(hetgmp_dead_lettered_records_total{RATE}))", "dead letters/s"),
        ("max(hetgmp_checkpoint_age_seconds)", "checkpoint age (s)"),
    ]),
]


def panel(i: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "prometheus"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend}
            for k, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard() -> dict:
    return {
        "uid": "hetgmp-stream",
        "title": "hetgmp-stream",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "annotations": {
            "list": [
                {
                    "name": "repartitions",
                    "datasource": {"type": "prometheus", "uid": "prometheus"},
                    "enable": True,
                    "iconColor": "orange",
                    "expr": "changes(max(hetgmp_placement_version)[30s:5s]) > 0",
                    "titleFormat": "new placement",
                    "step": "5s",
                }
            ]
        },
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("dashboards") / "hetgmp.json"
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
