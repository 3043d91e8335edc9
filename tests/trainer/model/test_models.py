"""The CTR models: shapes, gradients, deterministic initialisation, the FM identity."""

from __future__ import annotations

import pytest
import torch

from trainer.model import ModelConfig
from trainer.model.models import DeepFM, build_model

F, D, N_DENSE, B = 5, 4, 3, 7


@pytest.mark.parametrize("name", ["widedeep", "deepfm", "dcn"])
def test_model_maps_rows_and_dense_to_one_logit_per_sample(name: str) -> None:
    config = ModelConfig(model=name, embed_dim=D, hidden=(8, 4), dtype="float64")
    model = build_model(config, F, N_DENSE)
    emb = torch.randn(B, F, config.row_dim, dtype=torch.float64, requires_grad=True)
    dense = torch.rand(B, N_DENSE, dtype=torch.float64)
    out = model(emb, dense)
    assert out.shape == (B,)
    out.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters())
    # Samples are independent: no batch statistics (s = 0 equivalence needs this).
    assert torch.allclose(model(emb[:3], dense[:3]), out[:3])


def test_row_dim_carries_first_order_weight_where_the_model_has_one() -> None:
    assert ModelConfig(model="deepfm", embed_dim=8).row_dim == 9
    assert ModelConfig(model="widedeep", embed_dim=8).row_dim == 9
    assert ModelConfig(model="dcn", embed_dim=8).row_dim == 8


def test_initialisation_depends_on_seed_only() -> None:
    a = build_model(ModelConfig(seed=1), F, N_DENSE)
    torch.manual_seed(12345)  # the global RNG must not matter
    b = build_model(ModelConfig(seed=1), F, N_DENSE)
    c = build_model(ModelConfig(seed=2), F, N_DENSE)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_deepfm_second_order_term_is_the_sum_over_field_pairs() -> None:
    config = ModelConfig(model="deepfm", embed_dim=D, hidden=(4,), dtype="float64")
    model = build_model(config, F, N_DENSE)
    assert isinstance(model, DeepFM)
    emb = torch.randn(B, F, config.row_dim, dtype=torch.float64)
    dense = torch.rand(B, N_DENSE, dtype=torch.float64)
    vec = emb[..., 1:]
    pairs = sum((vec[:, i] * vec[:, j]).sum(1) for i in range(F) for j in range(i + 1, F))
    first = emb[..., 0].sum(1) + model.linear_dense(dense).squeeze(1)
    deep = model.deep(torch.cat([vec.flatten(1), dense], 1)).squeeze(1)
    assert torch.allclose(model(emb, dense), first + pairs + deep)
