"""Full partition of an access window with METIS: the quality ceiling, recomputed from scratch.

Graph choice, measured on the synthetic stream (defaults, seed 0): a 200k-sample window, the
next 50k records scored in steps of 8192 (hash placement: 6.72 remote rows per sample at 4
workers, 9.93 at 8).

* **The bipartite sample-id graph**, samples as vertices of weight 1 and ids of weight 0, is
  what METIS gets. It has one edge per access (26 per sample, 5.2M for the window) and lets
  METIS balance samples, i.e. each step's compute, directly. The projection onto ids (an edge
  per co-occurring pair) was not built: ~325 pairs per sample, up to 65M edges for the window,
  beyond what a 2-core box partitions in seconds, and its vertex balance would be rows, not
  samples.
* **Edge weight = soft count / degree** of the id: an id in ``d`` window samples costs at most
  one fetch per batch, ``soft(d)`` fetches in all, not ``d``; spreading that over its edges makes
  the cut follow the remote-row measure. Unit weights: 3.58 remote rows per sample (4 workers)
  and 5.55 (8 workers); soft weights: 2.97 and 4.68.
* **Ids seen once stay out** (they constrain nothing and mostly never return; placing only ids
  seen twice or more also keeps the explicit table at ~65k of 175k window ids), and so do
  **hubs**, ids in more than ``hub_per_step`` (20) samples per step: they are in every batch of
  every worker that uses them, so no cut saves them. A threshold of 80 instead of 20 gave 3.77
  and 4.97, and METIS took 9.7 s instead of 7.8 s (4 workers). Hubs go to their heaviest user
  and are the first candidates for replicas.
* Part labels are matched to the current owners (``match_labels``) so that a new partition does
  not move rows merely because METIS numbered its parts differently. It does not help much:
  consecutive windows share three quarters of their samples, yet METIS groups the 64 segments
  into workers differently each time, and a full repartition moves ~60k rows per period.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from hetgmp.partitioner.assemble import build_placement, match_labels
from hetgmp.partitioner.graph import CompactWindow, compact, per_worker_counts
from hetgmp.partitioner.greedy import alternate, edge_cost
from hetgmp.partitioner.heap import release_freed_heap
from hetgmp.partitioner.hetgmp import paper_partition
from hetgmp.partitioner.measures import judged_batches, routed_remote_rows
from hetgmp.partitioner.metis import BipartiteGraph, bipartite_graph, bipartite_parts, metis_parts
from hetgmp.partitioner.sampling import uniform_sample
from hetgmp.partitioner.types import PartitionConfig, Placement, WindowGraph

__all__ = ["FullPartitioner", "metis_owners"]

log = logging.getLogger(__name__)

# Integer scale of the METIS edge weights (they must be positive integers).
_EDGE_SCALE = 16


def metis_owners(window: WindowGraph, config: PartitionConfig, nparts: int | None = None
                 ) -> tuple[CompactWindow, np.ndarray, np.ndarray, np.ndarray]:
    """Partition the window's bipartite graph and derive an owner for every placeable id.

    A graph of more than ``config.metis_edges`` edges is cut first: METIS partitions a uniform
    sample of the samples (seeded) with the ids that sample uses twice or more, and one
    alternating pass over the whole window (``partitioner.greedy``) then routes every sample
    and decides every placeable id, those METIS saw included. While METIS runs on the sample,
    the window's compact entry arrays (8 bytes an access: 104 MB for 500k x 26) are dropped
    and numbered again afterwards against the ids already known (0.2 s there): METIS's own
    memory (about 110 bytes an edge, 260 MB for a 1.2M-edge sample) then stands beside its
    graph, not beside the window too. A fresh process partitioning 500k x 26 peaks at 455-462
    MB (it was 615 MB with the entry arrays kept).

    Args:
        window: The window to partition.
        config: Partitioner settings.
        nparts: Number of parts (default: ``config.num_workers``).

    Returns:
        (the compacted window, part of each sample, part of each compact id with -1 for ids
        below ``min_count``, bool mask of the placeable ids: eligible and not hubs).
    """
    parts = nparts or config.num_workers
    cw = compact(window)
    steps = max(cw.num_samples / config.global_batch, 1.0)
    eligible = cw.degree >= config.min_count
    in_graph = eligible & (cw.degree <= config.hub_per_step * steps)
    edges = int(np.count_nonzero(in_graph[cw.entry_id]))
    cap = config.metis_edges
    ufactor = int(round(1000 * config.epsilon))
    if cap and edges > cap and cw.num_samples > 2 * parts:
        graph = _sampled_graph(cw, in_graph, cap / edges, config)
        ids = cw.ids
        del cw
        _, id_part = metis_parts(graph, parts, ufactor=ufactor, seed=config.seed)
        del graph
        cw = compact(window, ids)
        cfg = config if parts == config.num_workers else replace(config, num_workers=parts)
        owner, worker, counts = alternate(cw, np.maximum(id_part, 0), in_graph, cfg,
                                          known=id_part >= 0)
        id_part = np.where(in_graph, owner, -1).astype(np.int64)
        sample_part = worker
        release_freed_heap()
    else:
        counts = None
        weight = np.maximum(1, np.round(_EDGE_SCALE * edge_cost(
            cw.degree, cw.num_samples, config.global_batch)))
        sample_part, id_part = bipartite_parts(
            cw, in_graph, parts, id_edge_weight=weight.astype(np.int64), ufactor=ufactor,
            seed=config.seed)
    # Eligible ids outside the graph (hubs) go to the part whose samples use them most.
    rest = eligible & ~in_graph
    if rest.any():
        if counts is None:
            counts = per_worker_counts(cw, sample_part.astype(np.int64), parts)
        id_part[rest] = np.argmax(counts[rest], axis=1)
    return cw, sample_part, id_part, in_graph


def _sampled_graph(cw: CompactWindow, in_graph: np.ndarray, fraction: float,
                   config: PartitionConfig) -> BipartiteGraph:
    """The graph of a uniform ``fraction`` of the samples (``partitioner.sampling``) and the
    graph ids they use twice or more.

    Degrees, hubs and edge weights are the sample's own (its steps are fewer).
    """
    chosen = uniform_sample(cw.num_samples, fraction, config.seed, cw.entry_sample, cw.entry_id,
                            cw.degree)
    picked = int(chosen.sum())
    entry_in = chosen[cw.entry_sample]
    degree = np.bincount(cw.entry_id[entry_in], minlength=cw.num_ids).astype(np.float64)
    del entry_in
    steps = max(picked / config.global_batch, 1.0)
    keep = in_graph & (degree >= 2) & (degree <= config.hub_per_step * steps)
    weight = np.maximum(1, np.round(_EDGE_SCALE * edge_cost(degree, picked,
                                                            config.global_batch)))
    return bipartite_graph(cw, keep, id_edge_weight=weight.astype(np.int64), sample_mask=chosen)


# Samples the comparison of the two full partitions routes (whole batches spread over the
# window): as many as the incremental pass's guard.
_JUDGED_SAMPLES = 65_536


class FullPartitioner:
    """Repartition the whole window with METIS on every call (see the module docstring).

    Attributes:
        last_choice: From ``compare_from`` workers: which of METIS's and HET-GMP's placements
            the last call kept, and the rows each fetched on the judged samples (None below).
    """

    def __init__(self, config: PartitionConfig) -> None:
        self.config = config
        self.last_choice: dict[str, object] | None = None

    def partition(self, window: WindowGraph, current: Placement | None) -> Placement:
        """Partition ``window`` from scratch; ``current`` only fixes labels and cold rows.

        From ``config.compare_from`` workers up, HET-GMP's own algorithm partitions the window
        too, and the placement that fetches fewer rows on it (whole batches spread over it,
        routed as the trainer routes) is kept; ``last_choice`` says which and by how much."""
        n = self.config.num_workers
        if current is not None and current.num_workers != n:
            raise ValueError("current placement has a different worker count")
        # Version 0 is the hash placement every job starts from; the first computed one is 1.
        version = 1 if current is None else current.version + 1
        self.last_choice = None
        if window.num_samples == 0:
            base = current or Placement.hash(n)
            return base.with_version(version)
        ours = self._metis(window, current, version)
        c = self.config
        if not c.compare_from or n < c.compare_from or window.weights is not None:
            return ours
        release_freed_heap()
        theirs = paper_partition(window, c, version=version).placement
        judged = judged_batches(window, c.global_batch, _JUDGED_SAMPLES)
        rows = [routed_remote_rows((judged.indptr, judged.indices), p, c.global_batch,
                                   c.route_rounds, c.epsilon) for p in (ours, theirs)]
        kept = int(rows[1] < rows[0])
        self.last_choice = {"kept": ("metis", "hetgmp")[kept], "rows_metis": rows[0],
                            "rows_hetgmp": rows[1], "samples_judged": judged.num_samples}
        log.info("full partition at %d workers: METIS %d rows, HET-GMP's algorithm %d rows on "
                 "%d samples: kept %s", n, rows[0], rows[1], judged.num_samples,
                 self.last_choice["kept"])
        return (ours, theirs)[kept]

    def _metis(self, window: WindowGraph, current: Placement | None, version: int
               ) -> Placement:
        n = self.config.num_workers
        cw, _, id_part, _ = metis_owners(window, self.config)
        base = current or Placement.hash(n)
        owner = base.owner_of(cw.ids)
        placed = id_part >= 0
        if placed.any():
            perm = match_labels(id_part[placed], owner[placed].astype(np.int64), n)
            owner[placed] = perm[id_part[placed]].astype(np.int32)
        return build_placement(cw, owner, current, self.config, version)
