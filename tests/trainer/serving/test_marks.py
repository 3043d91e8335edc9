"""A publish's mark against the messages serving saw of it: a publish cut by the checkpoint
serving started from is not a lost message; one cut later is."""

from __future__ import annotations

import numpy as np

from hetgmp.trainer.serving import Publish, ServingModel, log_version, mark_message, row_messages
from hetgmp.trainer.serving.deltas import decode

SHAPE = {"model": "widedeep", "row_dim": 5, "hidden": [4], "cross_layers": 0, "fields": 2,
         "dense": 1, "row_seed": 0, "row_init_scale": 0.01}


def _model() -> ServingModel:
    from hetgmp.trainer.model import FlatParameters, build_model
    from hetgmp.trainer.serving.model import model_config

    n = FlatParameters(build_model(model_config(SHAPE), 2, 1)).numel
    # As from a checkpoint taken after publish 3 of generation 1, world 1.
    return ServingModel(SHAPE, np.zeros(n, np.float32), lineage="abc",
                        version=log_version(1, 3), world=1, step=30)


def _publish(model: ServingModel, publish: int, parts: int, skip: int) -> None:
    """Apply a publish of ``parts`` row messages and its mark, less its first ``skip``."""
    head = Publish(rank=0, world=1, generation=1, publish=publish, step=10 * publish,
                   watermark_ms=publish, lineage="abc")
    messages = [row_messages(np.array([i]), np.full((1, 5), publish, np.float32), head)[0]
                for i in range(parts)]
    for m in [*messages, mark_message(parts, head)][skip:]:
        model.apply(decode(m))


def test_the_publish_a_checkpoint_cut_is_not_counted_incomplete_and_a_later_one_is() -> None:
    model = _model()
    # The checkpoint's offsets were taken while publish 4 was in flight: its first two
    # messages lie below them (their rows are in the checkpoint).
    _publish(model, 4, parts=3, skip=2)
    assert model.applied.incomplete == 0 and model.watermark_ms == 4
    _publish(model, 5, parts=3, skip=0)
    assert model.applied.incomplete == 0
    _publish(model, 6, parts=3, skip=1)  # a message of a later publish is missing
    assert model.applied.incomplete == 1 and model.applied.gaps == 0


def test_a_publish_past_the_one_in_flight_at_the_checkpoint_is_counted_even_if_first() -> None:
    model = _model()
    _publish(model, 7, parts=2, skip=1)  # not the publish after the checkpoint's
    assert model.applied.incomplete == 1


def test_a_replayed_mark_is_neither_a_gap_nor_an_incomplete_publish() -> None:
    model = _model()
    for publish in (4, 5, 6):
        _publish(model, publish, parts=2, skip=0)
    head = Publish(rank=0, world=1, generation=1, publish=5, step=50, watermark_ms=5,
                   lineage="abc")
    model.apply(decode(mark_message(2, head)))  # publish 5's mark again (a producer's retry)
    _publish(model, 5, parts=2, skip=0)  # the whole publish again
    a = model.applied
    assert (a.gaps, a.incomplete, a.replayed) == (0, 0, 2)
    assert model.watermark_ms == 6  # the newest publish still holds
    _publish(model, 8, parts=2, skip=0)  # publish 7 missing: a gap, as before
    assert (a.gaps, a.incomplete) == (1, 0)


def test_dense_publishes_that_never_complete_are_held_a_few_at_a_time() -> None:
    from hetgmp.trainer.model import FlatParameters, build_model
    from hetgmp.trainer.serving import dense_messages
    from hetgmp.trainer.serving.model import model_config

    shape = {**SHAPE, "hidden": [512, 512]}  # two dense messages a publish
    n = FlatParameters(build_model(model_config(shape), 2, 1)).numel
    model = ServingModel(shape, np.zeros(n, np.float32), lineage="abc",
                         version=log_version(1, 3), world=1, step=30)
    for publish in range(4, 60):  # each publish's first message only: never complete
        head = Publish(rank=0, world=1, generation=1, publish=publish, step=publish,
                       watermark_ms=publish, lineage="abc")
        parts = dense_messages(np.full(n, publish, np.float32), head)
        assert len(parts) == 2
        model.apply(decode(parts[0]))
    assert len(model._assembling) <= 4  # a model's worth of floats each, no more
    assert model.applied.dense_dropped == 56 - len(model._assembling)
    # A whole publish still replaces the dense parameters.
    head = Publish(rank=0, world=1, generation=1, publish=60, step=60, watermark_ms=60,
                   lineage="abc")
    for m in dense_messages(np.full(n, 0.5, np.float32), head):
        model.apply(decode(m))
    assert model.applied.dense == 1 and model.dense_version == log_version(1, 60)
    assert float(model.export()[3][0]) == 0.5
