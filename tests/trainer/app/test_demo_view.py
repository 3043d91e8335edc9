"""The demo's live view and report figures, from scraped figures (no broker, no ranks)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from hetgmp.trainer.app.demo import DemoConfig, _backend
from hetgmp.trainer.app.report import rates, ratios
from hetgmp.trainer.app.scrape import Timeline, combine
from hetgmp.trainer.app.view import LiveView


def scraped(trained: float, loss_sum: float, gauge: float, migrating: float = 0.0) -> dict:
    return {
        "hetgmp_samples_trained_total": [({"rank": "0"}, trained)],
        "hetgmp_train_logloss_total": [({"rank": "0"}, loss_sum)],
        "hetgmp_train_loss": [({"rank": "0"}, gauge)],
        "hetgmp_migration_steps_total": [({"rank": "0"}, migrating)],
    }


def _view(tl: Timeline, config: DemoConfig) -> str:
    out = io.StringIO()
    LiveView(out, False, config.duration_s, _backend(config), config.staleness,
             ["http://127.0.0.1:9300/metrics"]).draw(tl)
    return out.getvalue()


def test_loss_is_the_window_mean_of_every_sample_trained():
    # Rank 1 trained nothing in the window: its gauge still holds an old, high loss, which a
    # mean of the gauges would count; the sums do not.
    tl = Timeline()
    tl.snaps.append(combine(0.0, [scraped(1000, 600.0, 0.6), scraped(1000, 900.0, 0.9)]))
    tl.snaps.append(combine(4.0, [scraped(3000, 1400.0, 0.4), scraped(1000, 900.0, 0.9)]))
    tl.produced.append((4.0, 5000))
    assert "loss 0.4000" in _view(tl, DemoConfig())  # (1400 - 600) / (3000 - 1000)


def test_the_view_says_when_steps_overlap_a_migration():
    tl = Timeline()
    tl.snaps.append(combine(0.0, [scraped(1000, 600.0, 0.6, migrating=2)]))
    tl.snaps.append(combine(4.0, [scraped(3000, 1400.0, 0.4, migrating=5)]))
    shown = _view(tl, DemoConfig())
    assert "steps trained during migrations 5  (migrating now)" in shown
    tl.snaps.append(combine(9.5, [scraped(5000, 2200.0, 0.4, migrating=5)]))
    assert "(migrating now)" not in _view(tl, DemoConfig())


@pytest.mark.parametrize("device,workers,shown", [("cpu", 2, "2 rank(s), CPU/gloo"),
                                                  ("cuda", 2, "2 rank(s), CUDA/NCCL"),
                                                  ("cuda", 1, "1 rank(s), CUDA ")])
def test_the_view_names_the_device_the_ranks_train_on(device: str, workers: int,
                                                      shown: str) -> None:
    tl = Timeline()
    tl.snaps.append(combine(0.0, [scraped(1000, 600.0, 0.6)]))
    tl.produced.append((0.0, 1000))
    assert shown in _view(tl, DemoConfig(device=device, workers=workers))


def test_rates_are_smooth_over_scrapes_that_saw_no_step():
    # A step of 16k records every 4 s, scraped every second: per-scrape rates would saw-tooth
    # between 0 and 16k; over a 5 s window they stay near 4k.
    t = np.arange(0, 41, 1.0)
    counter = 16_000 * np.floor(t / 4)
    at, r = rates(t, counter, window_s=5.0)
    assert at[0] >= 2.5  # too little history before: left out, not drawn
    steady = r[at >= 5]  # from the first window that holds a step
    assert steady.min() >= 3_000 and steady.max() <= 6_500
    _, per_scrape = rates(t, counter, window_s=1.0)
    assert per_scrape.min() == 0 and per_scrape.max() == 16_000  # what the report used to draw
    # A ratio only where its denominator grew: no 0 drawn for a window without steps.
    rt, ratio = ratios(t, 2 * counter, counter, window_s=5.0)
    assert np.allclose(ratio, 2.0) and rt.size > 30


def test_two_labels_show_each_tasks_rolling_auc_in_the_view_and_the_report() -> None:
    # --conversion: each rank exports hetgmp_task_auc{task}; the view and the report's AUC
    # chart show a line a task, each the mean over ranks.
    from hetgmp.trainer.app.demo import _auc_series, _table

    def with_tasks(click: float, conversion: float) -> dict:
        return {**scraped(1000, 600.0, 0.6), "hetgmp_heldout_auc": [({"rank": "0"}, click)],
                "hetgmp_task_auc": [({"rank": "0", "task": "label"}, click),
                                    ({"rank": "0", "task": "conversion"}, conversion)]}

    tl = Timeline()
    tl.snaps.append(combine(0.0, [with_tasks(0.70, 0.80), with_tasks(0.72, 0.84)]))
    tl.snaps.append(combine(4.0, [with_tasks(0.71, 0.81), with_tasks(0.73, 0.85)]))
    tl.produced.append((4.0, 5000))
    assert tl.snaps[-1].task_auc == pytest.approx({"label": 0.72, "conversion": 0.83})
    assert "rolling AUC label 0.7200  conversion 0.8300" in _view(tl, DemoConfig(conversion=True))
    series = _auc_series(tl)
    assert [s.name for s in series] == ["label", "conversion"]
    assert list(series[1].y) == pytest.approx([0.82, 0.83])
    rows = dict(_table(DemoConfig(conversion=True), {
        "duration_s": 4, "records_produced": 5000, "records_consumed": 5000,
        "samples_trained": 4000, "samples_per_s": 1000.0, "steps": 2,
        "steps_during_migrations": 0, "placement_version": 1, "repartitions": 0,
        "drift_triggers": 0, "rows_migrated": 0, "remote_rows_per_sample": 1.0,
        "bytes_per_sample": 10.0, "max_staleness": 0, "progressive_auc_last": 0.72,
        "task_auc_last": {"label": 0.72, "conversion": 0.83}, "freshness_p50_s": 1.0,
        "freshness_p99_s": 2.0, "checkpoints": 0, "last_checkpoint_records": None}))
    assert rows["Rolling AUC at the end"] == "label 0.7200, conversion 0.8300"
    # One label: one line, the mean over ranks, as before.
    one = Timeline()
    one.snaps.append(combine(0.0, [{**scraped(1000, 600.0, 0.6),
                                    "hetgmp_heldout_auc": [({"rank": "0"}, 0.7)]}]))
    assert [s.name for s in _auc_series(one)] == ["mean over ranks"]
