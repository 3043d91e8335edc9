"""Placement of embedding rows from the stream's access graph.

Pure algorithms on numpy arrays: full partition (METIS), incremental refinement, replica
selection, sample routing, migration plans and the measures the benchmark reports. No Kafka, no
torch, no I/O.
"""

from hetgmp.partitioner.batch_routing import fetched_rows, refine_counted, refine_routing, route_batch
from hetgmp.partitioner.full import FullPartitioner
from hetgmp.partitioner.idindex import IdIndex
from hetgmp.partitioner.incremental import IncrementalPartitioner
from hetgmp.partitioner.measures import (
    imbalance,
    migrated_bytes,
    migrated_rows,
    remote_ids,
    remote_rows,
    remote_rows_per_sample,
    routed_remote_rows,
    row_imbalance,
    sample_imbalance,
)
from hetgmp.partitioner.plan import plan_diff
from hetgmp.partitioner.routing import Samples, as_csr, capacity, route, route_window
from hetgmp.partitioner.types import (
    REPLICA_BASES,
    MigrationPlan,
    PartitionConfig,
    Partitioner,
    PassReport,
    Placement,
    ReplicaBasis,
    WindowGraph,
    check_replica_basis,
    default_owner,
    find_sorted,
)

__all__ = [
    "REPLICA_BASES",
    "FullPartitioner",
    "IdIndex",
    "IncrementalPartitioner",
    "MigrationPlan",
    "PartitionConfig",
    "Partitioner",
    "PassReport",
    "Placement",
    "ReplicaBasis",
    "Samples",
    "WindowGraph",
    "as_csr",
    "capacity",
    "check_replica_basis",
    "default_owner",
    "fetched_rows",
    "find_sorted",
    "imbalance",
    "migrated_bytes",
    "migrated_rows",
    "plan_diff",
    "refine_counted",
    "refine_routing",
    "remote_ids",
    "remote_rows",
    "remote_rows_per_sample",
    "route",
    "route_batch",
    "route_window",
    "routed_remote_rows",
    "row_imbalance",
    "sample_imbalance",
]
