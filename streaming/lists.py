"""Sparse fields that carry lists: byte spans split into values, hashed, laid out jagged.

A TSV record's list field is one tab-separated span holding values joined by a separator
(``,`` by default), each value optionally ``id:weight`` in a weighted field; JSON arrays are
joined the same way before they get here, so both formats go through :func:`jagged_ids`.
Everything is vectorised over the batch: the separators' positions in the buffer are found
once, assigned to the span they fall in by a binary search, and the values' spans follow by a
sort; no Python loop runs over records, fields or values.

Rules (the same for every format):
- an empty field, or an empty value between two separators, is no value (an empty bag pools
  to zeros);
- a one-value field keeps today's meaning: its whole span is the value, empty included;
- past ``max_len`` values a field truncates (the first ``max_len`` are kept, the rest counted
  per field) or, with ``on_overflow = "reject"``, the record is dead-lettered
  (``too_many_values``);
- a weighted field's value ``id:weight`` splits at its last colon; a value without a weight
  (no colon), or a weight that is not a number of magnitude at most :data:`MAX_MAGNITUDE`,
  dead-letters the record (``bad_weight``): a field the schema weighs never trains with a
  weight nobody sent.

:data:`MAX_MAGNITUDE` (1e18) bounds every number a record brings into training as it is: the
weights, and the dense values of a ``transform = "none"`` field (an 18-digit integer, the
longest a TSV dense field takes, is 1e18 at most; a ``log1p`` field takes any finite number,
as its log is small). A float32 holds 3.4e38, so such a value is stored finite, and a
weighted bag's pooled sum of up to 3.4e20 values (more than any record holds) stays finite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetgmp.streaming.hashing import hash_spans
from hetgmp.streaming.types import Schema, segment_positions

__all__ = ["DEFAULT_SEPARATOR", "MAX_MAGNITUDE", "Jagged", "arrange", "in_range", "jagged_ids",
           "select_rows", "split_spans"]

DEFAULT_SEPARATOR = ","
# The largest magnitude of a weight or a dense value (see the module's docstring).
MAX_MAGNITUDE = 1e18
_COLON = ord(":")


@dataclass
class Jagged:
    """The sparse part of a batch of records.

    Attributes:
        values: int64 ``[nnz]`` ids, sample-major then field (``ClickBatch.values``).
        lengths: int32 ``[R, S]`` values of each (record, field).
        weights: float32 ``[nnz]``, or None when no field is weighted.
        too_many: bool ``[R]`` records over some field's ``max_len`` that reject.
        bad_weight: bool ``[R]`` records with a value that has no weight, or a weight that
            is not a number in range (:func:`in_range`).
        truncated: Values dropped past ``max_len``, per field name (truncating fields only).
    """

    values: np.ndarray
    lengths: np.ndarray
    weights: np.ndarray | None
    too_many: np.ndarray
    bad_weight: np.ndarray
    truncated: dict[str, int] = field(default_factory=dict)


def split_spans(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, separator: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-empty values of 1-D spans, split at ``separator``: ``(starts, ends, span)`` of
    each value, in buffer order. The spans must be disjoint and in increasing order."""
    if starts.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    lo, hi = int(starts.min()), int(ends.max())
    seps = lo + np.flatnonzero(buf[lo:hi] == separator)
    span = np.searchsorted(starts, seps, side="right") - 1
    inside = (span >= 0) & (seps < ends[np.maximum(span, 0)])
    seps, span = seps[inside], span[inside]
    # A span of k separators holds k + 1 values: the first starts at the span's start, the
    # others after each separator; the last ends at the span's end, the others at each
    # separator. Separators come in buffer order, so span by span: they fill the places that
    # are not a span's first (or last) value, in order. No sort.
    per_span = np.bincount(span, minlength=starts.size) + 1
    total = int(per_span.sum())
    last = np.cumsum(per_span) - 1
    first = last - per_span + 1
    v_starts = np.empty(total, np.int64)
    v_ends = np.empty(total, np.int64)
    inner = np.ones(total, dtype=bool)
    inner[first] = False
    v_starts[first] = starts
    v_starts[inner] = seps + 1
    inner[first] = True
    inner[last] = False
    v_ends[last] = ends
    v_ends[inner] = seps
    bag = np.repeat(np.arange(starts.size), per_span)
    keep = v_ends > v_starts
    return v_starts[keep], v_ends[keep], bag[keep]


def jagged_ids(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, schema: Schema,
               seeds: np.ndarray, separator: int, parse_floats: Any = None) -> Jagged:
    """The ids of ``[R, S]`` sparse-field spans of ``buf`` (laid out as the module says).

    Args:
        buf: The bytes, with 8 readable bytes after the last span.
        starts, ends: int64 ``[R, S]`` span of each record's sparse fields.
        schema: Which fields carry lists, their ``max_len``, weights and overflow rule.
        seeds: uint64 ``[S]`` the fields' hash seeds (their tables').
        separator: The byte between a list's values.
        parse_floats: ``(buf, starts, ends) -> (values, ok)`` for the weights (the decoder's).
    """
    r, s = starts.shape
    specs = schema.sparse_fields
    multi = np.array([f.multi_valued for f in specs], dtype=bool)
    # Every value's record, field and span: one-value fields' whole spans, then list values.
    one_r, one_f = np.nonzero(np.broadcast_to(~multi, (r, s)))
    recs, flds, v_starts, v_ends = [one_r], [one_f], [starts[one_r, one_f]], [ends[one_r, one_f]]
    if multi.any():
        cols = np.flatnonzero(multi)
        bag_s, bag_e, bag = split_spans(buf, starts[:, cols].reshape(-1),
                                        ends[:, cols].reshape(-1), separator)
        recs.append(bag // cols.size)
        flds.append(cols[bag % cols.size])
        v_starts.append(bag_s)
        v_ends.append(bag_e)
    rec, fld = np.concatenate(recs), np.concatenate(flds)
    v_start, v_end = np.concatenate(v_starts), np.concatenate(v_ends)
    weights, weight_ok = None, None
    weighted = np.array([f.weighted for f in specs], dtype=bool)
    if weighted.any():
        if parse_floats is None:
            raise ValueError("weighted fields need a float parser")
        weights = np.ones(rec.size, np.float32)
        weight_ok = np.ones(rec.size, dtype=bool)
        wv = np.flatnonzero(weighted[fld])
        colon = _last_colon(buf, v_start[wv], v_end[wv])
        at = wv[colon >= 0]
        parsed, ok = parse_floats(buf, colon[colon >= 0] + 1, v_end[at])
        ok &= in_range(parsed)
        # Out-of-range weights are not cast (float32 would overflow): their records reject.
        weights[at], weight_ok[at] = np.where(ok, parsed, 1.0), ok
        weight_ok[wv[colon < 0]] = False  # a value of a weighted field sent without its weight
        v_end[at] = colon[colon >= 0]  # the id is what comes before the colon
    ids = hash_spans(buf, v_start, v_end, seeds[fld], slack=True)
    return arrange(rec, fld, ids, weights, weight_ok, r, schema)


def arrange(rec: np.ndarray, fld: np.ndarray, ids: np.ndarray, weights: np.ndarray | None,
            weight_ok: np.ndarray | None, records: int, schema: Schema) -> Jagged:
    """Values given as ``(record, field, id, weight)`` entries, a bag's in order, laid out
    sample-major with each field's ``max_len`` applied (truncated and counted, or the record
    marked ``too_many``); a record with a bad weight among its kept values is marked
    ``bad_weight``. Every format's decoder ends here."""
    specs = schema.sparse_fields
    s = len(specs)
    bag = rec.astype(np.int64) * s + fld
    order = np.argsort(bag, kind="stable")
    bag, ids = bag[order], ids[order]
    counts = np.bincount(bag, minlength=records * s).reshape(records, s)
    max_len = np.array([f.max_len for f in specs], np.int64)
    rejecting = np.array([f.on_overflow == "reject" for f in specs], dtype=bool)
    over = counts > max_len
    too_many = (over & rejecting).any(axis=1)
    truncated = {specs[j].name: int((counts[:, j] - max_len[j]).clip(min=0).sum())
                 for j in np.flatnonzero((over & ~rejecting).any(axis=0))}
    first = np.cumsum(counts.reshape(-1)) - counts.reshape(-1)
    kept = np.arange(bag.size) - first[bag] < max_len[bag % s]
    bad_weight = np.zeros(records, dtype=bool)
    if weight_ok is not None:
        bad = ~weight_ok[order] & kept
        bad_weight[bag[bad] // s] = True
    return Jagged(values=ids[kept], lengths=np.minimum(counts, max_len).astype(np.int32),
                  weights=None if weights is None else weights[order][kept].astype(np.float32),
                  too_many=too_many, bad_weight=bad_weight, truncated=truncated)


def in_range(values: np.ndarray) -> np.ndarray:
    """bool: which ``values`` (float64) are finite with a magnitude of at most
    :data:`MAX_MAGNITUDE`, so that float32 holds them and the sums they pool into."""
    with np.errstate(invalid="ignore"):
        return np.abs(values) <= MAX_MAGNITUDE  # False for NaN as for infinities


def _last_colon(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position of the last ``:`` in each span, -1 where there is none."""
    if starts.size == 0:
        return np.zeros(0, np.int64)
    lo, hi = int(starts.min()), int(ends.max())
    colons = lo + np.flatnonzero(buf[lo:hi] == _COLON)
    # The last colon before each span's end, if it lies inside the span.
    k = np.searchsorted(colons, ends, side="left") - 1
    found = colons[np.maximum(k, 0)] if colons.size else np.full(starts.size, -1)
    return np.where((k >= 0) & (found >= starts), found, -1)


def select_rows(jagged: Jagged, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                          np.ndarray | None]:
    """``(values, lengths, weights)`` of the records ``rows`` (sorted indices) only."""
    indptr = np.concatenate([[0], np.cumsum(jagged.lengths.sum(axis=1, dtype=np.int64))])
    positions = segment_positions(indptr, rows)
    weights = None if jagged.weights is None else jagged.weights[positions]
    return jagged.values[positions], jagged.lengths[rows], weights
