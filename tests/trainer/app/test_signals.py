"""One SIGTERM (or SIGINT) stops ``produce``, ``consume`` and ``train`` while their admin client
retries a broker that does not answer: a closed port, or the embedded broker asked for SASL it
does not speak. Each used to retry for minutes (every `timeout` needed SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

# Generous: the machine is shared; a stop comes within one connection try (5 s) and a backoff.
BOUND_S = 15.0
# The stderr line of a try that failed: the process is inside the retry loop.
RETRYING = "Kafka not reachable"

COMMANDS = {
    "produce": ["produce", "--count", "10", "--topic", "signals"],
    "consume": ["consume", "--consumer-topic", "signals", "--idle-exit", "1"],
    "train": ["train", "--source", "kafka", "--consumer-topic", "signals", "--device", "cpu",
              "--workers", "1"],
    "train-2-ranks": ["train", "--source", "kafka", "--consumer-topic", "signals",
                      "--device", "cpu", "--workers", "2"],
}

# Each case starts a command and waits for it to stop: the slow lane.
pytestmark = pytest.mark.slow


def closed_port() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def stop_while_retrying(argv: list[str], sig: signal.Signals) -> tuple[int | None, float, str]:
    """Start ``hetgmp ARGV``, wait until it retries the broker, send ``sig`` once: the exit
    status (None: still running after the bound, then killed), seconds to exit, stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "hetgmp.trainer.app.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []
    retrying = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if RETRYING in line:
                retrying.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert retrying.wait(90), "never retried:\n" + "".join(lines)
        proc.send_signal(sig)
        t0 = time.monotonic()
        try:
            code: int | None = proc.wait(BOUND_S)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    reader.join(10)
    return code, seconds, "".join(lines)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("command", ["produce", "consume", "train", "train-2-ranks"])
def test_one_sigterm_stops_a_command_retrying_a_closed_port(command: str) -> None:
    argv = [*COMMANDS[command], "--bootstrap-servers", closed_port()]
    code, seconds, err = stop_while_retrying(argv, signal.SIGTERM)
    assert code == 130, f"exit {code} after {seconds:.1f} s:\n{err[-3000:]}"
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped:") and "stopped while waiting for a Kafka broker" in last
    assert "Traceback" not in err


@pytest.mark.timeout(120)
def test_one_sigint_stops_consume_retrying_a_closed_port() -> None:
    argv = [*COMMANDS["consume"], "--bootstrap-servers", closed_port()]
    code, _, err = stop_while_retrying(argv, signal.SIGINT)
    assert code == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("stopped:")


@pytest.mark.broker
@pytest.mark.timeout(180)
@pytest.mark.parametrize("command", ["consume", "train-2-ranks"])
def test_one_sigterm_stops_a_command_whose_sasl_the_broker_refuses(broker, command: str) -> None:
    """The embedded broker speaks no SASL: every connection try fails as an unreachable one."""
    argv = [*COMMANDS[command], "--bootstrap-servers", broker.bootstrap_servers,
            "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN",
            "--sasl-plain-username", "someone", "--sasl-plain-password", "pw-4c1d-not-logged"]
    code, seconds, err = stop_while_retrying(argv, signal.SIGTERM)
    assert code == 130, f"exit {code} after {seconds:.1f} s:\n{err[-3000:]}"
    assert err.strip().splitlines()[-1].startswith("stopped:")
    assert "pw-4c1d-not-logged" not in err
