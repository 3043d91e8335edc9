"""The bipartite sample-id graph of a window, handed to METIS (pymetis).

pymetis is imported when a graph is first partitioned, not with the package: a process that
only trains or serves on a hash placement (a GPU box without the wheel, ``hetgmp serve``) needs
the rest of the partitioner (placements, routing) but not METIS.
"""

from __future__ import annotations

import numpy as np

from partitioner.graph import CompactWindow

__all__ = ["bipartite_parts"]


def bipartite_parts(cw: CompactWindow, keep: np.ndarray, nparts: int, *,
                    id_edge_weight: np.ndarray, ufactor: int, seed: int,
                    sample_mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Partition samples and the kept ids together with METIS k-way.

    Vertices are the samples (weight 1, or their window weight scaled) and the kept ids
    (weight 0: rows are balanced afterwards, cheaply, by moving cold rows). Each (sample, id)
    access is an edge whose weight is ``id_edge_weight[id]``.

    Args:
        cw: The compacted window.
        keep: bool ``[G]``, the ids that enter the graph.
        nparts: Number of parts.
        id_edge_weight: Positive integer weight per compact id for its edges.
        ufactor: METIS imbalance tolerance in thousandths (50 = 1.05).
        seed: METIS random seed.
        sample_mask: Optional bool ``[num_samples]``: only these samples enter the graph.

    Returns:
        (part of each sample, -1 for those left out; part of each compact id, -1 for ids left
        out).
    """
    sample_part = np.full(cw.num_samples, -1, dtype=np.int64)
    id_part = np.full(cw.num_ids, -1, dtype=np.int64)
    samples = np.flatnonzero(sample_mask) if sample_mask is not None else np.arange(cw.num_samples)
    kept_ids = np.flatnonzero(keep)
    if samples.size == 0:
        return sample_part, id_part
    # Built in a function of its own, so that only METIS's four arrays are alive while it runs
    # (the temporaries were 92 MB beside 39 MB of graph for a 1.2M-edge sample of 500k x 26).
    xadj, adjncy, vweights, eweights = _csr_graph(cw, keep, samples, kept_ids, id_edge_weight,
                                                  sample_mask)
    try:
        import pymetis
    except ImportError as exc:
        raise ImportError("graph placement partitions with METIS: install pymetis (it is a "
                          "dependency of this package; hash placement runs without it)") from exc
    options = pymetis.Options(ufactor=int(ufactor), seed=int(seed))
    result = pymetis.part_graph(
        int(nparts),
        adjacency=pymetis.CSRAdjacency(xadj, adjncy),
        vweights=vweights,
        eweights=eweights,
        options=options,
        recursive=False,
    )
    del xadj, adjncy, vweights, eweights
    parts = np.asarray(result.vertex_part, dtype=np.int64)
    sample_part[samples] = parts[: samples.size]
    id_part[kept_ids] = parts[samples.size:]
    return sample_part, id_part


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
    vweights[: samples.size] = np.maximum(1, np.round(sw / max(float(sw.mean()), 1e-12) * 16))
    return xadj, adjncy, vweights, eweights
