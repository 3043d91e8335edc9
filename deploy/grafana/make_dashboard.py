"""Writes dashboards/hetgmp.json: the Grafana dashboard, kept as code so panels stay reviewable.

Run: python deploy/grafana/make_dashboard.py   (rewrites the JSON next to this file)

Tests load this file by path and call :func:`dashboard_expressions` to run every expression the
dashboard shows against a real Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

RATE = "[1m]"
SAMPLES = f"sum(rate(hetgmp_samples_trained_total{RATE}))"
PRODUCED = f"sum(rate(hetgmp_records_produced_total{RATE}))"
CONSUMED = f"sum(rate(hetgmp_records_consumed_total{RATE}))"
# Values of the `kind` label of hetgmp_exchanged_bytes_total (trainer/dist/counters.py KINDS).
EMBEDDING_KINDS = "route|header|request|response|gradient|flush"
ONLINE_KINDS = "control|window|placement|migrate"


def quantile(q: float, histogram: str) -> str:
    """The ``q`` quantile over all ranks of a histogram's last minute."""
    return f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{RATE})))"


class Panel(NamedTuple):
    title: str
    unit: str
    targets: list[tuple[str, str]]  # (expression, legend)
    description: str = ""


# Metric names: trainer/run/metrics.py (trainer ranks, every series labelled `rank`) and
# streaming/metrics.py (consumer and producer counters; their samples end in `_total`).
# In display order, two panels a row.
PANELS: list[Panel] = [
    Panel("Throughput", "ops", [
        (SAMPLES, "samples/s trained"),
        (CONSUMED, "records/s consumed"),
        (PRODUCED, "records/s produced"),
        (f"sum(rate(hetgmp_steps_total{RATE})) / count(hetgmp_steps_total)", "steps/s per rank"),
    ]),
    Panel("Remote rows per sample (repartitions marked)", "short", [
        (f"(sum(rate(hetgmp_remote_rows_total{RATE})) + sum(rate(hetgmp_replica_refreshes_total{RATE})))"
         f" / {SAMPLES}", "remote rows / sample"),
        ("hetgmp_remote_rows_per_sample", "last step, rank {{rank}}"),
    ], "Rows neither owned nor held fresh (fetches from owners plus replica refreshes) per sample "
       "trained: HET-GMP's measure. Orange marks: a new placement took effect."),
    Panel("Bytes exchanged per sample", "bytes", [
        (f'sum(rate(hetgmp_exchanged_bytes_total{{direction="sent",kind=~"{EMBEDDING_KINDS}"}}{RATE}))'
         f" / {SAMPLES}", "embedding traffic / sample"),
        (f'sum(rate(hetgmp_exchanged_bytes_total{{direction="sent",kind="dense"}}{RATE})) / {SAMPLES}',
         "dense all-reduce / sample"),
        (f'sum(rate(hetgmp_exchanged_bytes_total{{direction="sent",kind=~"{ONLINE_KINDS}"}}{RATE}))'
         f" / {SAMPLES}", "online loop (window, placement, migration) / sample"),
    ], "Bytes sent between ranks. Embedding traffic is the training path (route, header, request, "
       "response, gradient, flush): what a placement changes, as the reports count it."),
    Panel("Step time", "s", [
        (quantile(0.5, "hetgmp_step_duration_seconds"), "p50"),
        (quantile(0.99, "hetgmp_step_duration_seconds"), "p99"),
        (f"sum(rate(hetgmp_migration_steps_total{RATE})) / sum(rate(hetgmp_steps_total{RATE}))",
         "share of steps during a migration"),
        ('sum(rate(hetgmp_collective_seconds_total{kind=~"route|header|request|response|'
         f'gradient|dense"}}{RATE})) / sum(rate(hetgmp_step_duration_seconds_sum{RATE}))',
         "share of step time in collectives (waiting for peers included)"),
    ]),
    Panel("Replica staleness at reads (updates behind)", "short", [
        (quantile(0.5, "hetgmp_replica_staleness_updates"), "p50"),
        (quantile(0.99, "hetgmp_replica_staleness_updates"), "p99"),
        ("max(hetgmp_staleness_bound_updates)", "bound s"),
    ]),
    Panel("Replica reads, refreshes and pushes", "ops", [
        (f"sum(rate(hetgmp_replica_reads_total{RATE}))", "reads/s"),
        (f"sum(rate(hetgmp_replica_refreshes_total{RATE}))", "refreshes/s"),
        (f"sum(rate(hetgmp_replica_pushes_total{RATE}))", "pushes/s"),
    ]),
    Panel("Migration", "short", [
        (f"sum(rate(hetgmp_migrated_rows_total{RATE}))", "rows/s migrated"),
        (f"sum(rate(hetgmp_migrated_bytes_total{RATE}))", "bytes/s migrated"),
        (quantile(0.99, "hetgmp_migration_duration_seconds"), "migration p99 (s)"),
        # max over ranks: the count is the same whether one rank or every rank reports it.
        (f"max by (kind) (increase(hetgmp_repartitions_total{RATE}))", "{{kind}} repartitions / min"),
        (f"max by (step) (increase(hetgmp_partitioner_moves_total{RATE}))",
         "rows moved by {{step}} / min"),
        ("max(hetgmp_placement_version)", "placement version"),
        ("max(hetgmp_placement_graph)", "graph placement in force (--placement auto: 1)"),
        ("max(hetgmp_batch_routing_rounds)",
         "batch-aware routing rounds in force (--route-rounds -1: measured)"),
    ]),
    Panel("Placement auto: graph against hash", "bytes", [
        ("max(hetgmp_placement_graph_bytes_per_sample)", "graph (loop traffic included)"),
        ("max(hetgmp_placement_hash_bytes_per_sample)", "hash, for the same batches"),
    ], "--placement auto: what the ranks sent per sample on the embedding path plus the loop's "
       "window, placement and migration traffic, under graph, beside what hash would have sent "
       "for the same batches, as of the last decision (the Migration panel shows which is in "
       "force)."),
    Panel("Imbalance (max / mean over ranks)", "short", [
        ('max(hetgmp_imbalance_ratio{what="samples"})', "samples per step"),
        ('max(hetgmp_imbalance_ratio{what="rows"})', "rows owned"),
    ]),
    Panel("Rows held per rank", "short", [
        ("hetgmp_rows_owned", "owned, rank {{rank}}"),
        ("hetgmp_rows_replicated", "replicas, rank {{rank}}"),
    ]),
    Panel("Loss and held-out AUC", "short", [
        (f"sum(rate(hetgmp_train_logloss_total{RATE})) / {SAMPLES}", "training log-loss"),
        ("max(hetgmp_heldout_auc)", "rolling held-out AUC"),
    ]),
    Panel("Consumer lag", "short", [
        ("sum by (topic, partition) (kafka_consumergroup_lag)",
         "offsets behind, {{topic}}/{{partition}}"),
        ("max(hetgmp_consumer_lag_seconds)", "seconds behind, worst partition"),
    ], "Per partition: the offsets between what the ranks trained and the high watermark of the "
       "last fetch response (kafka_exporter's kafka_consumergroup_lag; right on the embedded "
       "broker too, whose ListOffsets end offsets are not), and how long ago the newest record "
       "read was appended where any are behind."),
    Panel("Freshness: Kafka append -> gradient applied", "s", [
        (quantile(0.5, "hetgmp_freshness_seconds"), "p50"),
        (quantile(0.99, "hetgmp_freshness_seconds"), "p99"),
    ]),
    Panel("Decode errors and dead letters", "ops", [
        (f"sum by (reason) (rate(hetgmp_decode_errors_total{RATE}))", "decode errors/s {{reason}}"),
        (f"sum(rate(hetgmp_dead_lettered_records_total{RATE}))", "dead letters/s"),
    ]),
    Panel("Serving latency (hetgmp serve)", "s", [
        (quantile(0.5, "hetgmp_serve_request_seconds"), "p50"),
        (quantile(0.99, "hetgmp_serve_request_seconds"), "p99"),
    ], "Time to answer a /predict request that was scored: read, decode, score, reply."),
    Panel("Serving requests", "ops", [
        (f"sum by (code) (rate(hetgmp_serve_requests_total{RATE}))", "requests/s, HTTP {{code}}"),
        (f"sum(rate(hetgmp_serve_records_scored_total{RATE}))", "records/s scored"),
        (f"sum(rate(hetgmp_serve_unknown_ids_total{RATE}))", "ids/s scored without a row"),
    ]),
    Panel("Model lag: Kafka append -> served", "s", [
        ("max(hetgmp_serve_model_lag_seconds)", "stalest serve process"),
        ("min(hetgmp_serve_model_lag_seconds)", "freshest serve process"),
    ], "Now minus the newest append time whose every update a serve process holds (the oldest of "
       "the ranks' last publishes it applied). No line before every rank has published."),
    Panel("Delta log applied", "short", [
        (f"sum by (kind) (rate(hetgmp_serve_deltas_applied_total{RATE}))", "{{kind}} messages/s"),
        ("max(hetgmp_serve_rows)", "rows held (largest serve process)"),
        (f"sum(increase(hetgmp_serve_publish_gaps_total{RATE}))"
         f" + sum(increase(hetgmp_serve_publishes_incomplete_total{RATE}))",
         "missing or incomplete publishes / min"),
    ]),
    Panel("Checkpoint age", "s", [
        ("max(hetgmp_checkpoint_age_seconds)", "oldest rank's checkpoint age"),
        (f"max(increase(hetgmp_checkpoints_total{RATE}))", "checkpoints / min"),
    ], "No line before the first checkpoint: the age is not exported until there is one."),
    Panel("Store: rows by tier, spills and reads back", "short", [
        ("sum by (tier) (hetgmp_store_rows)", "rows in {{tier}}"),
        (f"sum(rate(hetgmp_store_spilled_rows_total{RATE}))", "rows spilled to disk / s"),
        (f"sum(rate(hetgmp_store_restored_rows_total{RATE}))", "rows read back / s"),
    ], "--store-disk-dir: rows past --store-max-rows spill whole to RocksDB and come back when "
       "read. Without a disk tier only the memory rows are drawn."),
    Panel("Store: memory tier hit rate", "percentunit", [
        (f"1 - sum(rate(hetgmp_store_restored_rows_total{RATE}))"
         f" / sum(rate(hetgmp_store_looked_up_rows_total{RATE}))", "ids found in memory"),
    ], "The share of ids looked up that did not have to be read back from the disk tier."),
    Panel("Store: disk tier bytes", "bytes", [
        ("sum(hetgmp_store_disk_bytes)", "bytes on disk, all ranks"),
    ], "The disk tier's files (RocksDB), every rank's."),
]

# A new placement: the largest version over ranks went up within the annotation step.
REPARTITION_ANNOTATION = "max(hetgmp_placement_version) > max(hetgmp_placement_version offset 10s)"


def panel(i: int, title: str, unit: str, targets: list[tuple[str, str]], description: str) -> dict:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
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
                    "expr": REPARTITION_ANNOTATION,
                    "titleFormat": "new placement",
                    "step": "10s",
                }
            ]
        },
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets, then annotations."""
    board = dashboard()
    return [t["expr"] for p in board["panels"] for t in p["targets"]] + [
        a["expr"] for a in board["annotations"]["list"]
    ]


if __name__ == "__main__":
    out = Path(__file__).with_name("dashboards") / "hetgmp.json"
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
