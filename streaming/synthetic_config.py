"""The synthetic stream's settings, and the Zipf tables its shapes draw from.

The module sits below both generators, :mod:`hetgmp.streaming.synthetic` (the segmented and list
shapes) and :mod:`hetgmp.streaming.user_item`, and below :mod:`hetgmp.streaming.schema_file`, which names the
list shapes' schemas: each of them reads a :class:`SyntheticConfig` without importing another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from hetgmp.streaming.types import Schema, SparseField

__all__ = ["MLPERF_BAGS", "SHAPES", "SyntheticConfig", "zipf_cdf"]

SHAPES = ("segments", "user_item", "multi_hot", "user_history")
# Values a record carries in each of the 26 fields of MLPerf DLRM-DCNv2's multi-hot Criteo.
MLPERF_BAGS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic stream (see :mod:`hetgmp.streaming.synthetic` for their meaning)."""

    seed: int = field(default=0, metadata={"help": "seed: same seed, same bytes"})
    shape: Literal["segments", "user_item", "multi_hot", "user_history"] = field(
        default="segments",
        metadata={"help": "segments: 26 fields drawn from 64 communities' hot sets; user_item: "
                  "a user and an item field with power-law degrees and a few context fields, "
                  "no communities (see streaming.user_item); multi_hot: segments with "
                  "MLPerf DLRM-DCNv2's bag sizes (lists); user_history: user_item with a "
                  "history list of the user's last items, sharing the item table"})
    n_dense: int = field(default=13, metadata={"help": "integer features per record"})
    n_sparse: int = field(
        default=0, metadata={"help": "categorical fields per record (0: the shape's, 26 for "
                             "segments, 8 for user_item: user, item and 6 context fields)"})
    vocab_min: int = field(default=10, metadata={"help": "smallest field vocabulary"})
    vocab_max: int = field(
        default=1_000_000, metadata={"help": "largest field vocabulary (sizes log-spaced)"}
    )
    segments: int = field(default=64, metadata={"help": "communities of users/items"})
    segment_zipf: float = field(default=1.0, metadata={"help": "Zipf exponent of segment popularity"})
    hot_size: int = field(default=50, metadata={"help": "hot values per field per segment"})
    hot_prob: float = field(
        default=0.7, metadata={"help": "probability a value comes from the segment's hot set"}
    )
    field_zipf: float = field(
        default=1.1, metadata={"help": "Zipf exponent of a field's global value popularity"}
    )
    drift_every: int = field(default=100_000, metadata={"help": "records between drift events"})
    drift_fraction: float = field(
        default=0.2, metadata={"help": "fraction of segments whose hot sets change at a drift"}
    )
    missing_prob: float = field(default=0.02, metadata={"help": "probability a field is empty"})
    label_bias: float = field(default=-1.2, metadata={"help": "ground-truth logit bias (sets CTR)"})
    weight_scale: float = field(
        default=0.45, metadata={"help": "spread of ground-truth per-value weights (sets AUC)"}
    )
    users: int = field(default=6_000, metadata={"help": "user_item: users"})
    items: int = field(default=4_000, metadata={"help": "user_item: items"})
    user_zipf: float = field(
        default=0.8, metadata={"help": "user_item: Zipf exponent of user activity"})
    item_zipf: float = field(
        default=1.0, metadata={"help": "user_item: Zipf exponent of item popularity"})
    taste_size: int = field(default=30, metadata={"help": "user_item: items in a user's taste"})
    taste_prob: float = field(
        default=0.5, metadata={"help": "user_item: probability the item is from the user's taste"})
    taste_bonus: float = field(
        default=1.0, metadata={"help": "user_item: ground-truth logit bonus of a taste item"})
    context_user_prob: float = field(
        default=0.8, metadata={"help": "user_item: probability a context field holds the "
                               "user's own value (a user's country, device)"})
    context_max: int = field(
        default=1_000, metadata={"help": "user_item: largest context vocabulary"})
    history_len: int = field(
        default=20, metadata={"help": "user_history: items in a record's history list"})
    repeat_prob: float = field(
        default=0.0, metadata={"help": "user_history: probability the item is one the user "
                               "clicked last (one of the history's first repeat_window "
                               "items): a signal only a model that compares the item with "
                               "the history can read (0: none, the stream as it was)"})
    repeat_window: int = field(
        default=3, metadata={"help": "user_history: the most recent history items a repeat "
                             "comes from"})
    repeat_bonus: float = field(
        default=1.5, metadata={"help": "user_history: ground-truth logit bonus of a repeat"})
    conversion: bool = field(
        default=False, metadata={"help": "a second label, conversion, after the click: counted "
                                 "only where there was a click, likelier the likelier the "
                                 "click, with value weights of its own (a two-task stream)"})
    history_pooling: Literal["mean", "none"] = field(
        default="mean", metadata={"help": "user_history: how the history field pools: mean, or "
                                  "none, a sequence of rows for models that read one (din)"})

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r}: one of {', '.join(SHAPES)}")
        if self.n_sparse == 0:
            object.__setattr__(self, "n_sparse", {"segments": 26, "multi_hot": 26,
                                                  "user_item": 8, "user_history": 9}[self.shape])
        if self.shape in ("user_item", "user_history"):
            least = 2 if self.shape == "user_item" else 3
            if self.n_sparse < least or self.users < 1 or self.items < 1 or self.taste_size < 1:
                raise ValueError(f"{self.shape} needs n_sparse >= {least} (user, item, "
                                 f"{'' if least == 2 else 'history, '}contexts) and "
                                 "users, items, taste_size >= 1")
            if self.history_len < 1:
                raise ValueError("history_len must be >= 1")
            if not 0.0 <= self.repeat_prob <= 1.0 or not \
                    1 <= self.repeat_window <= self.history_len:
                raise ValueError("repeat_prob in [0, 1] and repeat_window in 1..history_len")
            if not 0.0 <= self.taste_prob <= 1.0 or not 0.0 <= self.context_user_prob <= 1.0:
                raise ValueError("taste_prob and context_user_prob must lie in [0, 1]")
        if not 0 < self.vocab_min <= self.vocab_max:
            raise ValueError("need 0 < vocab_min <= vocab_max")
        if self.segments < 1 or self.hot_size < 1 or self.n_sparse < 1:
            raise ValueError("segments, hot_size and n_sparse must be >= 1")
        if not 0.0 <= self.hot_prob <= 1.0 or not 0.0 <= self.drift_fraction <= 1.0:
            raise ValueError("hot_prob and drift_fraction must lie in [0, 1]")
        if self.drift_every < 1:
            raise ValueError("drift_every must be >= 1")

    @property
    def bags(self) -> tuple[int, ...]:
        """Values of each sparse field (1: one value; more: a list of that many)."""
        if self.shape == "multi_hot":
            return tuple(MLPERF_BAGS[f % len(MLPERF_BAGS)] for f in range(self.n_sparse))
        if self.shape == "user_history":
            return (1, 1, self.history_len) + (1,) * (self.n_sparse - 3)
        return (1,) * self.n_sparse

    @property
    def schema(self) -> Schema:
        """The schema of the generated records: Criteo-style names, with lists (and the
        history's shared table) for the list shapes, and the label ``conversion`` after
        ``label`` with :attr:`conversion`."""
        plain = Schema.from_counts(self.n_dense, self.n_sparse)
        labels = (plain.label, "conversion") if self.conversion else (plain.label,)
        if self.shape not in ("multi_hot", "user_history"):
            return Schema.of(labels, plain.dense_fields, plain.sparse_fields) \
                if self.conversion else plain
        # Lists pool by mean: the ground truth weighs a bag by its values' mean, and summed
        # the 100-value bag's rows moved 100 times as fast as a one-value field's under
        # Adagrad (bench train --quick, multi_hot, sum: held-out AUC 0.568, log-loss 0.994).
        sparse = [SparseField(name, max_len=size, pooling="mean") if size > 1
                  else SparseField(name) for name, size in zip(plain.sparse, self.bags)]
        if self.shape == "user_history":  # C3, the history, looks up C2's rows (the items)
            sparse[2] = SparseField(plain.sparse[2], table=plain.sparse[1],
                                    max_len=self.history_len, pooling=self.history_pooling)
        return Schema.of(labels, plain.dense_fields, sparse)


def zipf_cdf(n: int, exponent: float) -> np.ndarray:
    """Cumulative probabilities of Zipf(``exponent``) over ranks 0..n-1."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]
