"""Id matrices the project's own generator does not make, for the placement sweep and its tests.

``recipe``: issue 45's recipe, written as a user would write it with numpy: records drawn from
``default_rng(seed)``, each record's community first (64 communities of Zipf(1.0) popularity,
by inverse CDF of one uniform draw a record), then per field a value from the community's hot
set of 50 with probability 0.7, else from the field's global Zipf(1.1); vocabularies
log-spaced 10..10^6; ids numbered densely field by field (field 0's values first, each value's
number its popularity rank). No drift. Record order: as generated, or shuffled. This is the
matrix whose capped partition collapsed at the default seed (issue 55): its communities come
from the very first draw of ``default_rng(0)``, which the partitioner's METIS sample was too.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ORDERS", "recipe"]

ORDERS = ("generated", "shuffled")


def _zipf(rng: np.random.Generator, n: int, size: int, a: float) -> np.ndarray:
    """``size`` draws of ranks 0..n-1 with probability proportional to ``1 / (rank + 1)^a``."""
    cdf = np.cumsum(1.0 / np.arange(1, n + 1, dtype=np.float64) ** a)
    return np.searchsorted(cdf / cdf[-1], rng.random(size)).astype(np.int64)


def recipe(samples: int, seed: int = 0, *, fields: int = 26, communities: int = 64,
           hot: int = 50, p_hot: float = 0.7, order: str = "generated"
           ) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` records of the recipe (see the module docstring).

    Returns:
        (int64 ids ``[samples, fields]``, each record's community).
    """
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    rng = np.random.default_rng(seed)
    community = _zipf(rng, communities, samples, 1.0)
    vocab = np.round(np.logspace(1, 6, fields)).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(vocab)[:-1]])
    ids = np.empty((samples, fields), np.int64)
    for f, v in enumerate(vocab):
        sets = np.stack([rng.choice(v, size=hot, replace=False) if v >= hot
                         else rng.integers(0, v, hot) for _ in range(communities)])
        from_hot = rng.random(samples) < p_hot
        popular = _zipf(rng, int(v), samples, 1.1)
        picked = sets[community, rng.integers(0, hot, samples)]
        ids[:, f] = offsets[f] + np.where(from_hot, picked, popular)
    if order == "shuffled":
        perm = rng.permutation(samples)
        ids, community = ids[perm], community[perm]
    return ids, community
