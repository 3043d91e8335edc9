"""``hetgmp serve`` answers from the moment it starts: it listens before it has a checkpoint
or a broker, says on ``/healthz`` and ``/readyz`` what it waits for, refuses predictions with
503 until it has a model, and refuses settings whose paths cannot work before it listens."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_process import Serve

from hetgmp.streaming.kafka import KafkaSettings

pytestmark = pytest.mark.slow

NOBODY = KafkaSettings(bootstrap_servers="127.0.0.1:9")  # no broker answers there


def test_serve_listens_at_once_and_says_what_it_waits_for(tmp_path: Path) -> None:
    t0 = time.monotonic()
    serve = Serve(tmp_path / "not-yet", NOBODY)  # waits for its "listening" line
    try:
        assert time.monotonic() - t0 < 30
        status, reply = serve.request("/healthz")
        assert status == 200 and "checkpoint" in reply["waiting_for"]
        status, reply = serve.request("/readyz")
        assert status == 503 and "a complete checkpoint in" in reply["reason"]
        status, reply = serve.request("/predict", b"0\t1\n")
        assert status == 503 and "no model loaded yet" in reply["error"]
        assert serve.metric("hetgmp_serve_ready") == 0
    finally:
        serve.stopped_cleanly()


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--delta-key-file"])
def test_a_path_that_cannot_work_is_refused_in_one_line(tmp_path: Path, flag: str) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"short")
    args = {"--checkpoint-dir": str(tmp_path), flag: str(a_file)}
    r = subprocess.run([sys.executable, "-m", "hetgmp.trainer.app.cli", "serve",
                        *[x for kv in args.items() for x in kv]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and flag in errors[0], r.stderr
    assert "Traceback" not in r.stderr
