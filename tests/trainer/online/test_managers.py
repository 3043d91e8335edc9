"""The online loop's small parts alone: control vector, record budget, drift detector, freshness
histogram, window feed (on threads)."""

from __future__ import annotations

import numpy as np
import pytest

from hetgmp.partitioner import Placement, plan_diff
from hetgmp.streaming import ClickBatch
from hetgmp.trainer.dist import KINDS, ThreadComm, run_threads
from hetgmp.trainer.online.budget import RecordBudget
from hetgmp.trainer.online.control import Proposal, agree, combine, decode, encode, width
from hetgmp.trainer.online.drift import BASELINE_STEPS, DriftDetector
from hetgmp.trainer.online.migration import plan_of_words, plan_words, relay_broadcast
from hetgmp.trainer.online.stats import FreshnessHistogram
from hetgmp.trainer.online.window import WindowFeed, pack, unpack


def test_the_control_vector_sums_proposals_into_one_decision() -> None:
    world = 3
    a = Proposal(stop=True, records=5, rows_not_held=7, samples=4, window=2, rows_owned=10,
                 newest_ms=1_000, embedding_bytes=900, loop_bytes=40, hash_rows=100)
    b = Proposal(repartition=True, ready=True, checkpoint=True, records=1, samples=6,
                 rows_owned=30, newest_ms=3_000, embedding_bytes=50, behind=True)
    c = Proposal(diverged=True, publish=True, window=9, hash_rows=7, behind=True)
    v = combine([encode(a), encode(b), encode(c)])
    assert v.shape == (width(),) == (18,)
    ctl = decode(v, world)
    assert (ctl.stop, ctl.repartition, ctl.ready, ctl.checkpoint, ctl.diverged,
            ctl.publish) == (True, True, True, True, True, True)
    assert ctl.newest_ms == 3_000  # the newest over ranks, not a sum
    assert (ctl.records, ctl.rows_not_held, ctl.samples) == (6, 7, 10)
    assert (ctl.embedding_bytes, ctl.loop_bytes, ctl.hash_rows) == (950, 40, 107)
    assert ctl.behind == 2  # ranks not caught up with their log
    assert ctl.window_words == 11
    assert ctl.sample_imbalance == pytest.approx(6 / (10 / 3))
    assert ctl.row_imbalance == pytest.approx(30 / (40 / 3))
    assert decode(np.zeros(width(), np.int64), world).sample_imbalance is None
    nothing = combine([encode(Proposal()) for _ in range(world)])
    assert decode(nothing, world).newest_ms == -1  # no rank read a timed record
    with pytest.raises(ValueError, match="has 18 values"):
        decode(np.zeros(5, np.int64), 2)


def _agree(comm: ThreadComm, _: None) -> tuple[object, int]:
    p = Proposal(samples=10 + comm.rank, rows_owned=100 * (comm.rank + 1), window=comm.rank,
                 newest_ms=-1 if comm.rank else 5, records=1)
    ctl = agree(comm, p)
    return ctl, int(comm.traffic.sent[KINDS.index("control")])


@pytest.mark.parametrize("world", [2, 8])
def test_the_control_round_combines_over_ranks_and_its_size_does_not_grow_with_them(
        world: int) -> None:
    out = run_threads(_agree, None, world)
    ctl = out[0][0]
    assert all(c == ctl for c, _ in out)  # every rank decided the same
    assert (ctl.records, ctl.samples, ctl.window_words) == (world, sum(10 + r for r in range(world)),
                                                             sum(range(world)))
    assert ctl.newest_ms == 5
    assert ctl.sample_imbalance == pytest.approx((9 + world) * world / ctl.samples)
    assert ctl.row_imbalance == pytest.approx(100 * world * world / (50 * world * (world + 1)))
    # Each rank sends its 18 values to each other rank: the vector does not grow with them.
    assert {b for _, b in out} == {18 * 8 * (world - 1)}


def test_the_record_budget_caps_every_rank_and_ends_the_run() -> None:
    budgets = [RecordBudget(1001, r, 3, records=1) for r in range(3)]
    caps = [b.read_cap() for b in budgets]
    assert sum(caps) == 1000 and max(caps) - min(caps) <= 1  # type: ignore[type-var]
    for b in budgets:
        b.count(1000)
    assert all(b.spent and b.read_cap() == 0 for b in budgets)
    assert RecordBudget(0, 0, 2).read_cap() is None and not RecordBudget(0, 0, 2).spent


def test_a_runs_own_budget_counts_from_where_it_resumed_and_the_jobs_still_bounds_it() -> None:
    # --records 100 on a run resumed at 50 records: 100 more, shared by the ranks.
    run = [RecordBudget(0, r, 2, records=50, run_limit=100) for r in range(2)]
    assert sum(b.read_cap() or 0 for b in run) == 100
    for b in run:
        b.count(60)
    assert sum(b.read_cap() or 0 for b in run) == 40 and not run[0].spent
    for b in run:
        b.count(40)
    assert all(b.spent for b in run)
    # --max-records 120 over the job as well: 70 left of it, fewer than the run's 100.
    both = [RecordBudget(120, r, 2, records=50, run_limit=100) for r in range(2)]
    assert sum(b.read_cap() or 0 for b in both) == 70


def test_drift_is_a_rise_over_the_baseline_of_a_settled_placement() -> None:
    d = DriftDetector(threshold=0.25)
    for _ in range(BASELINE_STEPS):
        d.observe(1.0, settled=False)  # a migration in progress: no baseline yet
    assert d.baseline is None and not d.drifted()
    for _ in range(BASELINE_STEPS):
        d.observe(1.0, settled=True)
    assert d.baseline == pytest.approx(1.0) and not d.drifted()
    for _ in range(4):
        d.observe(1.2, settled=True)  # under the threshold
    assert not d.drifted()
    for _ in range(20):
        d.observe(2.0, settled=True)
    assert d.drifted() and d.rise > 0.25
    d.reset()
    assert d.baseline is None and not d.drifted()
    assert not DriftDetector(0.0).drifted()


def test_freshness_percentiles_stay_close_in_bounded_memory() -> None:
    rng = np.random.default_rng(1)
    values = rng.lognormal(mean=-1.0, sigma=1.5, size=200_000)
    h = FreshnessHistogram()
    for chunk in np.array_split(values, 50):
        h.add(chunk)
    assert h.count == values.size
    for q in (50, 90, 99):
        assert h.percentile(q) == pytest.approx(np.percentile(values, q), rel=0.03), q
    assert h.counts.nbytes < 8 * 400  # the same size whatever was counted
    assert np.isnan(FreshnessHistogram().percentile(50))


def _samples(ids: np.ndarray) -> ClickBatch:
    n = ids.shape[0]
    return ClickBatch.of_ids(np.zeros(n, np.float32), np.zeros((n, 1), np.float32), ids)


def _feed(comm: ThreadComm, _: None) -> tuple[list[int], list[np.ndarray]]:
    feed = WindowFeed(comm, fields=2, window=25)
    held = []
    for step in range(6):
        ids = np.full((4, 2), 100 * comm.rank + step)
        ids[:, 1] = 7 * np.arange(4) + 1_000 * comm.rank + step
        dest = np.array([0, 1, 1, 0])  # rank 1's samples 0 and 3 were routed to rank 0
        routed_in = np.full((2, 2), -1) if comm.rank == 0 else np.zeros((0, 2), np.int64)
        feed.offer(_samples(ids), _samples(routed_in), dest if comm.rank else None)
        feed.exchange()
        held.append(feed.held)
    return held, feed.take()


def test_the_window_feed_brings_each_sample_to_rank_0_once_and_trims() -> None:
    (held0, parts), (held1, _) = run_threads(_feed, None, 2)
    # Per step rank 0 keeps its 4 samples, the 2 routed to it, and rank 1's other 2.
    assert held0[:3] == [8, 16, 24]
    assert all(h < 25 + 8 for h in held0) and held0[-1] >= 25
    assert held1 == [0] * 6
    # Rank 1's samples arrive whole and in their order (packed on the way), the last step's
    # two after rank 0's own.
    indptr, got = parts[-1]
    assert indptr.tolist() == [0, 2, 4] and got.tolist() == [105, 1012, 105, 1019]


@pytest.mark.parametrize("distinct", [1, 300, 70_000])
def test_a_packed_window_message_holds_the_ids_and_is_smaller(distinct: int) -> None:
    rng = np.random.default_rng(distinct)
    ids = rng.integers(-2**63, 2**63 - 1, distinct, dtype=np.int64)[
        rng.integers(0, distinct, (40_000, 26))]
    indptr = np.arange(ids.shape[0] + 1, dtype=np.int64) * 26
    message = pack((indptr, ids.reshape(-1)), 26)
    back_indptr, back = unpack(message, 26)
    assert np.array_equal(back_indptr, indptr) and np.array_equal(back, ids.reshape(-1))
    # 16-bit positions up to 65,536 distinct ids, 32-bit past: a quarter or half of the ids';
    # samples of one id a field need no lengths.
    positions = 2 if distinct <= 1 << 16 else 4
    assert message.nbytes == 24 + 8 * np.unique(ids).size + ids.size * positions
    empty = unpack(pack((indptr[:1], ids[:0].reshape(-1)), 26), 26)
    assert pack((indptr[:1], ids[:0].reshape(-1)), 26).size == 0 and empty[0].tolist() == [0]


def test_a_packed_window_message_carries_samples_of_any_length() -> None:
    rng = np.random.default_rng(3)
    sizes = rng.integers(0, 60, 1_001)  # lists, empty ones among them
    indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = rng.integers(0, 5_000, int(indptr[-1]), dtype=np.int64)
    back_indptr, back = unpack(pack((indptr, ids), 26), 26)
    assert np.array_equal(back_indptr, indptr) and np.array_equal(back, ids)


def _placement(version: int, seed: int, workers: int = 4) -> Placement:
    ids = np.unique(np.random.default_rng(12).integers(0, 10**9, 5_000))
    r = np.random.default_rng(seed)
    chosen = np.sort(r.choice(ids, 3_000, replace=False))
    owners = r.integers(0, workers, chosen.size)
    p = Placement(version, workers, chosen, owners, tuple(ids[:0] for _ in range(workers)))
    owner_of = p.owner_of(ids)
    reps = tuple(np.sort(r.choice(ids[owner_of != w], 200, replace=False))
                 for w in range(workers))
    return Placement(version, workers, chosen, owners, reps)


def test_a_placement_sent_as_its_table_changes_is_rebuilt_exactly() -> None:
    old, new = _placement(3, 1), _placement(4, 2)
    words = plan_words(plan_diff(old, new, 96))
    assert words.dtype == np.int64
    assert plan_of_words(words, old, 4, 96).apply(old) == new
    # Ids 8 bytes, owners 2: the row moves do not travel.
    diff = plan_diff(old, new, 96)
    lists = (diff.assign_ids.size + diff.release_ids.size
             + sum(a.size for a in (*diff.replica_adds, *diff.replica_drops)))
    assert words.size == 2 + 2 * 4 + lists + -(-diff.assign_ids.size // 4)
    # Nothing changed: nothing but the counts travels.
    same = plan_words(plan_diff(new, new.with_version(5), 96))
    assert not same.any() and same.size == 10
    assert plan_of_words(same, new, 5, 96).apply(new) == new.with_version(5)


def _relay(comm: ThreadComm, words: np.ndarray) -> tuple[np.ndarray, int, int]:
    got = relay_broadcast(comm, words if comm.rank == 0 else words[:0], words.size, "placement")
    at = KINDS.index("placement")
    return got, int(comm.traffic.sent[at]), int(comm.traffic.received[at])


@pytest.mark.parametrize("world", [2, 8])
def test_the_relay_broadcast_gives_every_rank_rank_0s_words_and_spares_rank_0(
        world: int) -> None:
    old, new = _placement(3, 1, world), _placement(4, 2, world)
    words = plan_words(plan_diff(old, new, 96))
    out = run_threads(_relay, words, world)
    assert all(np.array_equal(got, words) for got, _, _ in out)
    assert all(plan_of_words(got, old, 4, 96).apply(old) == new for got, _, _ in out)
    sent = [s for _, s, _ in out]
    assert sum(sent) == sum(r for _, _, r in out)  # what was sent was received
    # Rank 0 sends each other rank its slice, then its own slice to each: under 2 copies.
    assert sent[0] < 2 * words.nbytes
    assert sum(sent) < (world + 1) * words.nbytes
