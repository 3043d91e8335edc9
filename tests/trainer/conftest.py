"""Helpers shared by the trainer tests: comparing the model of N ranks with a reference run."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from trainer.worker import RankResult


def owned_rows(results: list[RankResult]) -> dict[int, torch.Tensor]:
    """Every rank's owned rows by id; an id on two ranks fails the test (invariant 1)."""
    rows: dict[int, torch.Tensor] = {}
    for r in results:
        assert r.state is not None
        for i, row in zip(r.state.ids.tolist(), r.state.rows):
            assert i not in rows, "a row owned by two ranks"
            rows[i] = row
        for name, value in r.state.dense.items():  # every rank holds the same dense copy
            assert torch.equal(value, results[0].state.dense[name])  # type: ignore[union-attr]
    return rows


def model_gap(reference: RankResult, results: list[RankResult]) -> tuple[float, float]:
    """Largest difference of dense parameters and of embedding rows; the same rows must exist."""
    ref = reference.state
    assert ref is not None
    rows = owned_rows(results)
    assert set(rows) == set(ref.ids.tolist())
    emb = max(float((rows[i] - row).abs().max()) for i, row in zip(ref.ids.tolist(), ref.rows))
    first = results[0].state
    assert first is not None
    dense = max(float((first.dense[k] - v).abs().max()) for k, v in ref.dense.items())
    return dense, emb


@pytest.fixture()
def max_diff() -> Callable[[RankResult, list[RankResult]], tuple[float, float]]:
    """:func:`model_gap`."""
    return model_gap


@pytest.fixture()
def rows_of() -> Callable[[list[RankResult]], dict[int, torch.Tensor]]:
    """:func:`owned_rows`."""
    return owned_rows


@pytest.fixture()
def targets(monkeypatch: pytest.MonkeyPatch):
    """The module of rank functions for ``launch`` (``launch_targets``)."""
    # Spawned ranks inherit sys.path, so they can import the target module by its plain name.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import launch_targets

    return launch_targets
