"""The CTR models: shapes, gradients, deterministic initialisation, the FM identity."""

from __future__ import annotations

import pytest
import torch

from hetgmp.trainer.model import Features, ModelConfig, build_model
from hetgmp.trainer.model.zoo.dcn import DCNv2
from hetgmp.trainer.model.zoo.deepfm import DeepFM
from hetgmp.trainer.model.zoo.dlrm import DLRM

F, D, N_DENSE, B = 5, 4, 3, 7


def _in(emb: torch.Tensor, dense: torch.Tensor) -> Features:
    """What the trainer hands a model: pooled rows ``[B, F, R]`` and the dense features."""
    return Features(tuple(f"f{i}" for i in range(emb.shape[1])), emb, dense)


@pytest.mark.parametrize("name", ["widedeep", "deepfm", "dcn", "dcnv2", "dlrm"])
def test_model_maps_rows_and_dense_to_one_logit_per_sample(name: str) -> None:
    config = ModelConfig(model=name, embed_dim=D, hidden=(8, 4), dtype="float64")
    model = build_model(config, F, N_DENSE)
    emb = torch.randn(B, F, config.row_dim, dtype=torch.float64, requires_grad=True)
    dense = torch.rand(B, N_DENSE, dtype=torch.float64)
    out = model(_in(emb, dense))
    assert out.shape == (B,)
    out.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.parameters())
    # Samples are independent: no batch statistics (s = 0 equivalence needs this).
    assert torch.allclose(model(_in(emb[:3], dense[:3])), out[:3])


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
    assert torch.allclose(model(_in(emb, dense)), first + pairs + deep)


def _dcnv2_reference(model: DCNv2, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """DCN-v2's cross layers written out one sample and one coordinate at a time."""
    out = []
    for b in range(emb.shape[0]):
        x0 = [float(v) for v in emb[b].flatten()] + [float(v) for v in dense[b]]
        x = list(x0)
        for layer in range(model.cross_b.shape[0]):
            v = model.cross_v[layer].tolist()  # [width][rank]
            u = model.cross_u[layer].tolist()  # [rank][width]
            bias = model.cross_b[layer].tolist()
            low = [sum(v[m][r] * x[m] for m in range(len(x))) for r in range(len(v[0]))]
            x = [x0[k] * (sum(u[r][k] * low[r] for r in range(len(low))) + bias[k]) + x[k]
                 for k in range(len(x))]
        deep = model.deep_body(torch.tensor([x0], dtype=torch.float64))[0].tolist()
        out.append(model.head(torch.tensor([x + deep], dtype=torch.float64))[0, 0])
    return torch.stack(out)


def _dlrm_reference(model: DLRM, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """DLRM's interactions written out: every pair (i < j) among the bottom vector and the
    rows, in that order, one dot product at a time."""
    out = []
    for b in range(emb.shape[0]):
        z = model.bottom(dense[b : b + 1])[0]
        vectors = [z] + [emb[b, f] for f in range(emb.shape[1])]
        dots = [float((vectors[i] * vectors[j]).sum()) for i in range(len(vectors))
                for j in range(i + 1, len(vectors))]
        top_in = torch.tensor([z.tolist() + dots], dtype=torch.float64)
        out.append(model.top(top_in)[0, 0])
    return torch.stack(out)


@pytest.mark.parametrize("name", ["dcnv2", "dlrm"])
def test_dcnv2_and_dlrm_compute_what_their_papers_write(name: str) -> None:
    config = ModelConfig(model=name, embed_dim=D, hidden=(6,), cross_rank=3, bottom=(5,),
                         dtype="float64")
    model = build_model(config, F, N_DENSE)
    assert config.row_dim == D  # no first-order weight in the rows
    emb = torch.randn(B, F, D, dtype=torch.float64)
    dense = torch.rand(B, N_DENSE, dtype=torch.float64)
    with torch.no_grad():
        if isinstance(model, DCNv2):
            model.cross_b.normal_()  # zero at initialisation: make the bias count
            want = _dcnv2_reference(model, emb, dense)
        else:
            assert isinstance(model, DLRM)
            want = _dlrm_reference(model, emb, dense)
        got = model(_in(emb, dense))
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), (got - want).abs().max()


def test_dcnv2s_cross_layers_hold_two_width_rank_parameters_each() -> None:
    config = ModelConfig(model="dcnv2", embed_dim=D, hidden=(), cross_layers=3, cross_rank=2)
    model = build_model(config, F, N_DENSE)
    width = F * D + N_DENSE
    assert isinstance(model, DCNv2)
    assert model.cross_v.numel() + model.cross_u.numel() == 3 * 2 * width * 2
    with pytest.raises(ValueError, match="cross_rank"):
        ModelConfig(model="dcnv2", cross_rank=0)


# The built-ins' parameters as the models of trainer/model/models.py made them before they
# moved onto the model contract (issue 56), same config and seed: (name, sum, sum of |x|) of
# each tensor of the state_dict, in order. The same keys and initial values, so checkpoints
# and runs of the same seed carry over.
BEFORE = {
    "widedeep": [
        ("wide_dense.weight", -0.1236252189, 0.5719590187),
        ("wide_dense.bias", 0.1811612844, 0.1811612844),
        ("deep.0.weight", -1.0759271242, 18.0645097167),
        ("deep.0.bias", 0.5530095007, 0.9911648575),
        ("deep.2.weight", -0.018682763, 1.4586756527),
        ("deep.2.bias", -0.2938990295, 0.2938990295),
    ],
    "deepfm": [
        ("linear_dense.weight", -0.1236252189, 0.5719590187),
        ("linear_dense.bias", 0.1811612844, 0.1811612844),
        ("deep.0.weight", -1.0759271242, 18.0645097167),
        ("deep.0.bias", 0.5530095007, 0.9911648575),
        ("deep.2.weight", -0.018682763, 1.4586756527),
        ("deep.2.bias", -0.2938990295, 0.2938990295),
    ],
    "dcn": [
        ("cross_w", -1.7170060547, 7.7173054512),
        ("cross_b", 0.0, 0.0),
        ("deep_body.0.weight", -1.0564460203, 18.1567087218),
        ("deep_body.0.bias", 0.0087156603, 0.8359226948),
        ("head.weight", -0.5024892917, 3.1022557063),
        ("head.bias", -0.0003516266, 0.0003516266),
    ],
    "dcnv2": [
        ("cross_v", -2.2851970331, 21.8690583715),
        ("cross_u", 7.6489034959, 66.6381226706),
        ("cross_b", 0.0, 0.0),
        ("deep_body.0.weight", 0.609815092, 19.7351271717),
        ("deep_body.0.bias", -0.1747896369, 0.8702153298),
        ("head.weight", 0.0517147956, 2.9800383626),
        ("head.bias", 0.1239522099, 0.1239522099),
    ],
    "dlrm": [
        ("bottom.0.weight", -0.4558936805, 3.314718768),
        ("bottom.0.bias", -0.3112790287, 1.9054586589),
        ("bottom.2.weight", 1.6595110558, 3.9742135964),
        ("bottom.2.bias", 0.1412910074, 1.0607077628),
        ("top.0.weight", -1.1714203931, 16.607911937),
        ("top.0.bias", -0.0121229701, 0.9465137534),
        ("top.2.weight", 0.0197811509, 0.8822092479),
        ("top.2.bias", -0.1879011393, 0.1879011393),
    ],
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_the_builtins_keep_their_parameters_names_and_initial_values(name: str) -> None:
    config = ModelConfig(model=name, embed_dim=4, hidden=(8,), cross_layers=2, cross_rank=3,
                         bottom=(5,), seed=7, dtype="float64")
    got = [(k, float(v.sum()), float(v.abs().sum()))
           for k, v in build_model(config, 5, 3).state_dict().items()]
    assert [k for k, _, _ in got] == [k for k, _, _ in BEFORE[name]]
    for (k, s, a), (_, want_s, want_a) in zip(got, BEFORE[name]):
        assert s == pytest.approx(want_s, abs=1e-9) and a == pytest.approx(want_a, abs=1e-9), k
