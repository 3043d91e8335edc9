"""The row exchange's messages alone: what a requester builds is what an owner parses."""

from __future__ import annotations

import numpy as np
import torch

from trainer.embedding.messages import FETCH, KEEP, PUSH, build_requests, parse_requests, split_rows


def test_requests_are_grouped_by_owner_and_kind_and_parse_back() -> None:
    me, world, s = 1, 3, 2
    uniq = np.array([10, 11, 12, 13, 14, 15, 16, 17])
    owner = np.array([0, 1, 2, 0, 2, 0, 1, 2])
    # Slots of the ids not owned here (10, 12, 13, 14, 15, 17): -1 = no copy.
    slots = np.array([0, 1, 2, -1, 3, -1])
    pending = np.array([2, 0, 1, 5])  # copies 0 and 3 pass s with this step's update
    notices = [np.array([90]), np.zeros(0, np.int64), np.array([91, 92])]
    req = build_requests(uniq, owner, slots, pending, s, notices, me, world)
    assert uniq[req.own].tolist() == [11, 16]
    # Owner 0: 10 and 15 push (copies 0 and 3), 13 keeps (copy 2); owner 2: 12 keeps, 14 and
    # 17 have no copy here and are fetched.
    by = {(int(o), int(k)): sorted(uniq[req.order[(req.owner == o) & (req.kind == k)]].tolist())
          for o in range(world) for k in (FETCH, PUSH, KEEP)}
    assert by[(0, PUSH)] == [10, 15] and by[(0, KEEP)] == [13] and by[(0, FETCH)] == []
    assert by[(2, FETCH)] == [14, 17] and by[(2, KEEP)] == [12]
    assert req.sent.tolist() == [[0, 2, 1, 1], [0, 0, 0, 0], [2, 0, 1, 2]]
    assert req.push_counts.tolist() == [3, 6]  # pending + this step's update
    assert sum(req.sizes) == req.message.size
    # The owners' side: each owner parses the part sent to it.
    bounds = np.concatenate([[0], np.cumsum(req.sizes)])
    for dest in (0, 2):
        received = np.zeros((world, 4), np.int64)
        received[me] = req.sent[dest]
        part = req.message[bounds[dest]:bounds[dest + 1]]
        fetch, push, counts, rep, told = (x[me] for x in parse_requests(received, part))
        assert sorted(fetch.tolist()) == by[(dest, FETCH)]
        assert sorted(push.tolist()) == by[(dest, PUSH)]
        assert sorted(rep.tolist()) == sorted(by[(dest, PUSH)] + by[(dest, KEEP)])
        assert told.tolist() == notices[dest].tolist()
        assert counts.size == push.size


def test_the_rows_reply_splits_into_fetched_and_refreshed_rows() -> None:
    dim, width = 2, 3
    # Owner 0: one fetched row, one refreshed (row | state); owner 1: two fetched, none fresh.
    rows = torch.arange(1 * dim + 1 * width + 2 * dim, dtype=torch.float64)
    fetched, fresh = split_rows(rows, np.array([1, 2]), np.array([1, 0]), dim, width)
    assert fetched.tolist() == [[0, 1], [5, 6], [7, 8]]
    assert fresh.tolist() == [[2, 3, 4]]
