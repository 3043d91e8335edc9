"""The uniform samples of a window's samples that METIS is given when the whole window is too
large for it (``full`` and the incremental passes' group balance).

Two things make a sample trustworthy here:

* **Its own random stream.** A sample drawn as ``default_rng(seed).random(n) < fraction`` is the
  first draw of the most common seeded generator there is. A log generated the same way (a
  community drawn per record by inverse CDF from ``default_rng(0).random(n)``, the recipe of
  issue 45's matrices) then hands METIS the records of one community only when both seeds are
  0: the capped full partition lost 30-40 points against hash at the default seed and none at
  seeds 1-3 (issue 55), and so did the group balance's passes at 8 workers. The stream is
  now the seed's, spawned with a salt of this module: no generator of data shares it by
  accident.
* **A check that it looks like the window.** Each id seen often in the window must be seen in
  the sample about ``fraction`` times as often: its count in a uniform sample is binomial, so
  the squared deviations over their variance average about 1. A sample that misses whole
  communities averages far more (hundreds on the issue's matrix), and is drawn again with the
  next salt (:func:`uniform_sample`, up to ``_DRAWS`` times; the last draw is used, with a
  warning, if none passes).
"""

from __future__ import annotations

import logging

import numpy as np

__all__ = ["representative", "uniform_sample"]

log = logging.getLogger(__name__)

# Spawn key of this module's stream (any constant; not 0, which plain seeding uses).
_SALT = 0x5A4D_504C_45
_DRAWS = 4
# Ids expected this many times in the sample are the ones checked (the binomial's normal
# approximation holds there), and the mean standardised square deviation a sample may have.
_MIN_EXPECTED = 20.0
_MAX_DISPERSION = 4.0


def representative(window_degree: np.ndarray, sample_degree: np.ndarray,
                   fraction: float) -> float:
    """How far the sample's id counts are from a uniform sample's: the mean over ids expected
    at least 20 times of ``(s - f d)^2 / (f (1 - f) d)``, about 1 for a uniform sample (0 when
    no id is that frequent: nothing to check).

    Args:
        window_degree: Samples of the window each id is in.
        sample_degree: Samples of the sample each id is in.
        fraction: The share of the window's samples drawn.
    """
    d = np.asarray(window_degree, np.float64)
    s = np.asarray(sample_degree, np.float64)
    f = min(max(float(fraction), 1e-12), 1.0 - 1e-12)
    checked = f * d >= _MIN_EXPECTED
    if not checked.any():
        return 0.0
    d, s = d[checked], s[checked]
    return float(np.mean((s - f * d) ** 2 / (f * (1.0 - f) * d)))


def uniform_sample(num_samples: int, fraction: float, seed: int, entry_sample: np.ndarray,
                   entry_id: np.ndarray, window_degree: np.ndarray) -> np.ndarray:
    """A uniform ``fraction`` of ``num_samples`` samples (bool mask), drawn from the seed's own
    stream and checked against the window (see the module docstring).

    Args:
        num_samples: Samples in the window.
        fraction: Share to draw, in (0, 1].
        seed: The partitioner's seed.
        entry_sample: Sample of each (sample, id) entry of the window.
        entry_id: Compact id of each entry.
        window_degree: Samples of the window each compact id is in.
    """
    chosen = np.ones(num_samples, dtype=bool)
    if fraction >= 1.0:
        return chosen
    dispersion = 0.0
    for draw in range(_DRAWS):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_SALT, draw)))
        chosen = rng.random(num_samples) < fraction
        degree = np.bincount(entry_id[chosen[entry_sample]], minlength=window_degree.size)
        dispersion = representative(window_degree, degree, fraction)
        if dispersion <= _MAX_DISPERSION:
            if draw:
                log.info("METIS sample redrawn %d time(s): the first looked unlike the window",
                         draw)
            return chosen
    log.warning("every METIS sample of %.1f%% of %d samples looked unlike the window (id "
                "counts %.1f times as dispersed as a uniform sample's): using the last",
                100 * fraction, num_samples, dispersion)
    return chosen
