"""HET-GMP's partitioner as its paper describes it (bench/hetgmp_paper.py): a hand-checked
tiny case, descent of its passes, and its rows in ``hetgmp bench partition``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.partition import main
from hetgmp.partitioner import PartitionConfig, WindowGraph
from hetgmp.partitioner.hetgmp import (
    PaperPasses,
    PaperSettings,
    paper_cost,
    paper_partition,
    paper_replicas,
    replica_priority,
    soft_table,
)

# The tiny case: 6 samples, ids 10..14 (compact 0..4), 2 workers, a global batch of 4, so
# b = 2 samples a worker batch and M = 6 / 2 = 3 samples a worker.
#   soft(c) = (M/b)(1 - (1 - c/M)^b) = 1.5 (1 - (1 - c/3)^2):
#   soft(0) = 0, soft(1) = 1.5 * 5/9 = 5/6, soft(2) = 1.5 * 8/9 = 4/3, soft(3) = 1.5.
SAMPLES = [[10, 11], [10, 11], [11, 12],          # on worker 0
           [10, 13], [10, 13, 14], [12, 13]]      # on worker 1
WORKER = np.array([0, 0, 0, 1, 1, 1])
OWNER = np.array([0, 0, 1, 1, 0])                 # ids 10, 11, 14 on worker 0; 12, 13 on 1
# Uses of each id (rows) by each worker's samples (columns), counted by hand:
COUNTS = np.array([[2, 2],    # 10: s0, s1 | s3, s4   (degree 4)
                   [3, 0],    # 11: s0, s1, s2        (degree 3)
                   [1, 1],    # 12: s2 | s5           (degree 2)
                   [0, 3],    # 13: s3, s4, s5        (degree 3)
                   [0, 1]])   # 14: s4                (degree 1)
SOFT = {0: 0.0, 1: 5 / 6, 2: 4 / 3, 3: 1.5}


def _window() -> WindowGraph:
    indptr = np.cumsum([0] + [len(s) for s in SAMPLES])
    return WindowGraph(indptr, np.concatenate([np.array(s) for s in SAMPLES]))


def _passes(settings: PaperSettings | None = None) -> PaperPasses:
    window = _window()
    entry_id = window.indices - 10  # compact ids 0..4
    passes = PaperPasses(window.indptr, entry_id, 5, 2, batch_per_worker=2,
                         settings=settings or PaperSettings())
    passes.place(WORKER, OWNER)
    return passes


def test_soft_count_and_cost_of_the_tiny_case_match_the_hand_computation() -> None:
    soft = soft_table(4, 3.0, 2.0)
    assert soft[:4] == pytest.approx([SOFT[c] for c in range(4)])
    assert soft[4] == pytest.approx(1.5)  # counts above M count as M: every batch
    passes = _passes()
    assert np.array_equal(passes.counts, COUNTS)
    # Each id costs the soft counts of the workers that do not own it:
    #   10 (owner 0): worker 1 uses it twice, soft(2) = 4/3
    #   11 (owner 0): worker 1 never, 0;   13 (owner 1): worker 0 never, 0
    #   12 (owner 1): worker 0 once, 5/6;  14 (owner 0): worker 1 once, 5/6
    # total 4/3 + 5/6 + 5/6 = 3.
    assert paper_cost(COUNTS, OWNER, soft) == pytest.approx(3.0)
    assert passes.objective()["cost"] == pytest.approx(3.0)
    # HET-GMP's communication matrix weighs a same-machine owner 0.1: worker 1 reaching
    # worker 0 counts 0.1 here, worker 0 reaching worker 1 stays 1: 0.1 * (4/3 + 5/6) + 5/6.
    comm = np.array([[0.0, 1.0], [0.1, 0.0]])
    assert paper_cost(COUNTS, OWNER, soft, comm) == pytest.approx(0.1 * 13 / 6 + 5 / 6)


def test_replicas_follow_the_papers_ranking_not_the_plain_saving() -> None:
    soft = soft_table(4, 3.0, 2.0)
    degree = COUNTS.sum(axis=1)
    priority = replica_priority(COUNTS, OWNER, degree, soft)
    # soft(c)^2 (1/deg + 1/c) of the ids a worker uses and does not own:
    #   worker 1, id 10: (4/3)^2 (1/4 + 1/2) = 16/9 * 3/4 = 4/3
    #   worker 1, id 14: (5/6)^2 (1/1 + 1/1) = 25/36 * 2 = 25/18 (> 4/3)
    #   worker 0, id 12: (5/6)^2 (1/2 + 1/1) = 25/36 * 3/2 = 25/24
    expected = np.zeros((5, 2))
    expected[0, 1], expected[4, 1], expected[2, 0] = 4 / 3, 25 / 18, 25 / 24
    assert priority == pytest.approx(expected)
    ids = np.arange(10, 15)
    # A budget of one copy (20% of the 5 ids): worker 1 copies 14, which the plain saving
    # (soft(1) = 5/6 against soft(2) = 4/3 for id 10) would rank second.
    one = paper_replicas(ids, COUNTS, OWNER, priority, 0.2, "window")
    assert [r.tolist() for r in one] == [[12], [14]]
    two = paper_replicas(ids, COUNTS, OWNER, priority, 0.4, "window")
    assert [r.tolist() for r in two] == [[12], [10, 14]]  # id 13 is unused on worker 0
    # Counted on the rows a worker touches (worker 1: 10, 12, 13, 14), 25% buys one copy.
    assert [r.tolist() for r in paper_replicas(ids, COUNTS, OWNER, priority, 0.25,
                                               "touched")] == [[], [14]]


def test_one_sample_and_one_id_scored_by_hand() -> None:
    passes = _passes()
    # Sample 5 (ids 12, 13, on worker 1, which owns both). alpha = 100 / M = 100/3.
    #   stay on 1: nothing to fetch; 2 other samples there: -2 alpha = -200/3
    #   go to 0:   12: soft(2) - soft(1) = 1/2, 13: soft(1) - soft(0) = 5/6, both owned by 1;
    #              3 samples there: -3 alpha - 4/3 = -100 - 4/3
    assert passes.sample_scores(5, 6)[0] == pytest.approx([-100 - 4 / 3, -200 / 3])
    # Sample 3 (ids 10, 13, on worker 1; 10 is worker 0's). Where it is, its own use counts:
    #   stay on 1: 10 used twice there with it, soft(2) - soft(1) = 1/2: -200/3 - 1/2
    #   go to 0:   10 owned there, 13 unused there, soft(1) = 5/6:        -100 - 5/6
    assert passes.sample_scores(3, 4)[0] == pytest.approx([-100 - 5 / 6, -200 / 3 - 1 / 2])
    # Id 14 (owner 0; used once, by worker 1; degree 1). beta = 100 / (G / N) = 40, and 2
    # other ids on either worker: -80 each. Served per step, b/M = 2/3 times the remote soft
    # counts: worker 0 (10, 11, 14): 2/3 (4/3 + 0 + 5/6) = 13/9; worker 1 (12, 13): 2/3 * 5/6.
    #   on 0: -80 - soft(1) - 0.01 * 13/9 * soft(1);  on 1: -80 - 0 - 0.01 * 5/9 * soft(1)
    assert passes.served == pytest.approx([13 / 9, 5 / 9])
    assert passes.id_scores(4, 5)[0] == pytest.approx(
        [-80 - 5 / 6 - 0.01 * 13 / 9 * 5 / 6, -80 - 0.01 * 5 / 9 * 5 / 6])


class _Checked(PaperPasses):
    """The passes, each chunk's scores checked against the definitions computed afresh from
    the assignment as it stands (the passes keep marginals and loads up to date as they go)."""

    def _comm(self) -> np.ndarray:
        return 1.0 - np.eye(self.n) if self.comm is None else self.comm

    def sample_scores(self, lo: int, hi: int) -> np.ndarray:
        got = super().sample_scores(lo, hi)
        comm, want = self._comm(), np.zeros((hi - lo, self.n))
        for s in range(lo, hi):
            rows = self.entry_id[self.indptr[s]:self.indptr[s + 1]]
            for k in range(self.n):
                here = int(self.worker[s] == k)
                c = self.counts[rows, k] - here
                fetch = comm[k, self.owner[rows]] * (self.soft[c + 1] - self.soft[c])
                want[s - lo, k] = -self.alpha * (self.load[k] - here) - fetch.sum()
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
        return got

    def id_scores(self, lo: int, hi: int) -> np.ndarray:
        got = super().id_scores(lo, hi)
        comm, soft = self._comm(), self.soft[self.counts]
        remote = soft.sum(axis=1) - soft[np.arange(self.num_ids), self.owner]
        served = np.bincount(self.owner, remote, self.n) * self.b / self.m
        assert self.served == pytest.approx(served, rel=1e-9, abs=1e-12)
        want = np.zeros((hi - lo, self.n))
        for j in range(lo, hi):
            for k in range(self.n):
                here = int(self.owner[j] == k)
                want[j - lo, k] = (-self.beta * (self.owned[k] - here) - soft[j] @ comm[:, k]
                                   - self.settings.hot_spot * served[k] *
                                   self.soft[self.degree[j]])
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        return got


@pytest.mark.parametrize("comm", [None, [[0, 1, 1], [0.1, 0, 1], [1, 0.1, 0]]])
def test_chunked_passes_score_by_the_definitions_as_the_counts_change(
        comm: list[list[float]] | None) -> None:
    rng = np.random.default_rng(11)
    window = _random_window(rng)
    ids, entry_id = np.unique(window.indices, return_inverse=True)
    passes = _Checked(window.indptr, entry_id, ids.size, 3, batch_per_worker=3,
                      settings=PaperSettings(rounds=3, sample_chunk=4, id_chunk=3), seed=2,
                      comm=None if comm is None else np.array(comm))
    costs = passes.run()
    assert costs[-1] < costs[0]


def _random_window(rng: np.random.Generator) -> WindowGraph:
    """Samples of 2-5 distinct ids drawn from 3 loose groups of 12 ids each."""
    rows = []
    for _ in range(int(rng.integers(30, 60))):
        group = int(rng.integers(0, 3))
        pool = np.r_[np.arange(12) + 12 * group, rng.integers(0, 36, 3)]
        rows.append(rng.choice(np.unique(pool), int(rng.integers(2, 6)), replace=False))
    indptr = np.cumsum([0] + [r.size for r in rows])
    return WindowGraph(indptr, np.concatenate(rows) * 7 + 3)


@pytest.mark.parametrize("seed", range(4))
def test_sequential_passes_never_raise_what_they_descend(seed: int) -> None:
    # Taken one at a time (chunks of 1, the paper's order), the sample pass descends cost +
    # alpha * sum_k L_k (L_k - 1) / 2 and the id pass, without the hot-spot term (which is no
    # potential), cost + beta * sum_k n_k (n_k - 1) / 2.
    rng = np.random.default_rng(seed)
    window = _random_window(rng)
    ids, entry_id = np.unique(window.indices, return_inverse=True)
    n = int(rng.integers(2, 4))
    passes = PaperPasses(window.indptr, entry_id, ids.size, n, batch_per_worker=4,
                         settings=PaperSettings(sample_chunk=1, id_chunk=1, hot_spot=0.0),
                         seed=seed)
    start = passes.objective()["cost"]
    moved = 0
    for _ in range(4):
        before = passes.objective()
        moved += passes.sample_pass()
        after = passes.objective()
        assert after["cost"] + after["sample_balance"] <= \
            before["cost"] + before["sample_balance"] + 1e-9
        passes.served = passes._served()
        before = after
        moved += passes.id_pass()
        after = passes.objective()
        assert after["cost"] + after["id_balance"] <= before["cost"] + before["id_balance"] + 1e-9
    assert moved > 0 and passes.objective()["cost"] < start
    # The counts the passes kept in step are those of the assignment they reached.
    fresh = PaperPasses(window.indptr, entry_id, ids.size, n, 4, PaperSettings())
    fresh.place(passes.worker, passes.owner)
    assert np.array_equal(fresh.counts, passes.counts)


def test_default_run_lowers_the_cost_and_places_every_id() -> None:
    rng = np.random.default_rng(7)
    window = _random_window(rng)
    config = PartitionConfig(num_workers=3, global_batch=12, seed=3, min_count=1,
                             replica_fraction=0.1)
    result = paper_partition(window, config)
    assert len(result.costs) == 6 and result.costs[-1] < result.costs[0]
    assert np.array_equal(result.ids, np.unique(window.indices))
    placement = result.placement
    assert np.array_equal(placement.owner_of(result.ids), result.owner)
    assert result.sample_worker.shape == (window.num_samples,)
    assert np.array_equal(placement.replica_counts(), [int(0.1 * result.ids.size)] * 3)
    # Same seed, same partition; the replicas of another budget keep the owners.
    again = paper_partition(window, config)
    assert again.placement == placement
    touched = result.with_replicas(0.1, "touched")
    assert np.array_equal(touched.owners, placement.owners)
    with pytest.raises(ValueError):
        paper_partition(WindowGraph(window.indptr, window.indices,
                                    weights=np.ones(window.num_samples)), config)


def test_offline_bench_prints_the_papers_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--offline", "--strategy", "hetgmp-paper", "--workers", "2",
                 "--records", "3000", "--global-batch", "512"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    printed = [line for line in lines[:-1] if "hetgmp-paper" in line]
    assert len(printed) == 2 and all(line.endswith("in 5 rounds") for line in printed)
    rows = json.loads(lines[-1])["rows"]
    assert [(r["strategy"], r["replica_basis"]) for r in rows] == [
        ("hash", None), ("hetgmp-paper", "touched"), ("hetgmp-paper", "window")]
    for row in rows[1:]:
        assert 0 < row["reduction_vs_hash"] < 1 and len(row["cost_by_round"]) == 6
        assert row["cost_by_round"][-1] < row["cost_by_round"][0]
        assert row["imbalance"] <= 1.10


def test_rolling_bench_runs_the_paper_once_like_static(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--strategy", "static,hetgmp-paper", "--workers", "2", "--window", "3000",
                 "--period-records", "1500", "--periods", "2", "--global-batch", "512"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    by_name = {r["strategy"]: r for r in rows}
    assert list(by_name) == ["hash", "static", "hetgmp-paper"]
    paper = by_name["hetgmp-paper"]
    assert paper["rows_migrated"] == 0 and paper["initial_rows_migrated"] > 0
    assert paper["remote_rows_per_sample"] < by_name["hash"]["remote_rows_per_sample"]


@pytest.mark.parametrize("flags", [["--strategy", "full", "--offline"],
                                   ["--strategy", "nope"], ["--strategy", ","],
                                   ["--scale", "--strategy", "static"]])
def test_strategy_names_are_checked(flags: list[str]) -> None:
    with pytest.raises(SystemExit):
        main([*flags, "--records", "100"])
