"""A Criteo-shaped click stream built to exercise graph placement: skew, communities and drift.

Record ``i`` of the stream is a pure function of ``(config, i)``: it is generated in blocks of
:data:`BLOCK` records, block ``k`` from its own RNG stream ``(seed, k)``, so the same seed gives
the same bytes however callers slice the stream.

Shape (defaults from the issue, chosen to be comparable with the published system; flags change
each, benchmarks must not retune them):

* 26 categorical fields with vocabularies log-spaced from 10 to 1,000,000 values;
* 64 segments (communities) with Zipf(1.0) popularity; every record belongs to one segment;
* each segment has a hot set of 50 values per field; a value comes from the record's segment hot
  set with probability 0.7, else from the field's global Zipf(1.1) over its whole vocabulary;
* drift every 100,000 records: the hot sets of 20% of the segments are replaced and the segments'
  popularity order is reshuffled;
* labels from a seeded logistic ground truth: ``p = sigmoid(bias + sum_f w_f(value) + v . dense)``
  where ``w_f(value)`` is a deterministic pseudo-random weight of each (field, value) pair. The
  AUC of ``p`` itself on the generated labels is the ceiling a model can reach
  (:meth:`SyntheticStream.ceiling_auc`).

``shape="user_item"`` makes logs of another kind instead (a user and an item field with
power-law degrees, a few context fields, no planted segments, preference drift): see
:mod:`hetgmp.streaming.user_item`. Two shapes carry lists:

* ``multi_hot``: the segments stream where field ``f`` holds a bag of MLPerf DLRM-DCNv2's
  multi-hot size for it (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27,
  10, 3, 1, 1 values), each value drawn as a one-value field's is, pooled by mean (MLPerf sums;
  see ``SyntheticConfig.schema`` for why not here);
* ``user_history``: the user-item stream with a ``history`` field after the item, the user's
  last ``history_len`` items (drawn as the item field is, from the user's taste and the items'
  popularity), looking up the item field's table, pooled by mean.

A list field is a bag of fixed size (its slots); a missing one is an empty bag. Each slot's
ground-truth weight counts ``1 / size`` of its bag, so a bag weighs as one value does.

Categorical values are rendered as 8 hex digits like Criteo's (a 32-bit scramble of the value's
index), so the same decoder and the same feature-id hash serve real and synthetic logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetgmp.runtime import fmix64
from hetgmp.streaming.hashing import field_seeds, hash_spans
from hetgmp.streaming.synthetic_config import MLPERF_BAGS, SHAPES, SyntheticConfig, zipf_cdf
from hetgmp.streaming.user_item import UserItemShape

__all__ = ["SyntheticConfig", "SyntheticStream", "SyntheticBlock", "BLOCK", "MLPERF_BAGS",
           "SHAPES", "auc"]


BLOCK = 4096
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# Four hex digits of every 16-bit number, as little-endian uint32 (digit order = byte order).
_HEX16 = (
    _HEX[(np.arange(65536)[:, None] >> np.array([12, 8, 4, 0])) & 0xF].astype(np.uint8).view("<u4").ravel()
)
_DEC_LIMIT = 1_000_000
# The conversion label (SyntheticConfig.conversion): P(conversion | click) =
# sigmoid(bias + click * (click logit - label_bias) + the values' conversion weights); about
# a third of clicks convert on the default shapes.
_CONVERSION_BIAS = -0.8
_CONVERSION_CLICK = 0.5
_CONVERSION_SALT = 0x9E3779B97F4A7C15
_DEC_TABLE: np.ndarray | None = None


def _decimal_table() -> np.ndarray:
    """uint64 per integer below _DEC_LIMIT: its ASCII digits left-aligned, zero padded (lazy)."""
    global _DEC_TABLE
    if _DEC_TABLE is None:
        v = np.arange(_DEC_LIMIT, dtype=np.int64)
        width = np.maximum(np.floor(np.log10(np.maximum(v, 1))).astype(np.int64) + 1, 1)
        out = np.zeros((_DEC_LIMIT, 8), np.uint8)
        for k in range(6):  # k-th digit from the left, where the number has one
            has = width > k
            digit = (v // 10 ** np.maximum(width - 1 - k, 0)) % 10
            out[:, k] = np.where(has, digit + 48, 0)
        _DEC_TABLE = out.view("<u8").ravel()
    return _DEC_TABLE


@dataclass(frozen=True)
class SyntheticBlock:
    """Records ``start .. start+len-1`` of the stream, as arrays.

    Attributes:
        values: uint32 ``[B, T]`` value index of each slot (its rank in the field's
            vocabulary); a field has one slot a value (``T = S`` without lists).
        missing: bool ``[B, S]`` sparse field left empty (a list: an empty bag).
        dense: int64 ``[B, D]`` integer features, -1 where missing.
        labels: int8 ``[B]`` clicks; ``[B, 2]`` clicks and conversions with
            ``SyntheticConfig.conversion``.
        prob: float64 ``[B]`` ground-truth click probability.
        segment: int32 ``[B]``.
    """

    start: int
    values: np.ndarray
    missing: np.ndarray
    dense: np.ndarray
    labels: np.ndarray
    prob: np.ndarray
    segment: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def clicks(self) -> np.ndarray:
        """int8 ``[B]``: the click labels (the first task's)."""
        return self.labels if self.labels.ndim == 1 else self.labels[:, 0]


class SyntheticStream:
    """Deterministic generator of the synthetic click stream (see module docstring)."""

    def __init__(self, config: SyntheticConfig | None = None) -> None:
        self.config = c = config or SyntheticConfig()
        self.schema = c.schema
        self._user_item: UserItemShape | None = None
        if c.shape in ("user_item", "user_history"):
            self._user_item = UserItemShape(c)
            self.vocab = self._user_item.vocab
        else:
            sizes = np.round(np.geomspace(c.vocab_min, c.vocab_max, c.n_sparse)).astype(np.int64)
            # Sorted and distinct, unless that merged equal sizes: then all of them, in order.
            distinct = np.unique(sizes)
            self.vocab = distinct if distinct.size == c.n_sparse else sizes
        # Inverse-CDF tables of each field's global Zipf over its vocabulary.
        self._cdf = [zipf_cdf(int(v), c.field_zipf) for v in self.vocab]
        self._cdf_all = np.concatenate([f + cdf for f, cdf in enumerate(self._cdf)])
        self._cdf_start = np.concatenate([[0], np.cumsum([cdf.size for cdf in self._cdf])[:-1]])
        self._segment_cdf = zipf_cdf(c.segments, c.segment_zipf)
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._seeds = field_seeds(self.schema.tables)
        salt_rng = np.random.default_rng([c.seed, 0x5A17])
        self._field_salt = salt_rng.integers(0, 2**63, size=c.n_sparse, dtype=np.uint64)
        # Slots: a field of a list has one per value. A slot renders and weighs its value as
        # the first field of its table does (a history's item is the item field's item).
        self.bags = np.array(c.bags, np.int64)
        self.slot_field = np.repeat(np.arange(c.n_sparse), self.bags)
        tables = self.schema.tables
        owner = np.array([tables.index(t) for t in tables], np.int64)
        self._slot_salt = self._field_salt[owner[self.slot_field]]
        self._slot_scale = 1.0 / self.bags[self.slot_field]
        self.lists = bool((self.bags > 1).any())
        self._dense_mu = salt_rng.uniform(0.0, 4.0, size=c.n_dense)
        self._dense_w = salt_rng.normal(0.0, 0.15, size=c.n_dense)

    # -- epochs (drift) ------------------------------------------------------------------------

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        """(hot sets uint32 [segments, fields, hot], segment popularity order) in epoch ``e``."""
        if e in self._epochs:
            return self._epochs[e]
        c = self.config
        if e == 0:
            rng = np.random.default_rng([c.seed, 1, 0])
            hot = self._draw_hot(rng, c.segments)
            order = rng.permutation(c.segments)
        else:
            prev_hot, _ = self._epoch(e - 1)
            rng = np.random.default_rng([c.seed, 1, e])
            hot = prev_hot.copy()
            k = int(round(c.drift_fraction * c.segments))
            changed = rng.choice(c.segments, size=k, replace=False)
            hot[changed] = self._draw_hot(rng, k)
            order = rng.permutation(c.segments)
        if len(self._epochs) > 8:  # keep memory bounded on endless streams
            self._epochs.pop(min(self._epochs))
        self._epochs[e] = (hot, order)
        return hot, order

    def _draw_hot(self, rng: np.random.Generator, n_segments: int) -> np.ndarray:
        c = self.config
        cols = [rng.integers(0, v, size=(n_segments, c.hot_size), dtype=np.int64) for v in self.vocab]
        return np.stack(cols, axis=1).astype(np.uint32)

    # -- records -------------------------------------------------------------------------------

    def block(self, k: int) -> SyntheticBlock:
        """Block ``k``: records ``k*BLOCK .. (k+1)*BLOCK - 1``."""
        c = self.config
        start = k * BLOCK
        rng = np.random.default_rng([c.seed, 2, k])
        index = start + np.arange(BLOCK)
        if self._user_item is not None:
            values, bonus = self._user_item.values(rng, index)
            return self._finish(rng, start, values, np.full(BLOCK, -1, np.int32), bonus)
        epoch = index // c.drift_every
        seg_rank = np.searchsorted(self._segment_cdf, rng.random(BLOCK), side="right")
        seg_rank = np.minimum(seg_rank, c.segments - 1)
        segment = np.empty(BLOCK, np.int32)
        slots = self.slot_field.size
        hot_pick = np.empty((BLOCK, slots), np.uint32)
        # One uniform per (record, slot) decides hot vs global and, rescaled, picks the value:
        # half the random numbers of drawing each decision separately.
        u = rng.random((BLOCK, slots))
        use_hot = u < c.hot_prob
        slot = np.minimum((u / max(c.hot_prob, 1e-12) * c.hot_size).astype(np.int64), c.hot_size - 1)
        u_global = (u - c.hot_prob) / max(1.0 - c.hot_prob, 1e-12)
        for e in np.unique(epoch):  # a block spans at most a couple of epochs
            rows = np.flatnonzero(epoch == e)
            hot, order = self._epoch(int(e))
            segment[rows] = order[seg_rank[rows]]
            hot_pick[rows] = hot[segment[rows, None], self.slot_field, slot[rows]]
        values = hot_pick
        # Global Zipf draws of every field in one search: field f's CDF is stored shifted by f in
        # one concatenated table, so (f + u) lands inside field f's segment of it.
        rows, cols = np.nonzero(~use_hot)
        fields = self.slot_field[cols]
        pos = np.searchsorted(self._cdf_all, fields + u_global[rows, cols], side="right")
        rank = np.minimum(pos - self._cdf_start[fields], self.vocab[fields] - 1)
        # Scatter ranks over the vocabulary with a fixed affine bijection (7919 is prime), so
        # popular global values are not simply the smallest indices.
        values[rows, cols] = (rank * 7919 + 13) % self.vocab[fields]
        return self._finish(rng, start, values, segment, None)

    def _finish(self, rng: np.random.Generator, start: int, values: np.ndarray,
                segment: np.ndarray, bonus: np.ndarray | None) -> SyntheticBlock:
        """Missing fields, dense features and labels of a block whose values are drawn."""
        c = self.config
        missing = rng.random((BLOCK, c.n_sparse)) < c.missing_prob
        # Counts like Criteo's; capped below 10**6 (the decimal table's range), far in the tail.
        dense = np.minimum(
            np.floor(rng.lognormal(self._dense_mu, 1.0, size=(BLOCK, c.n_dense))), _DEC_LIMIT - 1
        ).astype(np.int64)
        dense_missing = rng.random((BLOCK, c.n_dense)) < c.missing_prob
        dense[dense_missing] = -1
        logit = c.label_bias + self._weights(values, missing).sum(axis=1)
        logit += np.log1p(np.maximum(dense, 0)) @ self._dense_w
        if bonus is not None:
            logit += bonus
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(BLOCK) < prob).astype(np.int8)
        if c.conversion:
            # Converted only where clicked; the odds rise with the click's own logit (a user
            # keen enough to click is likelier to buy) and with values of their own weight.
            conv = (_CONVERSION_BIAS + _CONVERSION_CLICK * (logit - c.label_bias)
                    + self._weights(values, missing, _CONVERSION_SALT).sum(axis=1))
            bought = rng.random(BLOCK) < 1.0 / (1.0 + np.exp(-conv))
            labels = np.stack([labels, (bought & (labels == 1)).astype(np.int8)], axis=1)
        return SyntheticBlock(start, values, missing, dense, labels, prob, segment)

    def _weights(self, values: np.ndarray, missing: np.ndarray, salt: int = 0) -> np.ndarray:
        """Ground-truth weight of each slot's (table, value): a hash mapped to a symmetric
        distribution, ``1 / size`` of it in a bag of ``size`` (``salt``: another task's
        weights)."""
        c = self.config
        h = fmix64(values.astype(np.uint64) ^ (self._slot_salt[None, :] ^ np.uint64(salt)))
        # Sum of two uniforms in [-1, 1): a triangular weight, mean 0, no heavy tails.
        a = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) / 2**32
        b = (h >> np.uint64(32)).astype(np.float64) / 2**32
        w = (a + b - 1.0) * c.weight_scale * 2.0
        if self.lists:
            w = w * self._slot_scale
        return np.where(missing[:, self.slot_field], 0.0, w)

    def blocks(self, start: int, count: int):
        """Yield ``(block, rows)`` pairs covering records ``start .. start+count-1``."""
        end = start + count
        k = start // BLOCK
        while k * BLOCK < end:
            b = self.block(k)
            lo = max(start - b.start, 0)
            hi = min(end - b.start, BLOCK)
            yield b, slice(lo, hi)
            k += 1

    def take(self, start: int, count: int) -> SyntheticBlock:
        """Records ``start .. start+count-1`` as one :class:`SyntheticBlock`."""
        parts = [(b, s) for b, s in self.blocks(start, count)]
        cat = lambda name: np.concatenate([getattr(b, name)[s] for b, s in parts])  # noqa: E731
        return SyntheticBlock(
            start,
            cat("values"),
            cat("missing"),
            cat("dense"),
            cat("labels"),
            cat("prob"),
            cat("segment"),
        )

    # -- rendering -----------------------------------------------------------------------------

    def _hex(self, block: SyntheticBlock) -> np.ndarray:
        """uint8 ``[B, T, 8]``: each slot's 8 hex digits (a 32-bit scramble of its index)."""
        scrambled = fmix64(block.values.astype(np.uint64) ^ self._slot_salt[None, :])
        word = (scrambled & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        # Two lookups of four hex digits each (high half first) instead of eight nibble shifts.
        halves = np.stack([_HEX16[word >> np.uint32(16)], _HEX16[word & np.uint32(0xFFFF)]], axis=-1)
        return halves.view(np.uint8).reshape(*word.shape, 8)

    def feature_ids(self, start: int, count: int) -> np.ndarray:
        """int64 ``[count, S]``: the feature ids a decoder computes for these records (a
        shape without lists; see :meth:`sparse`)."""
        return self.block_ids(self.take(start, count))

    def block_ids(self, block: SyntheticBlock) -> np.ndarray:
        """int64 ``[len(block), S]``: the feature ids of a block already generated (a shape
        without lists)."""
        if self.lists:
            raise ValueError(f"the {self.config.shape} shape has lists: read sparse()")
        return self._slot_ids(block)

    def _slot_ids(self, block: SyntheticBlock) -> np.ndarray:
        """int64 ``[len(block), T]``: each slot's id (a missing one-value field's: the empty
        value's, as the decoder gives it)."""
        digits = self._hex(block)
        n, t = block.values.shape
        buf = np.ascontiguousarray(digits).reshape(-1)
        starts = (np.arange(n * t, dtype=np.int64) * 8).reshape(n, t)
        ends = np.where(block.missing[:, self.slot_field], starts, starts + 8)
        return hash_spans(buf, starts, ends, self._seeds[self.slot_field])

    def sparse(self, block: SyntheticBlock) -> tuple[np.ndarray, np.ndarray]:
        """``(values [nnz], lengths [B, S])``: the jagged ids a decoder computes for a block
        (``ClickBatch.values`` and ``lengths``); a missing list is an empty bag."""
        ids = self._slot_ids(block)
        n = len(block)
        lengths = np.broadcast_to(self.bags, (n, self.bags.size)).astype(np.int32)
        listed = self.bags > 1
        if not listed.any():
            return ids.reshape(-1), lengths
        empty = block.missing & listed  # bags that hold nothing
        lengths = np.where(empty, 0, lengths).astype(np.int32)
        return ids[~empty[:, self.slot_field]], lengths

    def sample_csr(self, block: SyntheticBlock) -> tuple[np.ndarray, np.ndarray]:
        """``(indptr, values)``: the block's samples as a CSR of samples by ids (what routing,
        the window and the partitioner read)."""
        values, lengths = self.sparse(block)
        indptr = np.zeros(len(block) + 1, np.int64)
        np.cumsum(lengths.sum(axis=1, dtype=np.int64), out=indptr[1:])
        return indptr, values

    def lines(self, start: int, count: int) -> list[bytes]:
        """Criteo TSV lines (no trailing newline) of records ``start .. start+count-1``."""
        return self.lines_with_truth(start, count)[0]

    def lines_with_truth(self, start: int, count: int) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """``(lines, labels, ground-truth probabilities)`` from one generation pass."""
        out: list[bytes] = []
        labels, probs = [], []
        for block, rows in self.blocks(start, count):
            out.extend(self._render(block, rows))
            labels.append(block.clicks[rows])
            probs.append(block.prob[rows])
        return out, np.concatenate(labels), np.concatenate(probs)

    def _render(self, block: SyntheticBlock, rows: slice) -> list[bytes]:
        # Fixed-width byte matrix, one line per row, with 0 as padding; dropping the zeros and
        # splitting on newlines yields the lines without a Python loop over fields.
        c = self.config
        n = len(block.labels[rows])
        dense = block.dense[rows]
        # Decimal digits by table lookup: each value's digits left-aligned in 8 bytes, zero padded
        # (zeros are dropped below); missing values (-1) render as nothing.
        table = _decimal_table()
        codes = table[np.clip(dense, 0, table.size - 1)]
        codes[dense < 0] = 0
        dense_bytes = codes.view(np.uint8).reshape(n, c.n_dense, 8)
        dense_block = np.concatenate([np.full((n, c.n_dense, 1), 9, np.uint8), dense_bytes], axis=2).reshape(
            n, c.n_dense * 9
        )
        hexd = self._hex(block)[rows]
        missing = block.missing[rows][:, self.slot_field]
        hexd = np.where(missing[..., None], 0, hexd).astype(np.uint8)
        # A field's first slot follows a tab, the others of a list a comma (dropped with its
        # digits when the list is empty).
        first = np.concatenate([[True], self.slot_field[1:] != self.slot_field[:-1]])
        lead = np.where(first, 9, 44).astype(np.uint8)
        lead = np.where(missing & ~first, 0, lead).astype(np.uint8)
        slots = self.slot_field.size
        sparse_block = np.concatenate([lead[..., None], hexd], axis=2).reshape(n, slots * 9)
        picked = block.labels[rows].astype(np.uint8)
        digits = (picked if picked.ndim == 2 else picked[:, None]) + 48
        # Labels tab separated: digit, tab, digit (one task: the digit alone).
        label = np.insert(digits, np.arange(1, digits.shape[1]), 9, axis=1)
        matrix = np.concatenate([label, dense_block, sparse_block, np.full((n, 1), 10, np.uint8)], axis=1)
        data = matrix[matrix != 0].tobytes()
        return data.split(b"\n")[:-1]

    # -- ground truth --------------------------------------------------------------------------

    def ceiling_auc(self, start: int, count: int) -> float:
        """AUC of the ground-truth probabilities on the records' own labels (the ceiling)."""
        block = self.take(start, count)
        return auc(block.clicks, block.prob)


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties counted half), by ranks; nan with a single class."""
    labels = np.asarray(labels).astype(bool)
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = np.asarray(scores)[order]
    ranks = np.empty(s.size, np.float64)
    # Average ranks of tied scores.
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [s.size]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
