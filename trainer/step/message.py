"""The routed samples' message: a rank's samples for each other rank, as int64 words.

A one-value schema's samples travel as ``[B, S + W]`` rows (ids, then label and dense
features as float32 bits; :func:`pack_ids`). A schema with lists sends each rank one block
(:func:`pack_lists`): the floats, the lengths in the narrowest width that holds them, the
distinct values with each value's position among them, the weights. Blocks read back alone,
so the receiver takes each source's block by its size in words (:func:`unpack_lists`).
"""

from __future__ import annotations

import numpy as np

from hetgmp.streaming import ClickBatch

__all__ = ["as_words", "compact_ids", "expand_ids", "from_words", "pack_ids", "pack_lists",
           "unpack_ids", "unpack_lists"]


def _floats(batch: ClickBatch) -> np.ndarray:
    """int64 ``[B, W]``: each sample's labels and dense features, float32 bits two a word."""
    labels = batch.labels if batch.labels.ndim == 2 else batch.labels[:, None]
    floats = np.concatenate([labels, batch.dense], axis=1).astype(np.float32)
    return _words(floats)


def _words(columns: np.ndarray) -> np.ndarray:
    """A ``[B, K]`` array of 4-byte values as int64 ``[B, ceil(K / 2)]`` (padded with zeros)."""
    if columns.shape[1] % 2:
        columns = np.concatenate([columns, np.zeros((columns.shape[0], 1), columns.dtype)], axis=1)
    return np.ascontiguousarray(columns).view(np.int64)


def pack_ids(batch: ClickBatch) -> np.ndarray:
    """A one-value batch as int64 ``[B, S + W]``: ids, then the floats (routing message)."""
    return np.ascontiguousarray(np.concatenate([batch.ids, _floats(batch)], axis=1))


def unpack_ids(packed: np.ndarray, n_fields: int, n_dense: int, n_labels: int = 1
               ) -> ClickBatch:
    """The samples of :func:`pack_ids` rows (from any number of ranks, one after the other)."""
    ids = np.ascontiguousarray(packed[:, :n_fields])
    floats = np.ascontiguousarray(packed[:, n_fields:]).view(np.float32)
    return ClickBatch.of_ids(_labels(floats, n_labels),
                             floats[:, n_labels:n_labels + n_dense].copy(), ids)


def _labels(floats: np.ndarray, n_labels: int) -> np.ndarray:
    """The labels of unpacked float rows: ``[B]`` for one, ``[B, T]`` for several."""
    return (floats[:, 0] if n_labels == 1 else floats[:, :n_labels]).copy()


def _pack_block(batch: ClickBatch, weighted: bool) -> np.ndarray:
    """A batch with lists as one int64 message, in parts a word aligned:

    - each sample's floats, ``[B, W]`` (labels and dense features, float32 two a word);
    - the byte width of the lengths (1, 2 or 4: the narrowest that holds the longest), then
      the lengths ``[B, S]`` in it;
    - the values, compact (:func:`compact_ids`: the distinct ones and positions among them);
    - the weights (float32) when ``weighted``.

    A block of consecutive samples reads back alone (:func:`unpack_lists`)."""
    longest = int(batch.lengths.max()) if batch.lengths.size else 0
    width = 1 if longest < 1 << 8 else 2 if longest < 1 << 16 else 4
    narrow = batch.lengths.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[width])
    parts = [_floats(batch).reshape(-1), np.array([width], np.int64), as_words(narrow),
             compact_ids(batch.values)]
    if weighted:
        parts.append(as_words(batch.value_weights()))
    return np.concatenate(parts)


def as_words(values: np.ndarray) -> np.ndarray:
    """The bytes of ``values`` as int64 words (zero padded)."""
    raw = np.ascontiguousarray(values).tobytes()
    return np.frombuffer(raw + b"\0" * (-len(raw) % 8), np.int64)


def from_words(words: np.ndarray, at: int, dtype: type, count: int) -> tuple[np.ndarray, int]:
    """``count`` values of ``dtype`` packed by :func:`as_words` from word ``at``, and the word
    after them."""
    used = -(-count * np.dtype(dtype).itemsize // 8)
    return np.ascontiguousarray(words[at:at + used]).view(dtype)[:count], at + used


def compact_ids(ids: np.ndarray) -> np.ndarray:
    """int64 ids as words: the number ``u`` of distinct ones, the ``u`` ids, then each id's
    position among them (uint16, or uint32 past 65,536). A batch repeats hot rows, so this is
    2-4x smaller than the ids (:func:`expand_ids` reads it back)."""
    distinct, inverse = np.unique(ids, return_inverse=True)
    positions = inverse.reshape(-1).astype(_position_type(distinct.size))
    return np.concatenate([np.array([distinct.size], np.int64), distinct, as_words(positions)])


def expand_ids(words: np.ndarray, at: int, count: int) -> tuple[np.ndarray, int]:
    """The ``count`` ids :func:`compact_ids` wrote from word ``at``, and the word after them."""
    u = int(words[at])
    distinct = words[at + 1:at + 1 + u]
    positions, end = from_words(words, at + 1 + u, _position_type(u), count)
    return distinct[positions], end


def _position_type(distinct: int) -> type[np.unsignedinteger]:
    return np.uint16 if distinct <= 1 << 16 else np.uint32


def pack_lists(batch: ClickBatch, counts: np.ndarray, weighted: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pack_block` of each rank's consecutive ``counts`` samples, one after the other:
    the message and the words of each rank's block."""
    bounds = np.concatenate([[0], np.cumsum(counts)])
    blocks = [_pack_block(batch.take(slice(int(lo), int(hi))), weighted)
              for lo, hi in zip(bounds[:-1], bounds[1:])]
    return np.concatenate(blocks), np.array([b.size for b in blocks], np.int64)


def unpack_lists(words: np.ndarray, samples: np.ndarray, sizes: np.ndarray, n_fields: int,
                 n_dense: int, weighted: bool, n_labels: int = 1) -> ClickBatch:
    """The batch of the blocks of ``words``: block ``i`` holds ``samples[i]`` samples in
    ``sizes[i]`` words (each as :func:`_pack_block` wrote it)."""
    fwords = -(-(n_labels + n_dense) // 2)
    parts, start = [], 0
    for n, size in zip(samples.tolist(), sizes.tolist()):
        block = words[start:start + size]
        start += size
        floats = np.ascontiguousarray(block[:n * fwords]).reshape(n, fwords).view(np.float32)
        at = n * fwords
        width = int(block[at])
        narrow, at = from_words(block, at + 1, {1: np.uint8, 2: np.uint16, 4: np.uint32}[width],
                                n * n_fields)
        lengths = narrow.astype(np.int32).reshape(n, n_fields)
        nnz = int(lengths.sum())
        values, at = expand_ids(block, at, nnz)
        weights = from_words(block, at, np.float32, nnz)[0].copy() if weighted else None
        parts.append(ClickBatch(labels=_labels(floats, n_labels),
                                dense=floats[:, n_labels:n_labels + n_dense].copy(),
                                values=values, lengths=lengths,
                                partitions=np.full(n, -1, np.int32),
                                offsets=np.full(n, -1, np.int64),
                                timestamps_ms=np.full(n, -1, np.int64), weights=weights))
    return ClickBatch.concat(parts)
