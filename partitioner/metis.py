"""The bipartite sample-id graph of a window, handed to METIS (pymetis).

pymetis is imported when a graph is first partitioned, not with the package: a process that
only trains or serves on a hash placement (a GPU box without the wheel, ``hetgmp serve``) needs
the rest of the partitioner (placements, routing) but not METIS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetgmp.partitioner.graph import CompactWindow
from hetgmp.partitioner.heap import release_freed_heap

__all__ = ["BipartiteGraph", "bipartite_graph", "bipartite_parts", "metis_parts"]


@dataclass(frozen=True, eq=False)
class BipartiteGraph:
    """METIS's input for a window's sample-id graph, and where its vertices came from.

    Attributes:
        xadj, adjncy, vweights, eweights: The CSR graph METIS takes: the sample vertices
            first, then the id vertices.
        samples: Window index of each sample vertex.
        kept_ids: Compact id of each id vertex.
        num_samples: Samples in the window (the length of the answer's sample parts).
        num_ids: Distinct ids in the window (the length of its id parts).
    """

    xadj: np.ndarray
    adjncy: np.ndarray
    vweights: np.ndarray
    eweights: np.ndarray
    samples: np.ndarray
    kept_ids: np.ndarray
    num_samples: int
    num_ids: int


def bipartite_graph(cw: CompactWindow, keep: np.ndarray, *, id_edge_weight: np.ndarray,
                    sample_mask: np.ndarray | None = None) -> BipartiteGraph:
    """The samples and the kept ids of ``cw`` as one graph, for ``metis_parts``.

    Vertices are the samples (weight 1, or their window weight scaled) and the kept ids
    (weight 0: rows are balanced afterwards, cheaply, by moving cold rows). Each (sample, id)
    access is an edge whose weight is ``id_edge_weight[id]``.

    The graph needs nothing of ``cw`` once built, so a caller that holds the window's entry
    arrays only for METIS can drop them before METIS runs.

    Args:
        cw: The compacted window.
        keep: bool ``[G]``, the ids that enter the graph.
        id_edge_weight: Positive integer weight per compact id for its edges.
        sample_mask: Optional bool ``[num_samples]``: only these samples enter the graph.
    """
    samples = np.flatnonzero(sample_mask) if sample_mask is not None else np.arange(cw.num_samples)
    kept_ids = np.flatnonzero(keep)
    if samples.size == 0:  # nothing to partition: metis_parts answers -1 everywhere
        empty = np.zeros(0, dtype=np.int64)
        return BipartiteGraph(np.zeros(1, np.int64), empty, empty, empty, samples, kept_ids,
                              cw.num_samples, cw.num_ids)
    # Built in a function of its own, so that only METIS's four arrays outlive it (the
    # temporaries were 92 MB beside 39 MB of graph for a 1.2M-edge sample of 500k x 26).
    xadj, adjncy, vweights, eweights = _csr_graph(cw, keep, samples, kept_ids, id_edge_weight,
                                                  sample_mask)
    return BipartiteGraph(xadj, adjncy, vweights, eweights, samples, kept_ids,
                          cw.num_samples, cw.num_ids)


def metis_parts(graph: BipartiteGraph, nparts: int, *, ufactor: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Partition ``graph`` with METIS k-way.

    Args:
        graph: From ``bipartite_graph``.
        nparts: Number of parts.
        ufactor: METIS imbalance tolerance in thousandths (50 = 1.05).
        seed: METIS random seed.

    Returns:
        (part of each window sample, -1 for those left out; part of each compact id, -1 for
        ids left out).
    """
    sample_part = np.full(graph.num_samples, -1, dtype=np.int64)
    id_part = np.full(graph.num_ids, -1, dtype=np.int64)
    if graph.samples.size == 0:
        return sample_part, id_part
    try:
        import pymetis
    except ImportError as exc:
        raise ImportError("graph placement partitions with METIS: install pymetis (it is a "
                          "dependency of this package; hash placement runs without it)") from exc
    release_freed_heap()
    options = pymetis.Options(ufactor=int(ufactor), seed=int(seed))
    result = pymetis.part_graph(
        int(nparts),
        adjacency=pymetis.CSRAdjacency(graph.xadj, graph.adjncy),
        vweights=graph.vweights,
        eweights=graph.eweights,
        options=options,
        recursive=False,
    )
    release_freed_heap()
    parts = np.asarray(result.vertex_part, dtype=np.int64)
    sample_part[graph.samples] = parts[: graph.samples.size]
    id_part[graph.kept_ids] = parts[graph.samples.size:]
    return sample_part, id_part


def bipartite_parts(cw: CompactWindow, keep: np.ndarray, nparts: int, *,
                    id_edge_weight: np.ndarray, ufactor: int, seed: int,
                    sample_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``metis_parts`` of ``bipartite_graph``: samples and the kept ids partitioned together."""
    graph = bipartite_graph(cw, keep, id_edge_weight=id_edge_weight, sample_mask=sample_mask)
    return metis_parts(graph, nparts, ufactor=ufactor, seed=seed)


def _csr_graph(cw: CompactWindow, keep: np.ndarray, samples: np.ndarray, kept_ids: np.ndarray,
               id_edge_weight: np.ndarray, sample_mask: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """METIS's ``(xadj, adjncy, vweights, eweights)``: samples first, then the kept ids."""
    entry_keep = keep[cw.entry_id]
    if sample_mask is not None:
        entry_keep &= sample_mask[cw.entry_sample]
    sample_index = np.full(cw.num_samples, -1, dtype=np.int64)
    sample_index[samples] = np.arange(samples.size)
    id_index = np.full(cw.num_ids, -1, dtype=np.int64)
    id_index[kept_ids] = samples.size + np.arange(kept_ids.size)

    e_sample = sample_index[cw.entry_sample[entry_keep]]
    e_id = id_index[cw.entry_id[entry_keep]]
    del entry_keep, sample_index, id_index
    # Id side: entries grouped by id (stable, so samples ascend within an id); repeated
    # (sample, id) pairs become adjacent there and are dropped, as METIS wants a simple graph.
    order = np.argsort(e_id, kind="stable")
    by_id_sample = e_sample[order]
    by_id_id = e_id[order]
    del order
    dup = np.zeros(by_id_id.size, dtype=bool)
    dup[1:] = (by_id_id[1:] == by_id_id[:-1]) & (by_id_sample[1:] == by_id_sample[:-1])
    if dup.any():
        by_id_sample, by_id_id = by_id_sample[~dup], by_id_id[~dup]
        # Sample side must drop the same pairs: rebuild it from the deduplicated list.
        back = np.argsort(by_id_sample, kind="stable")
        e_sample, e_id = by_id_sample[back], by_id_id[back]
    del dup

    n_vertices = samples.size + kept_ids.size
    # Rows of the CSR: sample rows first (entries are in sample order), then id rows.
    degree = np.bincount(e_sample, minlength=n_vertices) + np.bincount(by_id_id,
                                                                       minlength=n_vertices)
    xadj = np.zeros(n_vertices + 1, dtype=np.int64)
    np.cumsum(degree, out=xadj[1:])
    adjncy = np.concatenate([e_id, by_id_sample])
    weight_of_kept = id_edge_weight[kept_ids]
    eweights = np.concatenate([weight_of_kept[e_id - samples.size],
                               weight_of_kept[by_id_id - samples.size]]).astype(np.int64)
    vweights = np.zeros(n_vertices, dtype=np.int64)
    sw = cw.sample_weight[samples]
    # A sample weighs its rows: what a step computes and fetches follows them, so a sample of
    # a 100-value history weighs as 100 one-value fields. Samples of equal lengths (one value a
    # field) keep the weights they had, bit for bit.
    rows = np.diff(cw.indptr)[samples]
    if rows.size and rows.min() != rows.max():
        sw = sw * rows
    vweights[: samples.size] = np.maximum(1, np.round(sw / max(float(sw.mean()), 1e-12) * 16))
    return xadj, adjncy, vweights, eweights
