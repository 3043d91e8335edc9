"""``--route-rounds -1``: batch-aware routing turned on where it pays, off where it does not.

The rows are measured on real batches of two synthetic shapes under a graph placement: the
user-item shape, where 3 rounds save about a tenth of the rows a rank's batch fetches, and the
user-history shape (a 20-item list beside one-value fields), where they save none. The clock
(the rounds' time) and the price of a row are what differ between machines, so the tests set
them: 1 ms of rounds a step, 20 us a row.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hetgmp.partitioner import FullPartitioner, PartitionConfig, Placement, WindowGraph, route_batch
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.step import AUTO_ROUNDS, ROUTE_AUTO, RouteChoice, TrainConfig

_WORKERS, _BATCH = 4, 1024
_PRICE = 20e-6  # seconds a row
_ROUNDS_SECONDS = 1e-3


class _Clock:
    """Each reading 1 ms after the last: the rounds (read before and after) take 1 ms."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += _ROUNDS_SECONDS
        return self.now


Batch = tuple[np.ndarray, np.ndarray]


def _stream(shape: str) -> tuple[list[Batch], Placement]:
    """Batches of a rank's share, and the graph placement of the records before them."""
    stream = SyntheticStream(SyntheticConfig(seed=0, shape=shape))
    indptr, values = stream.sample_csr(stream.take(0, 10_000 + 4 * _BATCH))
    window = WindowGraph(indptr[:10_001], values[:indptr[10_000]])
    config = PartitionConfig(num_workers=_WORKERS, global_batch=_WORKERS * _BATCH)
    placement = FullPartitioner(config).partition(window, None)
    batches = []
    for lo in range(10_000, indptr.size - 1 - _BATCH + 1, _BATCH):
        hi = lo + _BATCH
        batches.append((indptr[lo:hi + 1] - indptr[lo], values[indptr[lo]:indptr[hi]]))
    return batches, placement


@pytest.fixture(scope="module")
def pays() -> tuple[list[Batch], Placement]:
    return _stream("user_item")


@pytest.fixture(scope="module")
def does_not_pay() -> tuple[list[Batch], Placement]:
    return _stream("user_history")


def _auto() -> RouteChoice:
    """Auto, deciding on 6 measured steps, again every 12 while on (to keep tests short)."""
    return RouteChoice(ROUTE_AUTO, clock=_Clock(), probe_steps=6, check_every=2)


def _steps(choice: RouteChoice, stream: tuple[list[Batch], Placement], steps: int) -> None:
    """``steps`` steps of this rank: route its batch, then count the step at the price."""
    batches, placement = stream
    for i in range(steps):
        choice.destinations(batches[i % len(batches)], placement, 0.0)
        choice.on_step(_PRICE * 1000, 1000, routed=True)


def test_auto_turns_batch_aware_routing_on_where_it_pays(
        pays: tuple[list[Batch], Placement], caplog: pytest.LogCaptureFixture) -> None:
    choice = _auto()
    assert choice.state == "probe" and choice.rounds == AUTO_ROUNDS
    with caplog.at_level(logging.INFO, logger="hetgmp.trainer.step.route_choice"):
        _steps(choice, pays, choice.probe_steps)
    assert choice.state == "on" and choice.rounds == AUTO_ROUNDS
    decision = choice.decisions[-1]
    assert decision["decision"] == "on"
    assert float(decision["rows_saved_share"]) > 0.05  # type: ignore[arg-type]
    saved = float(decision["seconds_saved_per_step"])  # type: ignore[arg-type]
    assert saved == pytest.approx(float(decision["rows_saved_per_step"])  # type: ignore[arg-type]
                                  * _PRICE, rel=0.01)
    assert float(decision["seconds_cost_per_step"]) == pytest.approx(  # type: ignore[arg-type]
        _ROUNDS_SECONDS)
    assert "batch-aware routing on" in caplog.text
    gauges = choice.gauges()
    assert gauges["rounds"] == AUTO_ROUNDS and gauges["seconds_saved_per_step"] == saved


def test_auto_turns_it_off_where_it_does_not_and_retries_after_a_growing_rest(
        does_not_pay: tuple[list[Batch], Placement]) -> None:
    choice = _auto()
    _steps(choice, does_not_pay, choice.probe_steps)
    assert choice.state == "off" and choice.rounds == 0
    rest = int(choice.decisions[-1]["rest_steps"])  # type: ignore[call-overload]
    _steps(choice, does_not_pay, rest - 1)
    assert choice.state == "off"  # no measure while off: the rounds do not run
    _steps(choice, does_not_pay, 1)
    assert choice.state == "probe" and choice.decisions[-1]["decision"] == "retried"
    _steps(choice, does_not_pay, choice.probe_steps)
    assert choice.state == "off"
    assert choice.decisions[-1]["rest_steps"] == 2 * rest  # against twice: a longer rest
    assert [d["decision"] for d in choice.decisions] == ["off", "retried", "off"]


def test_it_stays_on_while_it_pays_and_goes_off_when_the_stream_changes(
        pays: tuple[list[Batch], Placement], does_not_pay: tuple[list[Batch], Placement]
        ) -> None:
    choice = _auto()
    _steps(choice, pays, choice.probe_steps)
    # On: every step is measured; a new decision every probe_steps * check_every steps.
    _steps(choice, pays, choice.probe_steps * choice.check_every)
    assert choice.state == "on" and [d["decision"] for d in choice.decisions] == ["on", "on"]
    _steps(choice, does_not_pay, choice.probe_steps * choice.check_every)
    assert choice.state == "off" and choice.rounds == 0


def test_a_dear_price_or_cheap_rows_decide_it(pays: tuple[list[Batch], Placement]) -> None:
    # The same saving, rows nearly free: the rounds' time is not worth it.
    choice = _auto()
    batches, placement = pays
    for i in range(choice.probe_steps):
        choice.destinations(batches[i % len(batches)], placement, 0.0)
        choice.on_step(1e-9 * 1000, 1000, routed=True)
    assert choice.state == "off"


@pytest.mark.parametrize("rounds", [0, 2])
def test_a_fixed_number_of_rounds_is_an_override(
        rounds: int, pays: tuple[list[Batch], Placement]) -> None:
    batches, placement = pays
    choice = RouteChoice(rounds, clock=_Clock())
    for batch in batches:
        dest = choice.destinations(batch, placement, 0.0)
        np.testing.assert_array_equal(dest, route_batch(batch, placement, 0.0, rounds))
        choice.on_step(1.0, 1, routed=True)
    assert choice.rounds == rounds and not choice.decisions and choice.report()["mode"] == "fixed"


def test_the_default_is_auto_and_minus_one_is_the_lowest_value() -> None:
    assert TrainConfig().route_rounds == ROUTE_AUTO
    with pytest.raises(ValueError, match="route_rounds"):
        TrainConfig(route_rounds=-2)
