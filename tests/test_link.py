"""bench/link.sh: shapes loopback for one command, tells it the rate, passes its exit status on,
restores loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "link.sh"

# Sends 4 MB over a loopback socket and prints the rate in Mbit/s.
THROUGHPUT = """
import socket, threading, time
n = 4 << 20
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
def sink():
    c, _ = srv.accept(); got = 0
    while got < n:
        b = c.recv(1 << 16)
        if not b: break
        got += len(b)
t = threading.Thread(target=sink); t.start()
s = socket.create_connection(srv.getsockname()); began = time.perf_counter()
s.sendall(b"x" * n); t.join()
print(n * 8 / (time.perf_counter() - began) / 1e6)
"""


def lo_root_qdisc() -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", "lo", "root"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture()
def shapeable() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("tc") is None:
        pytest.skip("link.sh needs root and tc")
    if not lo_root_qdisc().startswith("qdisc noqueue"):
        pytest.skip("lo has a qdisc of its own")
    yield
    # A script killed outright (a timeout's SIGKILL) cannot run its trap: never leave lo shaped
    # for the tests that come next.
    if not lo_root_qdisc().startswith("qdisc noqueue"):
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False)


def test_shapes_loopback_while_the_command_runs_then_restores_it(shapeable):
    r = subprocess.run(["bash", str(SCRIPT), "100mbit", sys.executable, "-c", THROUGHPUT],
                       capture_output=True, text=True, timeout=120)
    if "cannot shape lo" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    # 4 MB at 100 Mbit/s take 0.34 s; unshaped loopback moves them in milliseconds.
    assert float(r.stdout.split()[-1]) < 150
    assert lo_root_qdisc().startswith("qdisc noqueue")


def test_passes_the_exit_status_on_and_refuses_a_bad_rate(shapeable):
    tell = "import os; print(os.environ['HETGMP_LINK']); raise SystemExit(3)"
    r = subprocess.run(["bash", str(SCRIPT), "50mbit", sys.executable, "-c", tell],
                       capture_output=True, text=True, timeout=60)
    if "cannot shape lo" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 3 and r.stdout.strip() == "50mbit"
    assert lo_root_qdisc().startswith("qdisc noqueue")
    bad = subprocess.run(["bash", str(SCRIPT), "fast", "true"], capture_output=True, text=True)
    assert bad.returncode == 2 and "tc rate" in bad.stderr
    assert lo_root_qdisc().startswith("qdisc noqueue")
