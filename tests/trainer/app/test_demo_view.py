"""The demo's live view, from scraped figures (no broker, no ranks)."""

from __future__ import annotations

import io

import pytest

from trainer.app.demo import DemoConfig, _combine, _Timeline, _view


def scraped(trained: float, loss_sum: float, gauge: float) -> dict:
    return {
        "hetgmp_samples_trained_total": [({"rank": "0"}, trained)],
        "hetgmp_train_logloss_total": [({"rank": "0"}, loss_sum)],
        "hetgmp_train_loss": [({"rank": "0"}, gauge)],
    }


def test_loss_is_the_window_mean_of_every_sample_trained():
    # Rank 1 trained nothing in the window: its gauge still holds an old, high loss, which a
    # mean of the gauges would count; the sums do not.
    tl = _Timeline()
    tl.snaps.append(_combine(0.0, [scraped(1000, 600.0, 0.6), scraped(1000, 900.0, 0.9)]))
    tl.snaps.append(_combine(4.0, [scraped(3000, 1400.0, 0.4), scraped(1000, 900.0, 0.9)]))
    tl.produced.append((4.0, 5000))
    out = io.StringIO()
    _view(out, False, DemoConfig(), tl, ["http://127.0.0.1:9300/metrics"])

    assert "loss 0.4000" in out.getvalue()  # (1400 - 600) / (3000 - 1000)


@pytest.mark.parametrize("device,workers,shown", [("cpu", 2, "2 rank(s), CPU/gloo"),
                                                  ("cuda", 2, "2 rank(s), CUDA/NCCL"),
                                                  ("cuda", 1, "1 rank(s), CUDA ")])
def test_the_view_names_the_device_the_ranks_train_on(device: str, workers: int,
                                                      shown: str) -> None:
    tl = _Timeline()
    tl.snaps.append(_combine(0.0, [scraped(1000, 600.0, 0.6)]))
    tl.produced.append((0.0, 1000))
    out = io.StringIO()
    config = DemoConfig(device=device, workers=workers)
    _view(out, False, config, tl, ["http://127.0.0.1:9300/metrics"])
    assert shown in out.getvalue()
