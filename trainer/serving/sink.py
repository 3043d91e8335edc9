"""Where a rank's publishes go: the delta-log topic, through kafka-python's producer.

Sends are asynchronous (a publish costs the step loop the encoding, not a round trip); the
broker's acknowledgements come back on the producer's thread and are counted here: the offsets
of what was stored (a checkpoint records them, :meth:`KafkaDeltaSink.flush`) and the ids of
messages that failed, for the publisher to send again. acks=all and the idempotent producer,
as for click logs: a delta the broker did not store is never counted as sent.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streaming import KafkaSettings, connect_with_retry
from trainer.serving.signing import Signer

__all__ = ["DeltaSink", "Failed", "KafkaDeltaSink", "MemorySink"]

log = logging.getLogger(__name__)


@dataclass
class Failed:
    """What the broker did not store since the last :meth:`DeltaSink.take_failed`."""

    rows: list[np.ndarray] = field(default_factory=list)
    tombstones: list[np.ndarray] = field(default_factory=list)
    messages: int = 0
    error: str = ""


class DeltaSink(Protocol):
    """What the publisher sends through."""

    topic: str

    def send(self, payload: bytes, *, rows: np.ndarray | None = None,
             tombstones: np.ndarray | None = None) -> None:
        """Send one message; ``rows``/``tombstones``: the ids it carries (to resend if lost)."""

    def acked(self) -> dict[int, int]:
        """The next offset after what the broker stored of this sink's sends, by partition."""

    def flush(self) -> None:
        """Wait for every send to be stored or to fail."""

    def take_failed(self) -> Failed:
        """What failed since the last call."""

    def close(self) -> None:
        """Flush and let go of the connection."""


class KafkaDeltaSink:
    """A rank's producer on the delta-log topic (every message to the rank's own partition;
    the topic must exist).

    Args:
        settings: How to reach the cluster.
        topic: The delta-log topic (created with ``partitions`` if missing).
        rank: The publishing rank (the message key; partition ``rank % partitions``).
        signer: Signs every message (None: an unsigned log).
    """

    def __init__(self, settings: KafkaSettings, topic: str, rank: int,
                 signer: Signer | None = None) -> None:
        from kafka import KafkaProducer

        self.topic, self._signer = topic, signer
        self._producer = connect_with_retry(
            lambda: KafkaProducer(**settings.client_kwargs(), acks="all",
                                  enable_idempotence=True, linger_ms=5,
                                  batch_size=1 << 20, max_request_size=1 << 20),
            "delta-log producer", settings)
        parts = self._wait_for_partitions(topic)
        self.partition = rank % len(parts)
        self._key = str(rank).encode()
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._failed = Failed()
        self.sent_bytes = 0
        self.sent_messages = 0

    def _wait_for_partitions(self, topic: str) -> list[int]:
        """The topic's partitions (rank 0 may still be creating it)."""
        import time

        deadline = time.monotonic() + 60.0
        while True:
            parts = sorted(self._producer.partitions_for(topic) or [])
            if parts or time.monotonic() > deadline:
                if not parts:
                    raise RuntimeError(f"delta-log topic {topic!r} has no partitions after 60 s")
                return parts
            time.sleep(0.2)

    def send(self, payload: bytes, *, rows: np.ndarray | None = None,
             tombstones: np.ndarray | None = None) -> None:
        from kafka.errors import KafkaError

        try:
            future = self._producer.send(
                self.topic, value=payload, key=self._key, partition=self.partition,
                headers=self._signer.headers(payload) if self._signer is not None else None)
        except KafkaError as exc:  # no room in the buffer, or no metadata in max_block_ms
            self._failure(rows, tombstones, exc)
            return
        self.sent_bytes += len(payload)
        self.sent_messages += 1
        future.add_callback(self._stored)
        future.add_errback(lambda exc: self._failure(rows, tombstones, exc))

    def _stored(self, metadata: Any) -> None:
        with self._lock:
            p = int(metadata.partition)
            self._next[p] = max(self._next.get(p, 0), int(metadata.offset) + 1)

    def _failure(self, rows: np.ndarray | None, tombstones: np.ndarray | None,
                 exc: BaseException) -> None:
        with self._lock:
            if rows is not None:
                self._failed.rows.append(rows)
            if tombstones is not None:
                self._failed.tombstones.append(tombstones)
            self._failed.messages += 1
            self._failed.error = repr(exc)

    def acked(self) -> dict[int, int]:
        with self._lock:
            return dict(self._next)

    def flush(self) -> None:
        self._producer.flush()

    def take_failed(self) -> Failed:
        with self._lock:
            failed, self._failed = self._failed, Failed()
        return failed

    def close(self) -> None:
        try:
            self._producer.flush()
        finally:
            self._producer.close()


class MemorySink:
    """Messages kept in a list, offsets counted from 0 (unit tests of the publisher); with a
    ``signer``, each message's headers in ``headers``."""

    def __init__(self, topic: str = "memory.model", signer: Signer | None = None) -> None:
        self.topic, self._signer = topic, signer
        self.messages: list[bytes] = []
        self.headers: list[list[tuple[str, bytes]]] = []

    def send(self, payload: bytes, *, rows: np.ndarray | None = None,
             tombstones: np.ndarray | None = None) -> None:
        self.messages.append(payload)
        self.headers.append(self._signer.headers(payload) if self._signer is not None else [])

    def acked(self) -> dict[int, int]:
        return {0: len(self.messages)} if self.messages else {}

    def flush(self) -> None:
        pass

    def take_failed(self) -> Failed:
        return Failed()

    def close(self) -> None:
        pass
