"""WindowIds against np.unique of the window, over windows that slide, jump and shrink."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.partitioner import WindowGraph
from hetgmp.partitioner import window_ids as module
from hetgmp.partitioner.window_ids import WindowIds


def _window(stream: np.ndarray, lo: int, hi: int, with_start: bool = True) -> WindowGraph:
    return WindowGraph.from_dense(stream[lo:hi], start=lo if with_start else None)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Chunks of a few samples, so that windows start inside chunks all the time.
    monkeypatch.setattr(module, "_CHUNK_SAMPLES", 7)


def test_a_sliding_window_has_the_distinct_ids_of_its_samples() -> None:
    rng = np.random.default_rng(0)
    stream = rng.zipf(1.3, size=(3000, 4)).astype(np.int64) % 500
    tracker = WindowIds()
    lo, hi = 0, 100
    for _ in range(200):
        got = tracker.update(_window(stream, lo, hi))
        np.testing.assert_array_equal(got, np.unique(stream[lo:hi]))
        step = int(rng.integers(0, 30))
        # Slide by varying amounts; now and then the window grows or shrinks.
        hi = min(hi + step, stream.shape[0])
        lo = min(max(lo, hi - int(rng.integers(50, 150))), hi)


def test_an_update_reads_only_the_new_samples_and_one_chunk() -> None:
    stream = np.arange(4000, dtype=np.int64).reshape(1000, 4) % 701
    tracker = WindowIds()
    tracker.update(_window(stream, 0, 500))
    assert tracker.last_work == 500
    tracker.update(_window(stream, 20, 520))
    # The 20 new samples with the short last chunk (497..499, summarised again with them), and
    # the 7-sample chunk the new start (20) cut: 20 re-read.
    assert tracker.last_work == (520 - 497) + (21 - 20)
    np.testing.assert_array_equal(tracker.update(_window(stream, 20, 520)), np.unique(stream[20:520]))


def test_a_gap_a_step_back_or_no_start_summarises_from_scratch() -> None:
    stream = (np.arange(8000, dtype=np.int64) * 7919 % 3001).reshape(2000, 4)
    tracker = WindowIds()
    tracker.update(_window(stream, 0, 300))
    for lo, hi, with_start in ((800, 1000, True), (100, 400, True), (500, 900, False),
                               (600, 950, True)):
        got = tracker.update(_window(stream, lo, hi, with_start))
        assert tracker.last_work == hi - lo
        np.testing.assert_array_equal(got, np.unique(stream[lo:hi]))


def test_an_empty_window_has_no_ids() -> None:
    tracker = WindowIds()
    stream = np.ones((10, 3), dtype=np.int64)
    tracker.update(_window(stream, 0, 10))
    assert tracker.update(_window(stream, 10, 10)).size == 0


@pytest.mark.slow
def test_short_periods_do_not_pile_up_small_chunks() -> None:
    stream = (np.arange(40_000, dtype=np.int64) * 31 % 997).reshape(10_000, 4)
    tracker = WindowIds()
    for end in range(300, 10_000, 3):  # three new samples an update, a 300-sample window
        got = tracker.update(_window(stream, end - 300, end))
    np.testing.assert_array_equal(got, np.unique(stream[end - 300:end]))
    assert len(tracker._chunks) <= 300 // 7 + 2


def test_windows_of_samples_without_ids() -> None:
    tracker = WindowIds()
    empty = WindowGraph(np.zeros(30, dtype=np.int64), np.zeros(0, dtype=np.int64), start=0)
    assert tracker.update(empty).size == 0
    assert tracker.update(WindowGraph(np.zeros(40, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                      start=5)).size == 0
