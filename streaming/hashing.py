"""Stable 64-bit feature ids: ``id = H(field name, value bytes)``.

Every process, every run and every machine must map the same (field, value) to the same id, so
this never touches Python's salted ``hash()``. The function is defined once, as the scalar
reference :func:`feature_id`, and computed in bulk by :func:`hash_spans`, which is what the
decoders use: it hashes many byte spans of one buffer with numpy, eight bytes per step, with no
Python loop over records or fields.

Definition (all arithmetic modulo 2**64)::

    h = fmix64(fnv1a64(field_name)) ^ (len(value) * GOLDEN)
    for each little-endian 8-byte word w of value (zero padded):  h = fmix64(h ^ w)
    id = h & (2**63 - 1)

The field seed is already mixed, so an empty value needs no final round; every word gets one.

``fmix64`` is MurmurHash3's 64-bit finaliser. Ids are non-negative so that callers can use
negative numbers as sentinels.
"""

from __future__ import annotations

import numpy as np

from hetgmp.runtime import fmix64, fmix64_int

__all__ = ["ID_MASK", "feature_id", "field_seed", "field_seeds", "hash_spans"]

_M64 = (1 << 64) - 1
ID_MASK = (1 << 63) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def field_seed(field: str) -> int:
    """The per-field seed: fmix64 of the FNV-1a hash of the field name's UTF-8 bytes."""
    h = _FNV_OFFSET
    for b in field.encode("utf-8"):
        h = ((h ^ b) * _FNV_PRIME) & _M64
    return fmix64_int(h)


def field_seeds(fields: tuple[str, ...] | list[str]) -> np.ndarray:
    """Seeds of several fields as a uint64 array."""
    return np.array([field_seed(f) for f in fields], dtype=np.uint64)


def feature_id(field: str, value: bytes | str) -> int:
    """Reference (scalar) feature id of ``value`` in ``field``; :func:`hash_spans` agrees with it."""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    h = field_seed(field) ^ ((len(data) * _GOLDEN) & _M64)
    padded = data + b"\0" * (-len(data) % 8)
    for i in range(0, len(padded), 8):
        h = fmix64_int(h ^ int.from_bytes(padded[i : i + 8], "little"))
    return h & ID_MASK


# Spans longer than this are hashed in a second pass restricted to them, so that one long value
# does not widen the gather matrix for every span of the batch.
_WIDE = 32


def hash_spans(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    seeds: np.ndarray,
    *,
    slack: bool = False,
) -> np.ndarray:
    """Feature ids of many byte spans of one buffer.

    Args:
        buf: uint8 array holding the bytes.
        starts: int64 array (any shape) of span starts into ``buf``.
        ends: int64 array, same shape, of span ends (exclusive).
        seeds: uint64 field seeds, broadcastable to ``starts`` (typically shape ``(F,)`` for spans
            of shape ``(B, F)``).
        slack: the caller guarantees 7 readable bytes after the last span (saves copying ``buf``).

    Returns:
        int64 array of ids, same shape as ``starts``.
    """
    shape = starts.shape
    starts = np.ascontiguousarray(starts, dtype=np.int64).ravel()
    ends = np.ascontiguousarray(ends, dtype=np.int64).ravel()
    lengths = ends - starts
    seeds_flat = np.broadcast_to(seeds.astype(np.uint64), shape).ravel()
    with np.errstate(over="ignore"):
        h = seeds_flat ^ (lengths.astype(np.uint64) * np.uint64(_GOLDEN))
    if lengths.size == 0:
        return np.zeros(shape, dtype=np.int64)
    # An 8-byte gather at a span's last word may read past it: make sure those bytes exist.
    padded = buf if slack else np.concatenate([buf, np.zeros(8, dtype=np.uint8)])
    max_len = int(lengths.max())
    narrow_words = (min(max_len, _WIDE) + 7) // 8
    h = _mix_words(padded, starts, lengths, h, 0, narrow_words)
    if max_len > _WIDE:
        wide = np.flatnonzero(lengths > _WIDE)
        wide_words = (max_len + 7) // 8
        h[wide] = _mix_words(padded, starts[wide], lengths[wide], h[wide], narrow_words, wide_words)
    h &= np.uint64(ID_MASK)
    return h.view(np.int64).reshape(shape)


def _mix_words(
    padded: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    h: np.ndarray,
    first_word: int,
    last_word: int,
) -> np.ndarray:
    """Fold words ``first_word..last_word-1`` of each span into ``h`` (spans shorter skip them)."""
    # An unaligned little-endian uint64 view at every byte offset: one gather reads a whole word.
    words_at = np.ndarray(shape=(padded.size - 7,), dtype="<u8", buffer=padded.data, strides=(1,))
    h = h.copy()
    for w in range(first_word, last_word):
        remaining = lengths - w * 8
        if remaining.min() > 0:
            active = None  # every span still has bytes here: skip the index arithmetic
            rem, pos = remaining, starts
        else:
            active = np.flatnonzero(remaining > 0)
            if active.size == 0:
                break
            rem, pos = remaining[active], starts[active]
        word = words_at[pos + w * 8].astype(np.uint64)
        if rem.min() < 8:
            # Bytes past the span's end count as zero padding, whatever the buffer holds there.
            keep = np.minimum(rem, 8).astype(np.uint64) * np.uint64(8)
            mask = np.where(
                keep >= 64, np.uint64(_M64), (np.uint64(1) << (keep & np.uint64(63))) - np.uint64(1)
            )
            word &= mask
        if active is None:
            h ^= word
            fmix64(h, inplace=True)
        else:
            h[active] = fmix64(h[active] ^ word)
    return h
