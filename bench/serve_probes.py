"""What the serve benchmark does to ``hetgmp serve`` besides asking it for scores.

* :class:`ServeProcess`: one ``hetgmp serve`` subprocess (``python -m hetgmp.trainer.app.cli serve``),
  a context manager that stops it (terminate, wait, kill), with what the benchmark reads of it:
  ``/readyz``'s step, ``/metrics``' delta counters (:func:`wait_settled`).
* A poisoned copy of a delta log (:func:`copy_with_poison`): the topic's messages in order,
  partition by partition, keys and headers kept, and after every k-th valid message one invalid
  message crafted (:func:`craft`) with the header of the valid message before it, as a writer
  who can read the topic would. The copy keeps the offsets below the checkpoint's as they are,
  so a serve process pointed at it (``--model-topic``) starts where the checkpoint says.
* Stalled clients (:class:`Stalled`): connections that send half a request head, or a whole
  head and half its body, then nothing; the time until the server closes each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from hetgmp.streaming import KafkaSettings, connect_with_retry, ensure_topic, ipc_message, topic_partitions
from hetgmp.trainer.serving import Publish, Rejected, decode, dense_messages, mark_message, row_messages

__all__ = ["POISON_KINDS", "PoisonedCopy", "ServeProcess", "Stalled", "copy_with_poison", "craft",
           "expected_reason", "metric_sums", "post", "wait_settled"]

TSV = {"Content-Type": "text/tab-separated-values"}


def post(url: str, body: bytes) -> dict[str, Any]:
    """``/predict``'s reply to ``body`` (TSV records)."""
    req = urllib.request.Request(url + "/predict", data=body, headers=TSV)
    with urllib.request.urlopen(req, timeout=30) as r:
        reply: dict[str, Any] = json.loads(r.read())
    return reply


# -- a serve process ----------------------------------------------------------------------------

class ServeProcess:
    """``hetgmp serve`` on ``127.0.0.1:port`` from ``checkpoint_dir``, output to ``log_path``.

    Args:
        log_path: Where its stdout and stderr go.
        checkpoint_dir: Its ``--checkpoint-dir``.
        kafka: The cluster of the delta log.
        port: Its ``--port``.
        extra: More flags of ``hetgmp serve`` (``--model-topic``, timeouts).
    """

    def __init__(self, log_path: Path, checkpoint_dir: Path, kafka: KafkaSettings, port: int,
                 *extra: str) -> None:
        self.log_path, self.url = log_path, f"http://127.0.0.1:{port}"
        self.argv = [sys.executable, "-m", "hetgmp.trainer.app.cli", "serve", "--checkpoint-dir",
                     str(checkpoint_dir), "--bootstrap-servers", kafka.bootstrap_servers,
                     "--port", str(port), *extra]
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServeProcess:
        with open(self.log_path, "wb") as out:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, "OMP_NUM_THREADS": "1"})
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate it and wait (kill after 15 s); nothing if it has stopped."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(5)

    def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of ``GET path``; status 0 while nothing answers."""
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(f"hetgmp serve exited {self._proc.returncode}: see {self.log_path}")
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def ready_step(self) -> int | None:
        """``/readyz``'s step once ready (None before)."""
        status, body = self.get("/readyz")
        return int(json.loads(body)["step"]) if status == 200 else None

    def deltas(self) -> tuple[dict[str, float], dict[str, float]]:
        """Delta-log messages applied by kind and rejected by reason (its ``/metrics``)."""
        status, body = self.get("/metrics")
        if status != 200:
            return {}, {}
        text = body.decode()
        return (metric_sums(text, "hetgmp_serve_deltas_applied_total", "kind"),
                metric_sums(text, "hetgmp_serve_deltas_rejected_total", "reason"))


def metric_sums(text: str, sample: str, label: str) -> dict[str, float]:
    """The values of the samples named ``sample`` in Prometheus exposition ``text``, by
    ``label``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample:
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def wait_settled(serve: ServeProcess, step: int, timeout_s: float = 180.0,
                 quiet_s: float = 1.5) -> tuple[dict[str, float], dict[str, float]]:
    """Wait until ``serve`` is ready at ``step`` or later and its delta counters have not moved
    for ``quiet_s``; those counters (:meth:`ServeProcess.deltas`).

    Raises:
        TimeoutError: Not settled within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last: tuple[dict[str, float], dict[str, float]] | None = None
    since = time.monotonic()
    while time.monotonic() < deadline:
        at = serve.ready_step()
        if at is not None and at >= step:
            now = serve.deltas()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return now
        time.sleep(0.25)
    raise TimeoutError(f"{serve.url} did not settle at step {step} in {timeout_s:g} s "
                       f"(log {serve.log_path})")


# -- poisoned messages --------------------------------------------------------------------------

def _rows(ids: np.ndarray, dim: int, head: Publish, fill: float = 0.5) -> bytes:
    return row_messages(ids, np.full((ids.size, dim), fill, np.float32), head)[0]


def _variable_list(head: Publish, ids: np.ndarray, dim: int) -> bytes:
    """Rows whose values are a variable-length list, with a real rows message's metadata."""
    meta = pa.ipc.open_stream(_rows(ids, dim, head)).read_next_batch().schema.metadata
    values = pa.array([[0.5] * dim] * ids.size, pa.list_(pa.float32()))
    batch = pa.record_batch([pa.array(ids, pa.int64()), values], names=["id", "values"])
    return ipc_message(batch.replace_schema_metadata(meta))


# Each kind: (how it is made from a real header, the ids it writes, the row width; the reason
# serving must give when it refuses it).
_KINDS: dict[str, tuple[Callable[[Publish, np.ndarray, int], bytes], str]] = {
    "rows_wrong_width": (lambda h, ids, dim: _rows(ids, dim + 3, h), "shape"),
    "rows_nan": (lambda h, ids, dim: _rows(ids, dim, h, float("nan")), "not_finite"),
    "dense_wrong_size": (lambda h, ids, dim: dense_messages(np.full(8, 0.5, np.float32), h)[0],
                         "shape"),
    "publish_far_ahead": (lambda h, ids, dim: _rows(ids, dim, dataclasses.replace(
        h, publish=1 << 39)), "order"),
    "generation_minus_1": (lambda h, ids, dim: _rows(ids, dim, dataclasses.replace(
        h, generation=-1)), "bounds"),
    "garbage": (lambda h, ids, dim: np.random.default_rng(h.publish).bytes(97), "format"),
    "mark_newer_generation_base_0": (lambda h, ids, dim: mark_message(0, dataclasses.replace(
        h, generation=h.generation + 1, base=0, publish=1)), "order"),
    "rows_variable_list": (_variable_list, "schema"),
}
#: The kinds of invalid message, in the order they are inserted (cycled).
POISON_KINDS: tuple[str, ...] = tuple(_KINDS)


def craft(kind: str, head: Publish, ids: np.ndarray, dim: int) -> bytes:
    """An invalid message of ``kind`` (one of :data:`POISON_KINDS`) written over rows ``ids``
    of width ``dim`` with header ``head`` (a real message's, so the job's lineage)."""
    return _KINDS[kind][0](head, np.asarray(ids, np.int64), dim)


def expected_reason(kind: str) -> str:
    """The reason serving should refuse a message of ``kind`` for."""
    return _KINDS[kind][1]


@dataclass
class PoisonedCopy:
    """What :func:`copy_with_poison` wrote.

    Attributes:
        valid: Messages of the log at or past the start offsets (copied as they were).
        poisoned: Invalid messages inserted among them.
        by_kind: Of those, how many of each kind.
        before: Messages below the start offsets (copied, no poison among them).
    """

    valid: int = 0
    poisoned: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    before: int = 0


def copy_with_poison(kafka: KafkaSettings, source: str, target: str, start: dict[int, int],
                     every: int, ids: np.ndarray, dim: int, timeout_s: float = 120.0
                     ) -> PoisonedCopy:
    """Copy topic ``source`` to a new topic ``target`` (as many partitions), inserting after
    every ``every``-th message at or past ``start[partition]`` one :func:`craft`-ed message
    (kinds in turn), keyed as the message before it.

    Raises:
        RuntimeError: The copy's offsets below ``start`` are not the source's (the serve
            process would not start where its checkpoint says).
    """
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    parts = sorted(topic_partitions(kafka, source, wait_s=30.0))
    ensure_topic(kafka, target, len(parts))
    consumer = connect_with_retry(
        lambda: KafkaConsumer(**kafka.client_kwargs(), group_id=None, enable_auto_commit=False,
                              auto_offset_reset="earliest", max_partition_fetch_bytes=16 << 20,
                              fetch_max_bytes=64 << 20), "delta-log reader", kafka)
    producer = connect_with_retry(
        lambda: KafkaProducer(**kafka.client_kwargs(), acks="all", linger_ms=5,
                              batch_size=1 << 20, max_request_size=1 << 20,
                              max_in_flight_requests_per_connection=1), "poison writer", kafka)
    tps = [TopicPartition(source, p) for p in parts]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    out, checks = PoisonedCopy(), []
    deadline = time.monotonic() + timeout_s
    try:
        while not all(consumer.highwater(tp) is not None
                      and consumer.position(tp) >= consumer.highwater(tp) for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{source} not read whole in {timeout_s:g} s")
            for tp, records in consumer.poll(timeout_ms=500, max_records=4096).items():
                for r in records:
                    sent = producer.send(target, value=r.value, key=r.key,
                                         headers=list(r.headers or []), partition=tp.partition)
                    if r.offset < start.get(tp.partition, 0):
                        out.before += 1
                        checks.append((sent, r.offset))
                        continue
                    out.valid += 1
                    if out.valid % every == 0:
                        _insert(producer, target, tp.partition, r, out, ids, dim)
        producer.flush(timeout_s)
        for sent, offset in checks:
            if sent.get(timeout_s).offset != offset:
                raise RuntimeError(f"the copy of {source} put offset {offset} at "
                                   f"{sent.get().offset}: the source's offsets have gaps")
    finally:
        consumer.close()
        producer.close(timeout=10)
    return out


def _insert(producer: Any, topic: str, partition: int, after: Any, out: PoisonedCopy,
            ids: np.ndarray, dim: int) -> None:
    try:
        head = decode(after.value).head
    except Rejected:  # a message the job wrote that serving refuses: the clean serve does too
        return
    kind = POISON_KINDS[out.poisoned % len(POISON_KINDS)]
    producer.send(topic, value=craft(kind, head, ids, dim), key=after.key, partition=partition)
    out.poisoned += 1
    out.by_kind[kind] = out.by_kind.get(kind, 0) + 1


# -- stalled clients ----------------------------------------------------------------------------

class Stalled:
    """``n`` connections that send half a request head and ``n`` that send a whole head and
    half the body it announces, then nothing; a thread notes when the server closes each.

    Args:
        port: The server's port on loopback.
        n: Connections of each kind.
        body: The body the second kind announces (half of it is sent).
    """

    HEAD = b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/tab-separated-values\r\n"

    def __init__(self, port: int, n: int, body: bytes) -> None:
        self.port, self.n, self.body = port, n, body
        self.heads: list[tuple[socket.socket, float]] = []  # (socket, opened)
        self.bodies: list[tuple[socket.socket, float]] = []  # (socket, head sent)
        self.closed: dict[socket.socket, float] = {}  # when the server closed each
        self._selector = selectors.DefaultSelector()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stalled-watch", daemon=True)

    def __enter__(self) -> Stalled:
        for _ in range(self.n):
            t0 = time.monotonic()
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            s.sendall(self.HEAD)  # no blank line: the head never ends
            self.heads.append((s, t0))
        for _ in range(self.n):
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            s.sendall(self.HEAD + f"Content-Length: {len(self.body)}\r\n\r\n".encode()
                      + self.body[:len(self.body) // 2])
            self.bodies.append((s, time.monotonic()))
        for s, _ in self.heads + self.bodies:
            s.setblocking(False)
            self._selector.register(s, selectors.EVENT_READ)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self._thread.join(5)
        for s, _ in self.heads + self.bodies:
            s.close()
        self._selector.close()

    def _watch(self) -> None:
        while not self._halt.is_set() and len(self.closed) < 2 * self.n:
            for key, _ in self._selector.select(0.05):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = s.recv(65536)  # a 408 reply may come first; the close is what counts
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.closed[s] = time.monotonic()
                    self._selector.unregister(s)

    def wait_closed(self, timeout_s: float) -> None:
        """Wait until the server has closed every connection, or ``timeout_s``."""
        self._thread.join(timeout_s)

    def close_times(self) -> tuple[list[float], list[float]]:
        """Seconds from opening to the server's close for the half heads, from the head to
        the close for the half bodies (inf: still open)."""
        inf = float("inf")
        return ([self.closed.get(s, inf) - t for s, t in self.heads],
                [self.closed.get(s, inf) - t for s, t in self.bodies])
