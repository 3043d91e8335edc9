"""Follow the delta log into a :class:`ServingModel`, from the offsets its checkpoint covers.

One consumer (:func:`hetgmp.streaming.clients.connect_consumer`: librdkafka where installed), no group
(every serve process reads every partition, so several can follow one log), assigned the
topic's partitions and positioned at the checkpoint's offsets (a partition the checkpoint does
not name: from its beginning; deltas of other runs there carry another lineage and are
ignored). :meth:`Follower.poll_once` reads what is there and applies it in
partition order; :class:`FollowerThread` does that until stopped.

*Caught up* means every partition's position (the offset after the last message read) has
reached the high watermark the broker reported in a fetch (not the latest offset, which this
broker answers with the last batch's base offset).

No message stops the follower or reaches the model unchecked (:class:`DeltaGate`): it is decoded
and checked alone (:func:`~hetgmp.trainer.serving.deltas.decode`), its signature verified on a signed
log, checked against the model (:meth:`ServingModel.check`), and only then applied; a message
refused anywhere on the way is counted by reason, logged the first time a reason is seen, and
skipped, and the model keeps what it held.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from hetgmp.runtime import SystemClock
from hetgmp.streaming import ConsumerConfig, KafkaSettings, topic_partitions
from hetgmp.streaming.clients import connect_consumer
from hetgmp.trainer.serving.deltas import REJECT_REASONS, Rejected, decode
from hetgmp.trainer.serving.model import ServingModel
from hetgmp.trainer.serving.signing import Signer

__all__ = ["DeltaGate", "Follower", "FollowerStats", "FollowerThread"]

log = logging.getLogger(__name__)


@dataclass
class FollowerStats:
    """What the follower has read."""

    messages: int = 0
    bytes: int = 0
    polls: int = 0
    caught_up: bool = False
    error: str = ""
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))


# How long the broker may hold a fetch that finds nothing new. kafka-python's 500 ms default
# put up to 0.2 s between a delta's append and its application on the embedded broker (p99
# 0.21 s against 0.03 s at 50 ms, a message every 123 ms): a quarter of the whole freshness
# budget at a 0.25 s publish interval, for 20 fetch requests a second when the log is idle.
_FETCH_WAIT_MS = 50


class DeltaGate:
    """Everything between a message of the log and the model: decode, verify, check, apply.

    Args:
        model: What accepted deltas are applied to.
        stats: Where messages and refusals are counted.
        signer: Verifies signatures (None: an unsigned log).
    """

    def __init__(self, model: ServingModel, stats: FollowerStats,
                 signer: Signer | None = None) -> None:
        self.model, self.stats, self.signer = model, stats, signer

    def receive(self, payload: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None,
                where: str) -> bool:
        """Apply one message if it passes every check; whether it was applied.

        Args:
            payload: The message's value.
            headers: Its Kafka headers.
            where: Where it was read (``topic[partition]@offset``), for the log.
        """
        self.stats.messages += 1
        self.stats.bytes += len(payload or b"")
        try:
            if self.signer is not None:
                self.signer.verify(payload, headers)
            self.model.apply(decode(payload))
        except Rejected as exc:
            first = self.stats.rejected[exc.reason] == 0
            self.stats.rejected[exc.reason] += 1
            if first:  # once per reason: a flood of bad messages must not flood the log
                log.warning("delta %s rejected (%s): %s; further deltas rejected for this "
                            "reason are counted in hetgmp_serve_deltas_rejected_total only",
                            where, exc.reason, exc.detail)
            return False
        return True


class Follower:
    """The delta log's consumer for one :class:`ServingModel`.

    Args:
        settings: How to reach the cluster.
        topic: The delta-log topic.
        model: What the deltas are applied to.
        offsets: Where to start, by partition (the checkpoint's ``model.offsets``).
        topic_wait_s: How long to wait for the topic to exist.
        signer: Verifies every message's signature (None: an unsigned log).
    """

    def __init__(self, settings: KafkaSettings, topic: str, model: ServingModel,
                 offsets: dict[int, int], topic_wait_s: float = 60.0,
                 signer: Signer | None = None, client: str = "auto") -> None:
        self.topic, self.model = topic, model
        self.stats = FollowerStats()
        self.gate = DeltaGate(model, self.stats, signer)
        self._parts = sorted(topic_partitions(settings, topic, wait_s=topic_wait_s))
        config = ConsumerConfig(topic=topic, group_id="", client=client,  # type: ignore[arg-type]
                                max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20,
                                fetch_wait_ms=_FETCH_WAIT_MS)
        self._consumer = connect_consumer(client, settings, topic, None, config, SystemClock(),
                                          headers=True)
        self._consumer.assign(self._parts)
        missing = [p for p in self._parts if offsets.get(p) is None]
        begin = self._consumer.earliest(missing) if missing else {}
        # The next offset to read of each partition: where it starts, then past what was read.
        self._position = {p: offsets[p] if p not in begin else begin[p] for p in self._parts}
        for p, start in self._position.items():
            self._consumer.seek(p, start)

    def poll_once(self, timeout_s: float = 0.2) -> int:
        """Read and apply what the log holds now (up to one fetch); the messages applied."""
        got = self._consumer.poll(timeout_s, 4096)
        self.stats.polls += 1
        n = 0
        headers = got.headers or []
        # In partition order; a partition's messages come in offset order.
        for i in np.argsort(got.partitions, kind="stable").tolist():
            p, offset = int(got.partitions[i]), int(got.offsets[i])
            n += self.gate.receive(got.values[i], headers[i], f"{self.topic}[{p}]@{offset}")
            self._position[p] = offset + 1
        if not self.stats.caught_up and self._at_end():
            self.stats.caught_up = True
            log.info("caught up with %s: %d deltas applied", self.topic, self.model.applied.deltas)
        return n

    def _at_end(self) -> bool:
        return self.lag_messages() == 0

    def lag_messages(self) -> int:
        """Messages the broker has reported that are not applied yet (-1: not known)."""
        _, highs = self._consumer.observe(self._parts)
        lag = 0
        for p in self._parts:
            high = highs.get(p)
            if high is None:
                return -1
            lag += max(0, high - self._position[p])
        return lag

    def catch_up(self, timeout_s: float = 60.0) -> None:
        """Poll until caught up with what the log held when called (tests, benchmarks)."""
        deadline = time.monotonic() + timeout_s
        self.stats.caught_up = False
        while not self.stats.caught_up:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not caught up with {self.topic} in {timeout_s:g} s "
                                   f"({self.lag_messages()} messages behind)")
            self.poll_once()

    def close(self) -> None:
        """Let go of the consumer."""
        self._consumer.close()


class FollowerThread(threading.Thread):
    """:meth:`Follower.poll_once` until :meth:`stop`.

    A poll that fails (the broker gone, the log truncated under its position) does not end
    it: the error is kept in the stats (``/healthz`` answers 503 with it) and the poll is
    retried after a pause that doubles up to :attr:`MAX_BACKOFF_S`; the first poll that
    succeeds clears it.
    """

    MAX_BACKOFF_S = 30.0

    def __init__(self, follower: Follower) -> None:
        super().__init__(name="delta-log-follower", daemon=True)
        self.follower = follower
        self._halt = threading.Event()

    def run(self) -> None:
        stats, pause = self.follower.stats, 0.5
        try:
            while not self._halt.is_set():
                try:
                    self.follower.poll_once()
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    if error != stats.error:
                        log.exception("the delta-log follower cannot read the log; retrying "
                                      "every %g s at most", self.MAX_BACKOFF_S)
                    stats.error = error
                    self._halt.wait(pause)
                    pause = min(2 * pause, self.MAX_BACKOFF_S)
                    continue
                if stats.error:
                    log.info("the delta-log follower reads the log again")
                    stats.error, pause = "", 0.5
        finally:
            self.follower.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask it to stop and wait."""
        self._halt.set()
        self.join(timeout_s)
