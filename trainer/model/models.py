"""CTR models on looked-up rows: Wide&Deep, DeepFM, DCN, DCN-v2 and DLRM.

Every model takes the rows of a batch's feature ids, ``emb [B, F, R]`` (one row per sparse
field), and the dense features ``dense [B, n_dense]``, and returns one logit per sample. The
embedding table itself is not a module: rows live in the sharded store and reach the model as a
tensor that requires grad, so the model holds only the dense parameters that every rank keeps a
full copy of.

For Wide&Deep and DeepFM a row is ``[w, v_1..v_D]``: ``w`` is the id's first-order weight (the
wide part / FM's linear term), ``v`` its vector (:attr:`ModelConfig.row_dim`).

No batch normalisation: its statistics would depend on how samples are split over ranks, and
``s = 0`` training must not (invariant 3).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from hetgmp.trainer.model.config import ModelConfig

__all__ = ["WideDeep", "DeepFM", "DCN", "DCNv2", "DLRM", "build_model"]

_SEEDING = threading.Lock()


def _body(width_in: int, hidden: tuple[int, ...]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU layers of ``hidden`` sizes, and the width they end in."""
    layers: list[nn.Module] = []
    for size in hidden:
        layers += [nn.Linear(width_in, size), nn.ReLU()]
        width_in = size
    return nn.Sequential(*layers), width_in


def _mlp(width_in: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """The ``hidden`` layers, then one logit."""
    body, width = _body(width_in, hidden)
    return nn.Sequential(*body, nn.Linear(width, 1))


class WideDeep(nn.Module):
    """Wide&Deep (Cheng et al. 2016): a linear model plus an MLP over the embeddings."""

    def __init__(self, config: ModelConfig, n_fields: int, n_dense: int) -> None:
        super().__init__()
        self.wide_dense = nn.Linear(n_dense, 1)
        self.deep = _mlp(n_fields * config.embed_dim + n_dense, config.hidden)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` of rows ``[B, F, 1 + D]`` and dense features ``[B, n_dense]``."""
        wide = emb[..., 0].sum(dim=1) + self.wide_dense(dense).squeeze(1)
        deep = self.deep(torch.cat([emb[..., 1:].flatten(1), dense], dim=1)).squeeze(1)
        return wide + deep


class DeepFM(nn.Module):
    """DeepFM (Guo et al. 2017): first-order terms, pairwise FM interactions and an MLP."""

    def __init__(self, config: ModelConfig, n_fields: int, n_dense: int) -> None:
        super().__init__()
        self.linear_dense = nn.Linear(n_dense, 1)
        self.deep = _mlp(n_fields * config.embed_dim + n_dense, config.hidden)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` of rows ``[B, F, 1 + D]`` and dense features ``[B, n_dense]``."""
        vec = emb[..., 1:]
        first = emb[..., 0].sum(dim=1) + self.linear_dense(dense).squeeze(1)
        # sum_{i<j} <v_i, v_j> = ((sum v)^2 - sum v^2) / 2, in O(F D) rather than O(F^2 D).
        fm = 0.5 * (vec.sum(dim=1).pow(2) - vec.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.deep(torch.cat([vec.flatten(1), dense], dim=1)).squeeze(1)
        return first + fm + deep


class _CrossAndDeep(nn.Module):
    """A cross tower beside an MLP over ``x0 = [rows, dense]``, both into one linear head (DCN
    and DCN-v2, which differ in their cross layer, :meth:`cross`)."""

    cross_b: nn.Parameter  # [layers, width]: each cross layer's bias

    def _deep_and_head(self, width: int, config: ModelConfig) -> None:
        """The MLP and the head, registered after the cross layers' parameters."""
        self.deep_body, deep_width = _body(width, config.hidden)
        self.head = nn.Linear(width + (deep_width if config.hidden else 0), 1)

    def cross(self, x0: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        """Cross layer ``layer`` on ``x`` (its input ``x_l``), with ``x0`` the tower's input."""
        raise NotImplementedError

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` of rows ``[B, F, D]`` and dense features ``[B, n_dense]``."""
        x0 = torch.cat([emb.flatten(1), dense], dim=1)
        x = x0
        for layer in range(self.cross_b.shape[0]):
            x = self.cross(x0, x, layer)
        parts = [x, self.deep_body(x0)] if len(self.deep_body) else [x]
        return self.head(torch.cat(parts, dim=1)).squeeze(1)


class DCN(_CrossAndDeep):
    """Deep & Cross Network (Wang et al. 2017): explicit feature crosses beside an MLP.

    Cross layer: ``x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l`` (one vector per layer, the original
    DCN; DCN-v2's full matrices would put ~(F D)^2 parameters into every dense all-reduce).
    """

    def __init__(self, config: ModelConfig, n_fields: int, n_dense: int) -> None:
        super().__init__()
        width = n_fields * config.embed_dim + n_dense
        self.cross_w = nn.Parameter(torch.randn(config.cross_layers, width) / width**0.5)
        self.cross_b = nn.Parameter(torch.zeros(config.cross_layers, width))
        self._deep_and_head(width, config)

    def cross(self, x0: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        return x0 * (x @ self.cross_w[layer]).unsqueeze(1) + self.cross_b[layer] + x


class DCNv2(_CrossAndDeep):
    """DCN-v2 (Wang et al. 2021): low-rank cross layers beside an MLP (the parallel form).

    Cross layer: ``x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l`` with ``V_l`` ``[rank, width]``
    and ``U_l`` ``[width, rank]``: ``2 width rank`` parameters a layer instead of DCN-v2's full
    ``width^2``, which every dense all-reduce would carry.
    """

    def __init__(self, config: ModelConfig, n_fields: int, n_dense: int) -> None:
        super().__init__()
        width, rank, layers = n_fields * config.embed_dim + n_dense, config.cross_rank, \
            config.cross_layers
        self.cross_v = nn.Parameter(torch.randn(layers, width, rank) / width**0.5)
        self.cross_u = nn.Parameter(torch.randn(layers, rank, width) / rank**0.5)
        self.cross_b = nn.Parameter(torch.zeros(layers, width))
        self._deep_and_head(width, config)

    def cross(self, x0: torch.Tensor, x: torch.Tensor, layer: int) -> torch.Tensor:
        return x0 * ((x @ self.cross_v[layer]) @ self.cross_u[layer] + self.cross_b[layer]) + x


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019), the architecture of MLPerf's recommendation benchmark.

    A bottom MLP maps the dense features to one vector of the embedding's width; the dot
    products of every pair among that vector and the F rows are the interactions; a top MLP
    reads them beside the bottom vector.
    """

    def __init__(self, config: ModelConfig, n_fields: int, n_dense: int) -> None:
        super().__init__()
        body, width = _body(n_dense, config.bottom)
        self.bottom = nn.Sequential(*body, nn.Linear(width, config.embed_dim), nn.ReLU())
        self.n_vectors = n_fields + 1
        pairs = self.n_vectors * (self.n_vectors - 1) // 2
        self.top = _mlp(config.embed_dim + pairs, config.hidden)

    def forward(self, emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Logits ``[B]`` of rows ``[B, F, D]`` and dense features ``[B, n_dense]``."""
        z = self.bottom(dense)
        vectors = torch.cat([z.unsqueeze(1), emb], dim=1)  # [B, F + 1, D]
        dots = vectors @ vectors.transpose(1, 2)
        i, j = torch.triu_indices(self.n_vectors, self.n_vectors, 1, device=emb.device)
        return self.top(torch.cat([z, dots[:, i, j]], dim=1)).squeeze(1)


_MODELS: dict[str, type[nn.Module]] = {"widedeep": WideDeep, "deepfm": DeepFM, "dcn": DCN,
                                       "dcnv2": DCNv2, "dlrm": DLRM}


def build_model(config: ModelConfig, n_fields: int, n_dense: int) -> nn.Module:
    """The configured model with parameters drawn from ``config.seed`` (same on every rank).

    The global RNG is left as it was: initialisation uses a forked RNG state.
    """
    dtype = torch.float64 if config.dtype == "float64" else torch.float32
    # The global RNG is one per process: ranks that are threads of one process (the fast lane,
    # trainer.dist.ThreadComm) must not interleave their seeding and drawing.
    with _SEEDING, torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = _MODELS[config.model](config, n_fields, n_dense)
    return model.to(dtype)
