import numpy as np
import pytest

from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.streaming.window import AccessWindow, WindowConfig


def test_ring_keeps_the_last_w_samples_in_order():
    w = AccessWindow(2, WindowConfig(capacity=3, merge_every=1))
    w.add(np.array([[1, 2], [3, 4]]))
    w.add(np.array([[5, 6], [7, 8]]))
    np.testing.assert_array_equal(w.samples(), [[3, 4], [5, 6], [7, 8]])
    indptr, indices = w.csr()
    assert indptr.tolist() == [0, 2, 4, 6] and indices.tolist() == [3, 4, 5, 6, 7, 8]
    w.add(np.arange(20).reshape(10, 2))  # a batch larger than the window
    np.testing.assert_array_equal(w.samples(), [[14, 15], [16, 17], [18, 19]])


def test_counts_decay_with_the_half_life():
    w = AccessWindow(1, WindowConfig(capacity=10, half_life=2.0, merge_every=1))
    w.add(np.array([[7]]))
    w.add(np.array([[8]]))
    w.add(np.array([[8]]))
    ids, counts = w.counts()
    got = dict(zip(ids.tolist(), counts.tolist()))
    assert got[7] == pytest.approx(0.5)  # two samples ago: half
    assert got[8] == pytest.approx(1 + 2**-0.5)


def test_tracked_ids_are_capped_keeping_the_most_used():
    w = AccessWindow(1, WindowConfig(capacity=100, max_ids=3, half_life=1e9, merge_every=1))
    w.add(np.array([[1]] * 5 + [[2]] * 4 + [[3]] * 3 + [[4]] * 1 + [[5]] * 2))
    ids, _ = w.counts()
    assert ids.tolist() == [1, 2, 3]


@pytest.mark.slow
def test_memory_stays_bounded_over_a_stream_ten_times_longer_than_w():
    cfg = WindowConfig(capacity=5_000, max_ids=20_000, half_life=2_000, merge_every=2_048)
    w = AccessWindow(26, cfg)
    stream = SyntheticStream(SyntheticConfig(seed=3, drift_every=10_000))
    sizes = []
    for start in range(0, 50_000, 1_024):
        w.add(stream.feature_ids(start, 1_024))
        sizes.append(w.nbytes)
    bound = cfg.capacity * 26 * 8 + cfg.max_ids * 16 + cfg.merge_every * 2 * 26 * 8
    assert max(sizes) <= bound
    # 49 batches of 1,024 (starts 0, 1,024, ..., 49,152): every sample added is counted.
    assert len(w) == cfg.capacity and w.samples_seen == len(sizes) * 1_024 == 50_176
    ids, counts = w.counts()
    assert ids.size <= cfg.max_ids and (counts > 0).all()


def test_wrong_width_is_rejected():
    with pytest.raises(ValueError, match="shape"):
        AccessWindow(3).add(np.zeros((2, 4), np.int64))
