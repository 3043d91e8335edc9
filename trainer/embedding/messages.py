"""The messages of the row exchange: building and parsing them (pure numpy and torch).

Message layouts (int64 unless noted), per destination rank, ids sorted within each part:

* request: ``fetch ids | push ids | keep ids | counts of push | notices`` (the first four as a
  requester to the destination as owner; the notices as owner, naming the destination's copies
  that became stale);
* rows reply (float): fetched rows, then ``row | optimizer state`` of each refreshed replica;
* gradients (float): gradients of fetched rows, then the pushes (``s = 0``: gradients;
  ``s > 0``: ``summed gradient | summed optimizer-state increments``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["FETCH", "KEEP", "PUSH", "Requests", "build_requests", "parse_requests", "split_rows"]

# Kinds of a request entry: fetch a row (no copy here), push a copy's updates, keep a copy.
FETCH, PUSH, KEEP = 0, 1, 2


@dataclass
class Requests:
    """A rank's requests of one step (entries of ``order`` grouped by owner, then kind)."""

    own: np.ndarray
    order: np.ndarray
    kind: np.ndarray
    slots: np.ndarray
    owner: np.ndarray
    sent: np.ndarray
    push_counts: np.ndarray
    message: np.ndarray
    sizes: list[int]


def build_requests(uniq: np.ndarray, owner: np.ndarray, slots: np.ndarray, pending: np.ndarray,
                   s: int, notices: list[np.ndarray], me: int, world: int) -> Requests:
    """Sort a batch's non-owned ids by owner and kind, and build the request message.

    Args:
        uniq: Sorted distinct ids of the batch.
        owner: Owner of each of ``uniq``.
        slots: Replica slot of each id not owned here (``uniq[owner != me]``), -1 for none.
        pending: Updates pending at each replica slot.
        s: The staleness bound.
        notices: Per rank, the copies this rank (as owner) tells it became stale.
        me: This rank.
        world: Ranks in the job.
    """
    own = np.flatnonzero(owner == me)
    other = np.flatnonzero(owner != me)
    is_rep = slots >= 0
    kind = np.full(other.size, FETCH, dtype=np.int64)
    # A replica pushes in this step iff its pending count passes s with this step's update.
    kind[is_rep] = np.where(pending[slots[is_rep]] + 1 > s, PUSH, KEEP)
    perm = np.lexsort((kind, owner[other]))
    order, kind, slots = other[perm], kind[perm], slots[perm]
    sent = np.zeros((world, 4), dtype=np.int64)
    np.add.at(sent, (owner[order], kind), 1)
    sent[:, 3] = [n.size for n in notices]
    counts = np.zeros(order.size, dtype=np.int64)
    counts[kind == PUSH] = pending[slots[kind == PUSH]] + 1
    bounds = np.concatenate([[0], np.cumsum(sent[:, :3].sum(axis=1))])
    ids = uniq[order]
    parts, sizes = [], []
    for o in range(world):  # per rank: ids of every kind | push counts | notices
        a, b = bounds[o], bounds[o + 1]
        piece = [ids[a:b], counts[a:b][kind[a:b] == PUSH], notices[o]]
        parts += piece
        sizes.append(sum(x.size for x in piece))
    return Requests(own, order, kind, slots, owner[order], sent, counts[kind == PUSH],
                    np.concatenate(parts), sizes)


def parse_requests(received: np.ndarray, request: np.ndarray) -> tuple[list[np.ndarray], ...]:
    """Split the messages by sender: fetch ids, push ids, push counts, replica ids (push
    and keep), and notices."""
    in_fetch, in_push, in_counts, in_rep, notices = [], [], [], [], []
    pos = 0
    for n_fetch, n_push, n_keep, n_told in received:
        n_rep = n_push + n_keep
        ids = request[pos:pos + n_fetch + n_rep]
        in_fetch.append(ids[:n_fetch])
        in_push.append(ids[n_fetch:n_fetch + n_push])
        in_rep.append(ids[n_fetch:])
        pos += n_fetch + n_rep
        in_counts.append(request[pos:pos + n_push])
        pos += n_push
        notices.append(request[pos:pos + n_told])
        pos += n_told
    return in_fetch, in_push, in_counts, in_rep, notices


def split_rows(
    rows: torch.Tensor, n_fetch: np.ndarray, n_fresh: np.ndarray, dim: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the rows reply (per owner: fetched rows, then refreshed rows with state)."""
    fetched, fresh, pos = [], [], 0
    for nf, nr in zip(n_fetch, n_fresh):
        fetched.append(rows[pos:pos + nf * dim].view(-1, dim))
        pos += nf * dim
        fresh.append(rows[pos:pos + nr * width].view(-1, width))
        pos += nr * width
    return torch.cat(fetched), torch.cat(fresh)
