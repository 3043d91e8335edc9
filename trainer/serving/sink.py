"""Where a rank's publishes go: the delta-log topic, through the project's Kafka producer
(:func:`hetgmp.streaming.clients.record_sender`: librdkafka where installed, else kafka-python).

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
from typing import Protocol

import numpy as np

from hetgmp.streaming import KafkaSettings, topic_partitions
from hetgmp.streaming.clients import SendFailed, record_sender
from hetgmp.trainer.serving.signing import Signer

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
        topic: The delta-log topic (rank 0 may still be creating it: waited for up to 60 s).
        rank: The publishing rank (the message key; partition ``rank % partitions``).
        signer: Signs every message (None: an unsigned log).
        client: Kafka client library (``auto``: librdkafka where installed).
    """

    #: How long a message may wait for others to share its request: a publish is one message
    #: a rank, so this is latency, not batching.
    LINGER_MS = 5

    def __init__(self, settings: KafkaSettings, topic: str, rank: int,
                 signer: Signer | None = None, client: str = "auto") -> None:
        self.topic, self._signer = topic, signer
        parts = sorted(topic_partitions(settings, topic, wait_s=60.0))
        self.partition = parts[rank % len(parts)]
        self._key = str(rank).encode()
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._failed = Failed()
        self.sent_bytes = 0
        self.sent_messages = 0
        self._sender = record_sender(client, settings, topic, acks="all", idempotence=True,
                                     compression="none", on_result=self._result,
                                     linger_ms=self.LINGER_MS)

    def send(self, payload: bytes, *, rows: np.ndarray | None = None,
             tombstones: np.ndarray | None = None) -> None:
        headers = self._signer.headers(payload) if self._signer is not None else None
        try:
            self._sender.send(payload, self.partition, None, (rows, tombstones), key=self._key,
                              headers=headers)
        except SendFailed as exc:  # no room in the buffer, or no metadata in time
            self._failure(rows, tombstones, exc)
            return
        self.sent_bytes += len(payload)
        self.sent_messages += 1

    def _result(self, tag: tuple[np.ndarray | None, np.ndarray | None],
                error: BaseException | None, offset: int) -> None:
        if error is not None:
            self._failure(*tag, error)
            return
        with self._lock:
            self._next[self.partition] = max(self._next.get(self.partition, 0), offset + 1)

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
        # Every message gets its result within the client's request timeout: the loop ends.
        waited = 0
        while not self._sender.flush(5.0):
            waited += 5
            log.warning("the delta log has messages without an answer after %d s", waited)

    def take_failed(self) -> Failed:
        with self._lock:
            failed, self._failed = self._failed, Failed()
        return failed

    def close(self) -> None:
        self._sender.close()


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
