"""The consumer and dead-letter adapters on librdkafka (confluent-kafka), where it is installed.

librdkafka fetches and decompresses on its own threads and hands Python whole messages, so a
poll costs a fraction of kafka-python's (``hetgmp bench ingest`` measures both). What differs
from kafka-python, and how it is met here:

* a consumer needs a ``group.id`` even when it never joins a group: a placeholder is given, and
  no offset is committed under it;
* positions: ``auto.offset.reset=error`` (an out-of-range position is an error, never a silent
  jump); starting offsets of partitions not fetched yet are passed to ``assign`` (librdkafka
  refuses ``seek`` on those), later moves use ``seek``;
* the topic id is not in librdkafka's metadata: it is asked of the admin API at start, every few
  seconds after, and before a poll's messages are handed on whenever the connection to a broker
  failed since the last look (a broker that lost its storage has the topic created again, with a
  new id, and its first fetches look like the old log's); high watermarks come from the fetch
  responses librdkafka keeps (``get_watermark_offsets(cached=True)``), nothing sent;
* librdkafka's log lines go to Python logging (and through its secret masking).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from hetgmp.runtime import Clock
from hetgmp.streaming.clients.base import (
    CommitError,
    CommitMoved,
    CommitRebalancing,
    ConsumerClient,
    DeadLetterSender,
    Fetched,
    Headers,
    NoPosition,
    Rebalance,
    RecordSender,
    SendFailed,
    TransientError,
)
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.positions import RESUME_HINT, ConsumerFailed, LogLost, topic_id_text

__all__ = ["ConfluentConsumer", "ConfluentDeadLetters", "ConfluentSender", "available"]

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("librdkafka")
# How often the topic id is asked again (one admin request).
_TOPIC_ID_EVERY_S = 5.0


def available() -> bool:
    """Whether confluent-kafka can be imported here."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def _uuid_text(value: Any) -> str | None:
    """A librdkafka Uuid as the UUID text kafka-python gives (checkpoints compare them)."""
    if value is None:
        return None
    msb, lsb = value.get_most_significant_bits(), value.get_least_significant_bits()
    if msb == 0 and lsb == 0:
        return None
    return topic_id_text(uuid.UUID(int=((msb & (2**64 - 1)) << 64) | (lsb & (2**64 - 1))))


def _base_config(kafka: KafkaSettings) -> dict[str, Any]:
    # Reconnects back off to 1 s at most (librdkafka's 10 s default left a restarted broker
    # unread for half a minute).
    return {**kafka.librdkafka_config(), "logger": _librdkafka_log,
            "reconnect.backoff.max.ms": 1000}


class ConfluentConsumer(ConsumerClient):
    """A librdkafka consumer of one topic."""

    name = "confluent"

    def __init__(self, kafka: KafkaSettings, topic: str, group: str | None, settings: Any,
                 clock: Clock, headers: bool = False) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        c = settings
        self.topic = topic
        self.kafka = kafka
        self.group = group
        self._clock = clock
        self._headers = headers
        config = {
            **_base_config(kafka),
            "group.id": group or f"hetgmp-no-group-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "allow.auto.create.topics": False,
            "session.timeout.ms": c.session_timeout_ms,
            "heartbeat.interval.ms": c.heartbeat_interval_ms,
            "max.poll.interval.ms": c.max_poll_interval_ms,
            "fetch.max.bytes": c.fetch_max_bytes,
            "max.partition.fetch.bytes": c.max_partition_fetch_bytes,
            # A fetch answers as soon as it has data; librdkafka's 500 ms wait adds latency.
            "fetch.wait.max.ms": c.fetch_wait_ms,
            "error_cb": self._on_error,
        }
        # A broker connection failed since the topic id was last looked at.
        self._suspect = False
        self._c = Consumer(config)
        self._admin = AdminClient(_base_config(kafka))
        self._assigned: set[int] = set()
        self._active: set[int] = set()  # partitions librdkafka fetches (seek allowed)
        self._held: set[int] = set()  # partitions asked to be held (hold)
        self._paused: set[int] = set()  # those paused in librdkafka now
        self._starts: dict[int, int] = {}  # positions of partitions not handed to librdkafka yet
        self._listener: Rebalance | None = None
        self._in_callback = False
        self._topic_id: str | None = None
        self._topic_id_at = -1e18
        self._refresh_topic_id(force=True)

    # -- topic id ---------------------------------------------------------------------------------

    def _on_error(self, err: Any) -> None:
        """librdkafka's error callback (served inside consume): a broker went away."""
        self._suspect = True
        log.debug("client error: %s", err)

    def _refresh_topic_id(self, force: bool = False, timeout_s: float = 5.0) -> bool:
        """Look the topic id up (when due, or ``force``); False if the broker did not answer
        within ``timeout_s``."""
        now = self._clock.monotonic()
        if not force and now - self._topic_id_at < _TOPIC_ID_EVERY_S:
            return True
        self._topic_id_at = now
        from confluent_kafka import KafkaException, TopicCollection

        try:
            timeout_s = max(timeout_s, 0.05)
            described = self._admin.describe_topics(
                TopicCollection([self.topic]), request_timeout=timeout_s)[self.topic].result(timeout_s)
        except KafkaException as exc:
            log.debug("topic id lookup failed: %s", exc)
            return False
        except Exception as exc:  # a timed out future, a broker going away
            log.debug("topic id lookup failed: %s: %s", type(exc).__name__, exc)
            return False
        self._topic_id = _uuid_text(getattr(described, "topic_id", None))
        return True

    def _verify(self, timeout_s: float) -> None:
        """After a broker connection failed: the topic id again, before any message is handed
        on (the guard compares it with the one the consumer started on)."""
        self._suspect = False
        if not self._refresh_topic_id(force=True, timeout_s=timeout_s):
            self._suspect = True
            raise TransientError("the broker came back but has not described the topic yet")

    # -- assignment -------------------------------------------------------------------------------

    def _tp(self, p: int, offset: int | None = None) -> Any:
        from confluent_kafka import TopicPartition

        return TopicPartition(self.topic, p) if offset is None else TopicPartition(self.topic, p, offset)

    def _hand_over(self) -> None:
        """Give librdkafka the assignment with the starting positions set so far."""
        from confluent_kafka import OFFSET_INVALID

        parts = sorted(self._assigned)
        self._c.assign([self._tp(p, self._starts.get(p, OFFSET_INVALID)) for p in parts])
        self._active = set(parts)
        self._starts = {}
        self._apply_held()

    def assign(self, partitions: Sequence[int]) -> None:
        self._assigned = set(partitions)
        self._active, self._paused = set(), set()

    can_hold = True

    def hold(self, partitions: set[int]) -> None:
        self._held = set(partitions)
        self._apply_held()

    def _apply_held(self) -> None:
        """Pause and resume what librdkafka fetches now to match :meth:`hold` (a partition it
        does not fetch yet is paused once it is handed over)."""
        want = self._held & self._active
        if want - self._paused:
            self._c.pause([self._tp(p) for p in sorted(want - self._paused)])
        if self._paused - want:
            self._c.resume([self._tp(p) for p in sorted(self._paused - want)])
        self._paused = want

    def subscribe(self, listener: Rebalance) -> None:
        self._listener = listener

        def on_assign(consumer: Any, tps: list[Any]) -> None:
            parts = {tp.partition for tp in tps if tp.topic == self.topic}
            self._assigned, self._active, self._in_callback = parts, set(), True
            self._paused = set()  # a new assignment starts unpaused
            try:
                try:
                    committed = self.committed(sorted(parts)) if parts else {}
                except Exception as exc:
                    log.warning("could not fetch committed offsets in the rebalance (%s)", exc)
                    committed = None
                listener.assigned(parts, committed)
            finally:
                self._in_callback = False
            self._hand_over()

        def on_revoke(consumer: Any, tps: list[Any]) -> None:
            parts = {tp.partition for tp in tps if tp.topic == self.topic}
            listener.revoked(parts)
            self._assigned -= parts
            self._active -= parts
            self._paused -= parts
            consumer.unassign()

        self._c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)

    def assignment(self) -> set[int]:
        return set(self._assigned)

    def committed(self, partitions: Sequence[int]) -> dict[int, int]:
        if self.group is None:
            return {}
        got = self._c.committed([self._tp(p) for p in partitions],
                                timeout=self.kafka.request_timeout_ms / 1000)
        return {tp.partition: tp.offset for tp in got if tp.error is None and tp.offset >= 0}

    def seek(self, partition: int, offset: int) -> None:
        if partition in self._active:
            self._c.seek(self._tp(partition, offset))
        else:
            self._starts[partition] = offset

    def seek_to(self, partitions: Sequence[int], where: Literal["earliest", "latest"]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

        for p in partitions:
            self.seek(p, OFFSET_BEGINNING if where == "earliest" else OFFSET_END)

    # -- reading ----------------------------------------------------------------------------------

    def poll(self, timeout_s: float, max_messages: int) -> Fetched:
        from confluent_kafka import KafkaError, KafkaException

        if self._listener is None and self._assigned != self._active:
            self._hand_over()
        elif self._starts and not self._in_callback:
            for p, off in list(self._starts.items()):  # sought before librdkafka had them
                if p in self._active:
                    self._c.seek(self._tp(p, off))
                    del self._starts[p]
        # A poll keeps to its timeout: a broker that does not answer is asked again next time.
        if self._suspect:
            self._verify(timeout_s)
        else:
            self._refresh_topic_id(timeout_s=min(timeout_s, 5.0))
        try:
            messages = self._consume(timeout_s, max_messages)
        except KafkaException as exc:
            raise self._failure(exc.args[0] if exc.args else None, exc) from exc
        if self._suspect and messages:
            try:
                self._verify(max(timeout_s, 1.0))
            except TransientError:
                self._rewind(messages)  # not handed on: fetched again once verified
                raise
        # One pass a field over the messages (a million a second want no Python loop body);
        # the few with an error (end of partition, fetch failures) are taken out first.
        errors = [m.error() for m in messages]
        if any(e is not None for e in errors):
            error = next((e for e in errors if e is not None
                          and e.code() != KafkaError._PARTITION_EOF), None)
            messages = [m for m, e in zip(messages, errors) if e is None]
            if error is not None and not messages:
                raise self._failure(error, None)
            if error is not None:
                log.warning("poll returned an error beside %d messages: %s", len(messages), error)
        n = len(messages)
        return Fetched(
            [m.value() for m in messages],
            np.fromiter((m.partition() for m in messages), np.int64, n),
            np.fromiter((m.offset() for m in messages), np.int64, n),
            np.fromiter((m.timestamp()[1] for m in messages), np.int64, n),
            [m.headers() or [] for m in messages] if self._headers else None,
        )

    def _consume(self, timeout_s: float, max_messages: int) -> list[Any]:
        """What librdkafka has queued, at once; else wait for the first message, then take what
        came with it. (``consume(n, timeout)`` alone waits out its timeout until it has ``n``
        messages: a poll of 8,192 on a topic of 196 took the whole second.)"""
        messages = self._c.consume(num_messages=max_messages, timeout=0)
        if messages:
            return messages
        messages = self._c.consume(num_messages=1, timeout=timeout_s)
        if messages and max_messages > 1:
            messages += self._c.consume(num_messages=max_messages - 1, timeout=0)
        return messages

    def _rewind(self, messages: list[Any]) -> None:
        first: dict[int, int] = {}
        for m in messages:
            if m.error() is None:
                first.setdefault(m.partition(), m.offset())
        for p, off in first.items():
            self._c.seek(self._tp(p, off))

    def _failure(self, err: Any, exc: Exception | None) -> Exception:
        from confluent_kafka import KafkaError

        code = err.code() if err is not None else None
        text = err.str() if err is not None else str(exc)
        if code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
            return LogLost(
                f"topic {self.topic!r} on {self.kafka.bootstrap_servers}: the position this "
                f"consumer reads from is outside the broker's log ({text}); the log was "
                "truncated or replaced and records may be missing. " + RESUME_HINT,
                topic=self.topic)
        if code == KafkaError._NO_OFFSET:
            return NoPosition(set(self._assigned))
        fatal = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                 KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION,
                 KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError._SSL}
        if code in fatal or (err is not None and err.fatal()):
            return ConsumerFailed(
                f"reading topic {self.topic!r} failed: {text} (check the credentials and ACLs "
                "given with the --kafka-* flags)")
        return TransientError(text)

    def observe(self, partitions: Iterable[int]) -> tuple[str | None, dict[int, int | None]]:
        highwaters: dict[int, int | None] = {}
        for p in partitions:
            if p not in self._active:
                continue
            try:
                _, high = self._c.get_watermark_offsets(self._tp(p), cached=True)
            except Exception:
                high = -1
            highwaters[p] = high if high is not None and high >= 0 else None
        return self._topic_id, highwaters

    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        from confluent_kafka import KafkaException

        out = {}
        for p in partitions:
            try:
                low, _ = self._c.get_watermark_offsets(
                    self._tp(p), timeout=self.kafka.request_timeout_ms / 1000, cached=False)
            except KafkaException as exc:
                raise self._failure(exc.args[0] if exc.args else None, exc) from exc
            out[p] = int(low)
        return out

    def commit(self, offsets: Mapping[int, int]) -> None:
        from confluent_kafka import KafkaError, KafkaException

        try:
            self._c.commit(offsets=[self._tp(p, o) for p, o in offsets.items()],
                           asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if err is not None else None
            if code in (KafkaError.REBALANCE_IN_PROGRESS, KafkaError._WAIT_COORD,
                        KafkaError.COORDINATOR_LOAD_IN_PROGRESS):
                raise CommitRebalancing(str(exc)) from exc
            if code in (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                        KafkaError._ASSIGNMENT_LOST, KafkaError._STATE):
                raise CommitMoved(str(exc)) from exc
            raise CommitError(str(exc)) from exc

    def close(self) -> None:
        self._c.close()


class ConfluentDeadLetters(DeadLetterSender):
    """Dead letters through a librdkafka producer, each delivery checked by its callback."""

    def __init__(self, kafka: KafkaSettings) -> None:
        from confluent_kafka import Producer

        self._p = Producer({**_base_config(kafka), "acks": "all", "linger.ms": 50})
        self._sent = 0
        self._failed = 0
        self._first: str | None = None

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failed += 1
            self._first = self._first or str(err)

    def send(self, topic: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        while True:
            try:
                self._p.produce(topic, value=value, headers=headers,  # type: ignore[arg-type]
                                on_delivery=self._delivered)
                break
            except BufferError:  # the local queue is full: serve callbacks, then try again
                self._p.poll(0.1)
        self._sent += 1
        self._p.poll(0)

    def flush(self, timeout_s: float) -> tuple[int, int, str | None]:
        left = self._p.flush(timeout_s)
        sent, failed, first = self._sent, self._failed + left, self._first
        if left and first is None:
            first = "not acknowledged in time"
        self._sent, self._failed, self._first = 0, 0, None
        return sent, failed, first

    def close(self) -> None:
        self._p.flush(5)


class ConfluentSender(RecordSender):
    """Messages through a librdkafka producer; a thread of its own serves the delivery reports,
    so the counts are current even while nothing is being sent (as kafka-python's I/O thread
    keeps them)."""

    # How long a send waits for room in librdkafka's queue before it fails.
    _FULL_WAIT_S = 60.0

    def __init__(self, kafka: KafkaSettings, topic: str, acks: str, idempotence: bool,
                 compression: str, on_result: Any, linger_ms: int = 20) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.kafka = kafka
        self._on_result = on_result
        # Tags of the messages whose report has not arrived, by message number: a fatal error
        # (librdkafka raises it from flush or poll) can leave some unreported, and close()
        # reports them as failed, so every message still has exactly one outcome.
        self._pending: dict[int, Any] = {}
        self._sent = 0
        self._fatal: str | None = None
        self._p = Producer({
            **_base_config(kafka),
            "acks": acks,
            "enable.idempotence": idempotence,
            "linger.ms": linger_ms,
            "batch.size": 1 << 20,
            "message.max.bytes": 16 << 20,
            "compression.type": compression,
            # A message not acknowledged within the request timeout fails (and is reported):
            # librdkafka's default, 5 minutes of retries, kept a run that had lost its broker
            # sending into the gap.
            "message.timeout.ms": kafka.request_timeout_ms,
        })
        self._closing = threading.Event()
        self._reports = threading.Thread(target=self._serve_reports, name="producer-reports",
                                         daemon=True)
        self._reports.start()

    def _serve_reports(self) -> None:
        from confluent_kafka import KafkaException

        while not self._closing.is_set():
            try:
                self._p.poll(0.05)
            except (KafkaException, SystemError) as exc:  # fatal: the next send fails,
                self._fatal_error(exc)                      # close() reports the rest

    def _fatal_error(self, exc: BaseException) -> None:
        # The binding raises a fatal error from poll or flush; a delivery report served in the
        # same call then fails with SystemError ("returned a result with an exception set"),
        # the KafkaException as its context: the fatal error is that one.
        if isinstance(exc, SystemError) and exc.__context__ is not None:
            exc = exc.__context__
        if self._fatal is None:
            self._fatal = str(exc.args[0] if exc.args else exc)
            log.error("the producer failed for good: %s", self._fatal)

    def partitions(self) -> int:
        metadata = self._p.list_topics(self.topic, timeout=self.kafka.request_timeout_ms / 1000)
        topic = metadata.topics.get(self.topic)
        return max(len(topic.partitions) if topic is not None else 0, 1)

    def send(self, value: bytes, partition: int, timestamp_ms: int | None, tag: Any, *,
             key: bytes | None = None, headers: Headers | None = None) -> None:
        from confluent_kafka import KafkaException

        number = self._sent
        self._sent += 1

        def delivered(err: Any, msg: Any) -> None:
            if number not in self._pending:
                return  # close() already reported it
            if err is None:
                self._on_result(tag, None, int(msg.offset()))
            else:  # after a fatal error, purged messages name it rather than the purge
                cause = str(err) if self._fatal is None else f"{self._fatal} (then: {err})"
                self._on_result(tag, RuntimeError(cause), -1)
            # Only once reported: a report that failed half way (see _fatal_error) leaves the
            # message pending, and close() reports it as failed.
            self._pending.pop(number, None)

        self._pending[number] = tag  # before produce(): its report may come on another thread
        pairs: list[tuple[str, str | bytes | None]] | None = (
            None if headers is None else [(k, v) for k, v in headers])
        waited = 0.0
        while True:
            try:
                self._p.produce(self.topic, value=value, key=key, partition=partition,
                                timestamp=timestamp_ms or 0, headers=pairs,
                                on_delivery=delivered)
                break
            except KafkaException as exc:  # a fatal producer error (idempotence state lost)
                del self._pending[number]
                raise SendFailed(str(exc.args[0] if exc.args else exc)) from exc
            except BufferError:  # the local queue is full: serve reports, then try again
                if waited >= self._FULL_WAIT_S:
                    del self._pending[number]
                    raise SendFailed(f"librdkafka's queue stayed full for {waited:.0f}s") from None
                time.sleep(0.05)  # the reports thread frees room
                waited += 0.05

    def flush(self, timeout_s: float) -> bool:
        return self._p.flush(timeout_s) == 0

    def close(self) -> None:
        from confluent_kafka import KafkaException

        try:
            left = self._p.flush(self.kafka.request_timeout_ms / 1000)
            if left:
                # Purged, each gets its delivery report (an error): counted as failed, not lost.
                log.warning("%d messages were still queued when the producer closed", left)
                self._p.purge()
                self._p.flush(1.0)
        except (KafkaException, SystemError) as exc:  # fatal (e.g. a restarted broker forgot
            self._fatal_error(exc)                      # our producer id)
            try:
                self._p.purge()
                self._p.flush(1.0)
            except (KafkaException, SystemError):
                pass  # the same fatal error again; what is left is reported below
        finally:
            self._closing.set()
            self._reports.join(timeout=5)
            unreported = [self._pending.pop(n, None) for n in list(self._pending)]
            if any(tag is not None for tag in unreported):
                error = SendFailed(self._fatal or "no delivery report before the producer closed")
                for tag in unreported:
                    if tag is not None:
                        self._on_result(tag, error, -1)
