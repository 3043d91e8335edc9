"""``hetgmp train --model``: a built-in, or a factory of the user's by import path; a model that
cannot train on the schema is refused in one line before any rank starts (issue 56)."""

from __future__ import annotations

import json

import pytest

from hetgmp.trainer.app.cli import main

HISTORY = ["--source", "synthetic", "--synthetic-shape", "user_history",
           "--synthetic-history-pooling", "none", "--synthetic-repeat-prob", "0.3",
           "--embed-dim", "8", "--hidden", "16", "--global-batch", "512", "--log-every", "0",
           "--threads", "1", "--timeout-s", "120", "--placement", "hash"]


@pytest.mark.parametrize(("model", "said"), [
    ("user_models:missing_field", "reads a field this schema does not give it"),
    ("user_models:wrong_shape", "returned (3, 8) for 3 records"),
    ("deepfm", "reads pooled fields only"),
    ("dlrm --synthetic-history-pooling mean --table-dims C2=16",
     "needs one row width for every pooled field"),
    ("notamodel", "a built-in (widedeep, deepfm, dcn, dcnv2, dlrm, din, mmoe) or "
                  "package.module:function"),
])
def test_a_model_the_schema_cannot_train_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], model: str, said: str) -> None:
    name, *more = model.split()
    code = main(["train", *HISTORY, "--model", name, *more, "--records", "2048",
                 "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0] and name in err[0], err


@pytest.mark.slow
@pytest.mark.parametrize(("model", "dims"), [("din", ""), ("user_models:build", "C2=16,C4=4")])
def test_a_sequence_model_trains_on_two_ranks(capsys: pytest.CaptureFixture[str],
                                              model: str, dims: str) -> None:
    # The user's model with tables of three widths (the items 16, C4 4, the rest 8).
    code = main(["train", *HISTORY, "--model", model, "--records", "8192", "--heldout", "1024",
                 "--workers", "2", "--table-dims", dims])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["samples"] == 8192 and 0.0 < summary["heldout_auc"] < 1.0
    assert summary["placement"]["kind"] == "hash" and summary["mean_loss"] == summary["mean_loss"]
