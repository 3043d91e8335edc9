"""The user-item shape of the synthetic stream: fields, degrees, tastes, drift, labels."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.streaming.codec import Decoder
from hetgmp.streaming.synthetic import BLOCK, SyntheticConfig, SyntheticStream

N = 120_000
DRIFT = 60_000


@pytest.fixture(scope="module")
def stream() -> SyntheticStream:
    return SyntheticStream(SyntheticConfig(seed=11, shape="user_item", drift_every=DRIFT,
                                           drift_fraction=0.5))


@pytest.fixture(scope="module")
def block(stream):
    return stream.take(0, N)


def test_same_bytes_whatever_the_slicing_and_lines_decode_to_the_ids(stream) -> None:
    again = SyntheticStream(stream.config)
    assert stream.lines(500, 2 * BLOCK) == again.lines(500, 77) + again.lines(577, 2 * BLOCK - 77)
    lines = stream.lines(0, 3_000)
    decoded = Decoder(stream.schema).decode(lines)
    assert not decoded.rejects
    np.testing.assert_array_equal(decoded.batch.ids, stream.feature_ids(0, 3_000))


def test_a_user_an_item_and_six_context_fields_by_default(stream, block) -> None:
    assert stream.config.n_sparse == 8 and SyntheticConfig().n_sparse == 26
    assert block.values.shape == (N, 8)
    assert block.values[:, 0].max() < 6_000 and block.values[:, 1].max() < 4_000
    assert (block.segment == -1).all()  # no planted communities
    with pytest.raises(ValueError, match="n_sparse >= 2"):
        SyntheticConfig(shape="user_item", n_sparse=1)
    with pytest.raises(ValueError, match="one of segments, user_item, multi_hot, user_history"):
        SyntheticConfig(shape="graph")  # type: ignore[arg-type]


def test_user_and_item_degrees_are_power_laws_with_tens_of_samples_typical(block) -> None:
    for f in (0, 1):
        _, counts = np.unique(block.values[:, f], return_counts=True)
        median = np.median(counts)
        assert 5 <= median <= 100, (f, median)
        assert counts.max() > 50 * median, (f, counts.max(), median)  # a heavy head


def test_users_return_to_their_tastes_and_keep_their_contexts(block) -> None:
    users, items, context = block.values[:, 0], block.values[:, 1], block.values[:, 2:]
    first = block.values[:DRIFT]
    # The ten most active users: their 30 most frequent items cover more than the 50% of
    # their samples that taste_prob sends to their tastes, and well more than the global top
    # 30 items cover of everyone's (46% under Zipf(1.0) over 4,000 items).
    busy = np.unique(users[:DRIFT], return_counts=True)
    top_users = busy[0][np.argsort(-busy[1])[:10]]
    cover = []
    for u in top_users:
        mine = first[first[:, 0] == u, 1]
        counts = np.unique(mine, return_counts=True)[1]
        cover.append(np.sort(counts)[::-1][:30].sum() / mine.size)
    overall = np.sort(np.unique(items[:DRIFT], return_counts=True)[1])[::-1][:30].sum() / DRIFT
    assert min(cover) > 0.55 and np.mean(cover) > overall + 0.15, (cover, overall)
    # A context field holds the user's own value about 80% of the time.
    u = top_users[0]
    theirs = context[users == u, 0]
    assert np.unique(theirs, return_counts=True)[1].max() / theirs.size > 0.7


def test_drift_gives_users_new_tastes(stream, block) -> None:
    users, items = block.values[:, 0], block.values[:, 1]
    changed = 0
    busy = np.unique(users, return_counts=True)
    for u in busy[0][np.argsort(-busy[1])[:40]]:
        before = set(items[:DRIFT][users[:DRIFT] == u])
        after = items[DRIFT:][users[DRIFT:] == u]
        changed += np.isin(after, list(before)).mean() < 0.6
    assert 8 <= changed <= 32  # drift_fraction 0.5: about half of the users


def test_taste_items_click_more_and_the_ceiling_is_learnable(stream, block) -> None:
    assert 0.1 < block.labels.mean() < 0.6
    assert stream.ceiling_auc(0, N) > 0.7
