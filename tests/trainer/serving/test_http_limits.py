"""What a client can hold of ``hetgmp serve``: connections that never finish a request head are
closed after the header timeout, a body that does not arrive gets 408, bodies in memory are
bounded, deep JSON is a 400; normal requests are answered meanwhile. The server is the serve
command's own (:func:`hetgmp.trainer.app.serve.listen`, its settings), on loopback in this process,
with a small model; the process itself is tested in ``test_serve.py``."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest
from small_serving import SCHEMA, small_model

from hetgmp.streaming import parse_schema
from hetgmp.trainer.app.serve import listen
from hetgmp.trainer.serving import ServeConfig, Service

LINE = b"0\t1\t2\ta\tb\tc\n"


class _Server:
    """serve's HTTP side on a thread of its own; ``port`` once it listens."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.service = Service(small_model(), None, parse_schema(SCHEMA), "tsv",
                               max_inflight_bytes=cfg.max_inflight_bytes)
        self.cfg, self.port = cfg, 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the server did not start"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.runner, self.port = self._loop.run_until_complete(listen(self.service, self.cfg))
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.runner.cleanup())

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self.service.pool.shutdown(wait=False)

    def post(self, body: bytes, ctype: str = "text/tab-separated-values"
             ) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/predict", data=body,
                                     headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return s


@pytest.fixture()
def server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    kw = getattr(request, "param", {})
    s = _Server(ServeConfig(header_timeout_s=1.0, body_timeout_s=1.0, **kw))
    yield s
    s.stop()


def _closed_within(conns: list[socket.socket], seconds: float) -> float:
    """Seconds until the server closed every one of ``conns`` (fails past ``seconds``)."""
    t0 = time.monotonic()
    for c in conns:
        c.settimeout(max(0.01, seconds - (time.monotonic() - t0)))
        try:
            while c.recv(4096):  # a reply (408) is fine; the close is what counts
                pass
        except TimeoutError:
            pytest.fail(f"a stalled connection was still open after {seconds} s")
        finally:
            c.close()
    return time.monotonic() - t0


@pytest.mark.slow  # waits out a timeout
def test_half_sent_request_heads_are_closed_after_the_header_timeout(server: _Server) -> None:
    stalled = [server.connect() for _ in range(50)]
    for i, c in enumerate(stalled):
        c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"PO")
    assert server.post(LINE)[0] == 200  # answered while they stall
    assert _closed_within(stalled, 5.0) < 5.0
    idle = server.connect()  # a connection that sends nothing at all
    assert _closed_within([idle], 5.0) < 5.0


@pytest.mark.slow  # waits out a timeout
def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closes(server: _Server) -> None:
    c = server.connect()
    c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
              b"Content-Length: 1000\r\n\r\n0\t1")
    c.settimeout(5.0)
    reply = b""
    while chunk := c.recv(4096):
        reply += chunk
    c.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"--body-timeout-s" in reply
    assert server.post(LINE)[0] == 200


@pytest.mark.parametrize("server", [{"max_body_bytes": 1 << 20, "max_inflight_bytes": 2 << 20}],
                         indirect=True)
def test_bodies_in_memory_are_bounded(server: _Server) -> None:
    # Two bodies of 1 MiB announced and half sent hold the whole budget ...
    holders = [server.connect() for _ in range(2)]
    for c in holders:
        c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                  b"Content-Length: 1048576\r\n\r\n" + LINE)
    deadline = time.monotonic() + 5
    while server.service.inflight_bytes < 2 << 20:
        assert time.monotonic() < deadline, server.service.inflight_bytes
        time.sleep(0.01)
    # ... so a third is turned away before its body is read, and told to retry.
    status, reply = server.post(LINE * 10)
    assert status == 503 and "--max-inflight-bytes" in reply["error"]
    _closed_within(holders, 5.0)  # their bodies time out: 408
    deadline = time.monotonic() + 5
    while server.service.inflight_bytes:
        assert time.monotonic() < deadline, server.service.inflight_bytes
        time.sleep(0.01)
    assert server.post(LINE * 10)[0] == 200  # the budget came back


@pytest.mark.parametrize("server", [{"max_records": 100}], indirect=True)
def test_too_many_lines_are_refused_before_they_are_split(server: _Server) -> None:
    status, reply = server.post(b"x\n" * 4_000_000)
    assert status == 413 and "--max-records" in reply["error"]
    assert server.post(LINE * 100 + b"\n\n")[0] == 200  # trailing blank lines are not records


def test_deeply_nested_json_is_a_400_not_a_500(server: _Server) -> None:
    status, reply = server.post(b"[" * 30000 + b"]" * 30000, "application/x-ndjson")
    assert status == 400, reply
    assert reply["rejected"][0]["reason"] == "bad_json"
    assert "nested too deeply" in reply["rejected"][0]["detail"]
