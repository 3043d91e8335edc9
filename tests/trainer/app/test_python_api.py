"""Training from Python (issue 56): ``hetgmp.train`` takes a factory function of the user's,
trains it on two ranks as ``hetgmp train`` would, and refuses a model that cannot train on the
schema in one line before any rank starts."""

from __future__ import annotations

import pytest
import user_models

import hetgmp
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.model import ModelError

SYN = SyntheticConfig(shape="user_history", users=800, items=1_200, history_len=6, n_sparse=5,
                      seed=9, history_pooling="none", repeat_prob=0.3, conversion=True)


@pytest.mark.distributed
def test_a_factory_function_trains_on_two_ranks_from_python() -> None:
    result = hetgmp.train(
        hetgmp.SyntheticSpec(SYN, 0, 8_192), user_models.build,
        train=hetgmp.TrainConfig(global_batch=512, log_every=0),
        launch_config=hetgmp.LaunchConfig(workers=2, threads=1, device="cpu"),
        heldout=hetgmp.SyntheticSpec(SYN, 8_192, 2_048))
    assert result.job_totals.samples == 8_192 and result.world == 2
    assert set(result.tasks) == {"label", "conversion"}
    assert all(0.5 < t["heldout_auc"] < 1.0 for t in result.tasks.values()), result.tasks


def test_a_model_the_schema_cannot_train_or_the_ranks_cannot_import_is_refused() -> None:
    source = hetgmp.SyntheticSpec(SYN, 0, 1_024)
    with pytest.raises(ModelError, match="reads a field this schema does not give it"):
        hetgmp.train(source, user_models.missing_field)
    with pytest.raises(ModelError, match="pass a module-level function"):
        hetgmp.train(source, lambda spec: user_models.build(spec))
