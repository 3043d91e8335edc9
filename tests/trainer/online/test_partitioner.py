"""Rank 0's partitioner process ends quietly when the job ends while it computes."""

from __future__ import annotations

import time

import pytest

from hetgmp.partitioner import PartitionConfig
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.trainer.online.partition_process import PartitionerProcess


@pytest.mark.slow
def test_a_placement_nobody_waits_for_any_more_ends_the_process_quietly(
        capfd: pytest.CaptureFixture[str]) -> None:
    ids = SyntheticStream(SyntheticConfig(seed=1)).feature_ids(0, 30_000)
    worker = PartitionerProcess(ids.shape[1], 30_000, PartitionConfig(num_workers=2))
    worker._conn.send(([ids], None, 0))  # a request whose answer nobody will read
    t0 = time.monotonic()
    worker.close()  # the rank ends at once, while METIS runs
    assert time.monotonic() - t0 < 5.0  # the process left by itself, it was not killed
    assert worker._proc.exitcode == 0
    # The spawned process writes to this test's stderr: no traceback there.
    assert "Traceback" not in capfd.readouterr().err


def test_a_partitioner_process_that_died_is_named_with_how_it_ended() -> None:
    """Killed (as the OOM killer would), it used to surface as a bare BrokenPipeError."""
    import os
    import signal


    ids = SyntheticStream(SyntheticConfig(seed=1)).feature_ids(0, 2_000)
    worker = PartitionerProcess(ids.shape[1], 2_000, PartitionConfig(num_workers=2))
    try:
        os.kill(worker._proc.pid, signal.SIGKILL)
        worker._proc.join(10)
        with pytest.raises(RuntimeError, match="partitioner process .* killed by signal 9.*"
                                               "smaller --window"):
            worker.partition([ids], None, 1)
    finally:
        worker.close()
