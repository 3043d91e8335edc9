"""The built-in models, each a plain ``torch.nn.Module`` on the model contract
(:class:`hetgmp.trainer.model.features.Features` in, logits out) and a ``build(spec)`` factory,
written as a user would write theirs: copy one to start a model of your own
(``docs/models.md``)."""

from __future__ import annotations

__all__ = ["BUILTINS"]

#: ``--model`` names of the built-ins and the factory each one names.
BUILTINS = {
    "widedeep": "hetgmp.trainer.model.zoo.widedeep:build",
    "deepfm": "hetgmp.trainer.model.zoo.deepfm:build",
    "dcn": "hetgmp.trainer.model.zoo.dcn:build_dcn",
    "dcnv2": "hetgmp.trainer.model.zoo.dcn:build_dcnv2",
    "dlrm": "hetgmp.trainer.model.zoo.dlrm:build",
    "din": "hetgmp.trainer.model.zoo.din:build",
    "mmoe": "hetgmp.trainer.model.zoo.mmoe:build",
}
