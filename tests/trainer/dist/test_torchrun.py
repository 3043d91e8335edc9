"""Two machines on one box: two torchrun agents (``--nnodes 2``, c10d rendezvous on 127.0.0.1)
train online from the embedded broker with checkpoints in a directory both write.

The placement advances and rows migrate between the "machines"; every rank serves metrics.
An agent killed with SIGKILL takes its rank with it, and the other ends within
``--timeout-s`` naming the lost rank; ``--resume`` on one machine with another number of ranks
goes on from the newest checkpoint, nothing skipped.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetgmp.streaming import KafkaSettings, ProduceConfig, SyntheticConfig, produce
from hetgmp.runtime import free_port, free_ports
from hetgmp.trainer import checkpoint as ckpt
from hetgmp.trainer.app.demo import scrape

pytestmark = [pytest.mark.broker, pytest.mark.distributed, pytest.mark.slow]

SYN = SyntheticConfig(seed=6, drift_every=30_000)
TIMEOUT_S = 30
# Which agent serves the rendezvous store in step 2: the survivor (0). 1, the agent killed,
# reproduces the failure this pinning removes: the survivor's agent loses the store and ends
# its rank before the rank can name the lost peer.
HOST = int(os.environ.get("HETGMP_TEST_RDZV_HOST", "0"))


def _agent(rdzv: int, nodes: int, procs: int, train: list[str], log: Path,
           host: bool | None = None) -> subprocess.Popen:
    """One torchrun agent. ``host`` says whether it serves the rendezvous store: on one box
    every agent matches the endpoint, and the first to bind the port would host it, so a test
    that kills an agent names the survivor as host (an agent that loses the store ends its
    workers before they can report the lost peer)."""
    conf = [] if host is None else ["--rdzv-conf", f"is_host={str(host).lower()}"]
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
            "--nproc-per-node", str(procs), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{rdzv}", "--rdzv-id", f"job-{rdzv}", *conf,
            "--max-restarts", "0", "-m", "hetgmp.trainer.app.cli", "train", *train]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


def _summary(log: Path) -> dict:
    lines = [line for line in log.read_text().splitlines() if line.startswith('{"command"')]
    assert lines, log.read_text()[-3000:]
    return json.loads(lines[-1])


@pytest.mark.timeout(400)
def test_two_torchrun_agents_train_fail_and_resume(kafka: KafkaSettings, unique,
                                                   tmp_path: Path) -> None:
    topic, group = unique("two-nodes"), unique("two-nodes-group")
    ports = free_ports(19700, 2)
    train = ["--source", "kafka", "--bootstrap-servers", kafka.bootstrap_servers,
             "--consumer-topic", topic, "--consumer-group-id", group, "--records", "0",
             "--idle-s", "6", "--device", "cpu", "--embed-dim", "8", "--hidden", "16",
             "--global-batch", "1024", "--warmup", "4000", "--repartition-interval", "8000",
             "--window", "30000", "--checkpoint-dir", str(tmp_path / "ckpt"),
             "--checkpoint-interval", "10000", "--timeout-s", str(TIMEOUT_S),
             "--log-every", "0", "--metrics-port", str(ports)]
    produce(kafka, ProduceConfig(topic=topic, count=40_000, partitions=4), SYN)

    # 1. Two machines of one rank each: placements advance, rows move between them, every
    # rank serves its metrics.
    rdzv = free_port()
    logs = [tmp_path / f"a{n}.log" for n in range(2)]
    agents = [_agent(rdzv, 2, 1, [*train, "--metrics-linger-s", "4"], log) for log in logs]
    migrated = {}
    deadline = time.monotonic() + 180
    while any(a.poll() is None for a in agents) and time.monotonic() < deadline:
        for rank in range(2):
            try:
                samples = scrape(f"http://127.0.0.1:{ports + rank}/metrics", timeout=1.0)
            except OSError:
                continue
            migrated[rank] = sum(v for _, v in samples.get("hetgmp_migrated_rows_total", []))
        time.sleep(0.5)
    assert [a.wait(30) for a in agents] == [0, 0], logs[0].read_text()[-3000:]
    s = _summary(logs[0])
    assert s["workers"] == 2 and s["samples"] == 40_000
    assert s["placements_moved_to"] >= 2 and s["placement"]["version"] >= 2
    assert set(migrated) == {0, 1} and sum(migrated.values()) > 0  # both served; rows crossed
    first = ckpt.latest(tmp_path / "ckpt")
    assert first is not None and first.world == 2 and first.records == 40_000

    # 2. More records, the two machines resume; one agent is killed: the other ends within
    # --timeout-s and names the rank it lost.
    produce(kafka, ProduceConfig(topic=topic, count=60_000, partitions=4), SYN)
    rdzv = free_port()
    agents = [_agent(rdzv, 2, 1, [*train, "--resume"], log, host=n == HOST)
              for n, log in enumerate(logs)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the resumed run has checkpointed once
        newest = ckpt.latest(tmp_path / "ckpt", verify=False)
        if newest is not None and newest.step > first.step:
            break
        time.sleep(0.3)
    assert agents[1].poll() is None, "the job ended before the fault"
    agents[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    code = agents[0].wait(TIMEOUT_S + 30)
    took = time.monotonic() - killed
    out = logs[0].read_text()
    assert code != 0 and took < TIMEOUT_S + 15, (code, took)
    # Ranks follow the rendezvous's order, not the launch order: the survivor names the other.
    lost = re.search(r"collective failed on rank (\d): rank (\d) \(pid \d+\) "
                     r"of this machine is gone", out)
    assert "PeerLost" in out and lost is not None and {lost[1], lost[2]} == {"0", "1"}, out[-3000:]

    # 3. One machine, one rank: --resume goes on from the newest checkpoint to the end of the
    # topic, every record trained once over the three runs.
    resumed_from = ckpt.latest(tmp_path / "ckpt")
    assert resumed_from is not None and 40_000 <= resumed_from.records < 100_000
    one = _agent(free_port(), 1, 1, [*train, "--resume"], tmp_path / "one.log")
    assert one.wait(180) == 0, (tmp_path / "one.log").read_text()[-3000:]
    s = _summary(tmp_path / "one.log")
    assert s["workers"] == 1 and s["resumed_from_step"] == resumed_from.step
    final = ckpt.latest(tmp_path / "ckpt")
    assert final is not None and final.records == 100_000
    assert s["samples"] == 100_000 - resumed_from.records  # nothing skipped, nothing twice
