import numpy as np
import pytest

from hetgmp.streaming.codec import Decoder
from hetgmp.streaming.synthetic import BLOCK, SyntheticConfig, SyntheticStream, auc

N = 60_000


@pytest.fixture(scope="module")
def stream() -> SyntheticStream:
    return SyntheticStream(SyntheticConfig(seed=7, drift_every=30_000))


def test_same_seed_same_bytes_whatever_the_slicing(stream):
    again = SyntheticStream(SyntheticConfig(seed=7, drift_every=30_000))
    whole = stream.lines(1000, 2 * BLOCK)
    pieces = again.lines(1000, 123) + again.lines(1123, 2 * BLOCK - 123)
    assert whole == pieces
    other = SyntheticStream(SyntheticConfig(seed=8, drift_every=30_000)).lines(1000, 50)
    assert other != whole[:50]


def test_rendered_lines_decode_to_the_generators_feature_ids(stream):
    lines = stream.lines(0, 5000)
    decoded = Decoder(stream.schema).decode(lines)
    assert not decoded.rejects
    np.testing.assert_array_equal(decoded.batch.ids, stream.feature_ids(0, 5000))
    block = stream.take(0, 5000)
    np.testing.assert_array_equal(decoded.batch.labels, block.labels)


def test_popularity_is_skewed(stream):
    ids = stream.feature_ids(0, N)
    _, counts = np.unique(ids, return_counts=True)
    counts = np.sort(counts)[::-1]
    top = counts[: counts.size // 100].sum() / counts.sum()
    # The top 1% of distinct ids carry a large share of all accesses (uniform would be ~1%).
    assert top > 0.3


def test_samples_of_one_segment_share_ids(stream):
    # Locality: each large segment has ids of its own (used far more per sample inside it than
    # outside, judged on the first half), and they cover a large share of the segment's later
    # accesses but little of other segments'.
    n = 20_000
    block = stream.take(0, n)
    ids = stream.feature_ids(0, n)
    half = n // 2
    big = [s for s, c in zip(*np.unique(block.segment[:half], return_counts=True)) if c >= 300]
    assert len(big) >= 3
    for seg in big[:5]:
        mine = block.segment == seg
        u_in, c_in = np.unique(ids[:half][mine[:half]], return_counts=True)
        u_out, c_out = np.unique(ids[:half][~mine[:half]], return_counts=True)
        rate_in = c_in / mine[:half].sum()
        out = np.zeros_like(rate_in)
        pos = np.searchsorted(u_out, u_in).clip(max=u_out.size - 1)
        hit = u_out[pos] == u_in
        out[hit] = c_out[pos[hit]] / (~mine[:half]).sum()
        own = u_in[(c_in >= 3) & (rate_in > 5 * out)]
        cover = np.isin(ids[half:], own).mean(axis=1)
        assert cover[mine[half:]].mean() > 0.3
        assert cover[~mine[half:]].mean() < 0.1


def test_drift_changes_a_fifth_of_the_segments_hot_sets(stream):
    hot0, order0 = stream._epoch(0)
    hot1, order1 = stream._epoch(1)
    changed = (hot0 != hot1).any(axis=(1, 2))
    assert changed.sum() == round(0.2 * stream.config.segments)
    assert not np.array_equal(order0, order1)
    # And it shows in the data: ids used before the drift lose a measurable share after it.
    before = stream.feature_ids(20_000, 10_000)
    after = stream.feature_ids(30_000, 10_000)
    later_same_epoch = stream.feature_ids(40_000, 10_000)
    overlap = lambda x, y: np.isin(y, np.unique(x)).mean()  # noqa: E731
    assert overlap(before, after) < overlap(after, later_same_epoch) - 0.02


@pytest.mark.slow
def test_labels_follow_the_ground_truth_and_the_ceiling_is_reported(stream):
    block = stream.take(0, N)
    ceiling = stream.ceiling_auc(0, N)
    assert ceiling == pytest.approx(auc(block.labels, block.prob))
    assert 0.7 < ceiling < 0.99
    assert 0.15 < block.labels.mean() < 0.4
    # Learnable from the features: per-id click rates (fit on the first half) rank the second half.
    ids = stream.feature_ids(0, N)
    half = N // 2
    uniq, inv = np.unique(ids, return_inverse=True)
    inv = inv.reshape(ids.shape)
    clicks = np.bincount(
        inv[:half].ravel(), weights=np.repeat(block.labels[:half], ids.shape[1]), minlength=uniq.size
    )
    seen = np.bincount(inv[:half].ravel(), minlength=uniq.size)
    prior = block.labels[:half].mean()
    rate = (clicks + 10 * prior) / (seen + 10)
    logit = np.log(rate / (1 - rate)) - np.log(prior / (1 - prior))
    score = logit[inv[half:]].sum(axis=1)
    learned = auc(block.labels[half:], score)
    assert 0.6 < learned < ceiling


def test_auc_of_perfect_random_and_tied_scores():
    y = np.array([0, 0, 1, 1])
    assert auc(y, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert auc(y, np.array([0.9, 0.8, 0.2, 0.1])) == 0.0
    assert auc(y, np.ones(4)) == 0.5
    assert np.isnan(auc(np.ones(3), np.arange(3.0)))


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        SyntheticConfig(hot_prob=1.5)
    with pytest.raises(ValueError):
        SyntheticConfig(vocab_min=10, vocab_max=5)
