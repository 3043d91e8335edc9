"""Helpers shared by the trainer tests: comparing the model of N ranks with a reference run."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

from hetgmp.trainer.run import RankResult


def owned_rows(results: list[RankResult]) -> dict[int, torch.Tensor]:
    """Every rank's owned rows by id; an id on two ranks fails the test (invariant 1)."""
    rows: dict[int, torch.Tensor] = {}
    for r in results:
        state = r.observed["state"]
        for i, row in zip(state.ids.tolist(), state.rows):
            assert i not in rows, "a row owned by two ranks"
            rows[i] = row
        for name, value in state.dense.items():  # every rank holds the same dense copy
            assert torch.equal(value, results[0].observed["state"].dense[name])
    return rows


def model_gap(reference: RankResult, results: list[RankResult]) -> tuple[float, float]:
    """Largest difference of dense parameters and of embedding rows; the same rows must exist."""
    ref = reference.observed["state"]
    assert ref is not None
    rows = owned_rows(results)
    assert set(rows) == set(ref.ids.tolist())
    emb = max(float((rows[i] - row).abs().max()) for i, row in zip(ref.ids.tolist(), ref.rows))
    first = results[0].observed["state"]
    assert first is not None
    dense = max(float((first.dense[k] - v).abs().max()) for k, v in ref.dense.items())
    return dense, emb


def true_lags(result: RankResult, applied: np.ndarray) -> np.ndarray:
    """Updates by other ranks that each replica read of ``result``'s rank missed, from the
    owners' logs alone (``applied``: every rank's ``(step, id, source, updates, after reads)``).
    """
    reads = np.concatenate(result.observed["audit"].reads)
    others = applied[applied[:, 2] != result.rank]
    by_id: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for i in np.unique(others[:, 1]):
        rows = others[others[:, 1] == i]
        # In time order: a flush before step k's reads (2k), then step k's write (2k + 1).
        when = 2 * rows[:, 0] + rows[:, 4]
        order = np.argsort(when, kind="stable")
        by_id[int(i)] = when[order], np.concatenate([[0], np.cumsum(rows[order, 3])])
    last_refresh: dict[int, int] = {}
    lags = np.zeros(len(reads), np.int64)
    for k, (step, i, refreshed) in enumerate(reads.tolist()):
        if refreshed:
            last_refresh[i] = step
            continue
        when, csum = by_id.get(i, (np.zeros(0, np.int64), np.zeros(1, np.int64)))
        # The copy has every update applied before the read that refreshed it; it misses the
        # others' updates from that step's write up to the flushes just before this read.
        lo = np.searchsorted(when, 2 * last_refresh[i] + 1)
        hi = np.searchsorted(when, 2 * step + 1)
        lags[k] = csum[hi] - csum[lo]
    return lags


def job_true_lags(results: list[RankResult]) -> np.ndarray:
    """:func:`true_lags` of every rank's reads (a job run with ``audit``)."""
    applied = np.concatenate([a for r in results for a in r.observed["audit"].applied])
    return np.concatenate([true_lags(r, applied) for r in results])


@pytest.fixture()
def recount_lags() -> Callable[[list[RankResult]], np.ndarray]:
    """:func:`job_true_lags`."""
    return job_true_lags


@pytest.fixture()
def max_diff() -> Callable[[RankResult, list[RankResult]], tuple[float, float]]:
    """:func:`model_gap`."""
    return model_gap


@pytest.fixture()
def rows_of() -> Callable[[list[RankResult]], dict[int, torch.Tensor]]:
    """:func:`owned_rows`."""
    return owned_rows


@pytest.fixture()
def targets():
    """The module of rank functions for ``launch`` (``launch_targets``, on the tests' path)."""
    import launch_targets

    return launch_targets


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request: pytest.FixtureRequest) -> str:
    """Each device a test of the store or the step runs on; CUDA where torch sees a GPU."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return request.param


@pytest.fixture()
def gpus(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``gpus(n)`` makes torch report ``n`` CUDA devices, for the checks that count them
    (nothing may run on them)."""
    def see(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return see
