"""The chaos benchmark, short: three faults, every one recovered, the ledger proves nothing was
skipped and the final checkpoint counts what was trained."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.chaos import main


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_three_faults_are_recovered_and_nothing_is_lost(capsys: pytest.CaptureFixture[str],
                                                        tmp_path) -> None:
    code = main(["--faults", "3", "--kinds", "kill_step,kill_checkpoint,stop_broker",
                 "--stop-s", "3,5", "--rate", "3000", "--seed", "2",
                 "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    s = json.loads(out.strip().splitlines()[-1])
    assert code == 0, out[-3000:]
    assert s["faults"] == s["recovered"] == 3
    assert s["kinds"] == ["kill_checkpoint", "kill_step", "stop_broker"]
    assert s["skipped_offsets"] == 0 and s["job_runs"] >= 3  # two crashes, two resumes
    assert 0 < s["max_replay_records"] <= s["checkpoint_interval_records"] + s["global_batch"]
    assert s["final_records"] == s["ledger_records"] == s["topic_records"] > 0
    assert s["max_recovery_s"] < 60


def test_the_ledger_account_sees_a_skip_a_replay_and_the_distinct_records(tmp_path) -> None:
    from bench.chaos_ledger import account
    from hetgmp.streaming import ClickBatch
    from hetgmp.trainer.testing import Ledger

    def step(run: int, rank: int, rows: list[tuple[int, int, int]]) -> None:
        """What a rank's Ledger writes for one step of (partition, offset, records)."""
        parts = [p for p, _, n in rows for _ in range(n)]
        offs = [o for _, o, n in rows for _ in range(n)]
        n = len(parts)
        batch = ClickBatch.of_ids(np.zeros(n, np.float32), np.zeros((n, 13), np.float32),
                           np.zeros((n, 26), np.int64), np.array(parts, np.int32),
                           np.array(offs, np.int64), np.zeros(n, np.int64))
        with Ledger(tmp_path / f"run-{run:03d}", rank) as ledger:
            ledger.add(batch)

    # Partition 0 ends at offset 4, partition 1 at 2; messages of 16 records.
    step(0, 0, [(0, 0, 16), (0, 1, 16), (0, 2, 9)])  # offset 2 half done when run 0 died
    step(0, 1, [(1, 0, 16)])
    step(1, 0, [(0, 2, 16), (0, 3, 16)])  # run 1 replays offset 2 whole (9 seen before)
    step(1, 1, [(1, 0, 16)])  # and offset 0 of partition 1 (16 before); offset 1 never
    a = account(tmp_path, {0: 4, 1: 2}, 16)
    assert a.expected == 6 * 16 and a.skipped == 1  # (1, 1)
    assert a.replays == [9 + 16] and a.max_replay == 25  # both ranks of run 0 lost, together
    assert a.distinct == 5 * 16


def test_the_ledger_charges_a_replay_to_the_crash_that_threw_the_records_away(tmp_path) -> None:
    """Run 0 trains A and dies; run 1 trains B and dies before any checkpoint; run 2 trains A
    and B. Each crash threw away 16 records: charged to the run that trained them, not to the
    run that trained them again (that would be 32 at run 2, twice what either crash lost)."""
    from bench.chaos_ledger import account
    from hetgmp.streaming import ClickBatch
    from hetgmp.trainer.testing import Ledger

    def step(run: int, offsets: list[int]) -> None:
        n = 16 * len(offsets)
        batch = ClickBatch.of_ids(np.zeros(n, np.float32), np.zeros((n, 13), np.float32),
                           np.zeros((n, 26), np.int64), np.zeros(n, np.int32),
                           np.repeat(np.array(offsets, np.int64), 16), np.zeros(n, np.int64))
        with Ledger(tmp_path / f"run-{run:03d}", 0) as ledger:
            ledger.add(batch)

    step(0, [0])
    step(1, [1])
    step(2, [0, 1])
    a = account(tmp_path, {0: 2}, 16)
    assert a.replays == [16, 16] and a.max_replay == 16
    assert a.skipped == 0 and a.distinct == 32
