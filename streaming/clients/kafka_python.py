"""The consumer and dead-letter adapters on kafka-python (pure Python; always installed)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

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
from hetgmp.streaming.kafka import KafkaSettings, connect_with_retry
from hetgmp.streaming.positions import ConsumerFailed, out_of_range, topic_id_text

__all__ = ["KafkaPythonConsumer", "KafkaPythonDeadLetters", "KafkaPythonSender"]

log = logging.getLogger(__name__)


def _is_fatal(exc: Exception) -> bool:
    """Kafka errors a poll retry cannot cure: the cluster refuses this client."""
    from kafka.errors import AuthorizationError, SaslAuthenticationFailedError, UnsupportedVersionError

    return isinstance(exc, (AuthorizationError, SaslAuthenticationFailedError,
                            UnsupportedVersionError))


class KafkaPythonConsumer(ConsumerClient):
    """A ``KafkaConsumer`` of one topic, auto-commit and kafka-python's own offset reset off."""

    name = "kafka-python"

    def __init__(self, consumer: Any, topic: str, kafka: KafkaSettings,
                 headers: bool = False) -> None:
        """Wrap a consumer already made (tests pass fakes); :meth:`connect` makes one."""
        self._c = consumer
        self.topic = topic
        self.kafka = kafka
        self._headers = headers

    @classmethod
    def connect(cls, kafka: KafkaSettings, topic: str, group: str | None, settings: Any,
                clock: Clock, headers: bool = False,
                stop: Callable[[], bool] | None = None) -> KafkaPythonConsumer:
        """Connect, retrying while no broker answers (until ``stop`` says so). ``settings``: a
        ConsumerConfig."""
        from kafka import KafkaConsumer

        c = settings
        kwargs = dict(
            kafka.client_kwargs(),
            group_id=group,
            enable_auto_commit=False,
            # Not earliest/latest: kafka-python would move a position that fell off the log to
            # the other end without a word. The consumer resolves starting positions itself,
            # and out of range becomes LogLost.
            auto_offset_reset="none",
            allow_auto_create_topics=False,
            session_timeout_ms=c.session_timeout_ms,
            heartbeat_interval_ms=c.heartbeat_interval_ms,
            max_poll_interval_ms=c.max_poll_interval_ms,
            fetch_max_bytes=c.fetch_max_bytes,
            max_partition_fetch_bytes=c.max_partition_fetch_bytes,
            fetch_max_wait_ms=c.fetch_wait_ms,
        )
        consumer = connect_with_retry(lambda: KafkaConsumer(**kwargs), "consumer", kafka,
                                      c.connect_timeout_s, clock, stop=stop)
        self = cls(consumer, topic, kafka, headers)
        # The topic id arrives with this consumer's own metadata (the topic exists: asking is
        # safe; on Tansu a metadata request for a missing topic creates it).
        consumer.partitions_for_topic(topic)
        return self

    def _tp(self, p: int) -> Any:
        from kafka import TopicPartition

        return TopicPartition(self.topic, p)

    def assign(self, partitions: Sequence[int]) -> None:
        self._c.assign([self._tp(p) for p in partitions])

    def subscribe(self, listener: Rebalance) -> None:
        from kafka import AsyncConsumerRebalanceListener

        owner = self

        # Async, because the callbacks run on kafka-python's network thread, where only the
        # coroutine variant of the committed-offset lookup may run.
        class Listener(AsyncConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                listener.revoked({tp.partition for tp in revoked})

            async def on_partitions_assigned(self, assigned: Any) -> None:
                parts = {tp.partition for tp in assigned}
                committed = await owner._committed_async(assigned) if assigned else {}
                listener.assigned(parts, committed)

        self._c.subscribe([self.topic], listener=Listener())

    async def _committed_async(self, tps: Iterable[Any]) -> dict[int, int] | None:
        """The committed offsets from inside a rebalance callback (None if not answered): the
        blocking ``committed()`` refuses to run on the network thread."""
        try:
            offsets = await self._c._coordinator.fetch_committed_offsets_async(
                set(tps), timeout_ms=self.kafka.request_timeout_ms)
        except Exception as exc:  # whatever failed, kafka-python looks them up itself
            log.warning("could not fetch committed offsets in the rebalance (%s: %s); "
                        "kafka-python will fetch them before reading", type(exc).__name__, exc)
            return None
        return {tp.partition: om.offset for tp, om in offsets.items()
                if om is not None and om.offset >= 0}

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._c.assignment() if tp.topic == self.topic}

    def committed(self, partitions: Sequence[int]) -> dict[int, int]:
        out = {}
        for p in partitions:
            off = self._c.committed(self._tp(p), timeout_ms=self.kafka.request_timeout_ms)
            if off is not None and off >= 0:
                out[p] = off
        return out

    def seek(self, partition: int, offset: int) -> None:
        self._c.seek(self._tp(partition), offset)

    def seek_to(self, partitions: Sequence[int], where: Literal["earliest", "latest"]) -> None:
        tps = [self._tp(p) for p in partitions]
        if where == "earliest":
            self._c.seek_to_beginning(*tps)
        else:
            self._c.seek_to_end(*tps)

    def poll(self, timeout_s: float, max_messages: int) -> Fetched:
        from kafka.errors import (
            KafkaError,
            LogTruncationError,
            NoOffsetForPartitionError,
            OffsetOutOfRangeError,
        )

        try:
            polled = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_messages)
        except (OffsetOutOfRangeError, LogTruncationError) as exc:
            raise out_of_range(self.topic, self.kafka.bootstrap_servers, exc) from exc
        except NoOffsetForPartitionError as exc:
            missing = exc.args[0] if exc.args and isinstance(exc.args[0], (set, frozenset)) else set()
            raise NoPosition({tp.partition for tp in missing if tp.topic == self.topic}) from exc
        except KafkaError as exc:
            if _is_fatal(exc):  # retrying cannot help: say so instead of reading nothing
                raise ConsumerFailed(
                    f"reading topic {self.topic!r} failed: {type(exc).__name__}: {exc} "
                    "(check the credentials and ACLs given with the --kafka-* flags)") from exc
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        records = [r for recs in polled.values() for r in recs]
        return Fetched.of([r.value for r in records], [r.partition for r in records],
                          [r.offset for r in records], [r.timestamp for r in records],
                          [list(r.headers or []) for r in records] if self._headers else None)

    def observe(self, partitions: Iterable[int]) -> tuple[str | None, dict[int, int | None]]:
        # kafka-python keeps the topic id (from Metadata v10+) only in its cluster metadata.
        topic_id = topic_id_text(self._c._client.cluster.topic_id(self.topic))
        assigned = self.assignment()
        return topic_id, {p: self._c.highwater(self._tp(p)) for p in partitions if p in assigned}

    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        from kafka.errors import KafkaError

        tps = [self._tp(p) for p in partitions]
        try:
            low = self._c.beginning_offsets(tps)
        except KafkaError as exc:
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        return {tp.partition: int(low[tp]) for tp in tps}

    def commit(self, offsets: Mapping[int, int]) -> None:
        from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
        from kafka.structs import OffsetAndMetadata

        try:
            self._c.commit(offsets={self._tp(p): OffsetAndMetadata(o, "", -1)
                                    for p, o in offsets.items()})
        except RebalanceInProgressError as exc:
            raise CommitRebalancing(str(exc)) from exc
        except CommitFailedError as exc:
            raise CommitMoved(str(exc)) from exc
        except KafkaError as exc:
            raise CommitError(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._c.close(autocommit=False)


class KafkaPythonDeadLetters(DeadLetterSender):
    """Dead letters through a ``KafkaProducer`` (acks from all in-sync replicas)."""

    def __init__(self, kafka: KafkaSettings, producer: Any = None) -> None:
        if producer is None:
            from kafka import KafkaProducer

            producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=50, acks="all")
        self._p = producer
        self._sent: list[Any] = []  # futures not yet checked

    def send(self, topic: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self._sent.append(self._p.send(topic, value=value, headers=headers))

    def flush(self, timeout_s: float) -> tuple[int, int, str | None]:
        self._p.flush(timeout=timeout_s)
        sent, self._sent = self._sent, []
        failed = [f for f in sent if not f.is_done or f.failed()]
        first = None
        if failed:
            f = failed[0]
            first = "not acknowledged in time" if not f.is_done else repr(f.exception)
        return len(sent), len(failed), first

    def close(self) -> None:
        self._p.close(timeout=5)


class KafkaPythonSender(RecordSender):
    """Messages through a ``KafkaProducer``; two callbacks a message, no future kept."""

    def __init__(self, kafka: KafkaSettings, topic: str, acks: str, idempotence: bool,
                 compression: str, on_result: Any, linger_ms: int = 20,
                 stop: Callable[[], bool] | None = None) -> None:
        from kafka import KafkaProducer

        self.topic = topic
        self._on_result = on_result
        self._p = connect_with_retry(
            lambda: KafkaProducer(
                **kafka.client_kwargs(),
                linger_ms=linger_ms,
                batch_size=1 << 20,
                max_request_size=16 << 20,
                acks="all" if acks == "all" else int(acks),
                enable_idempotence=idempotence,
                compression_type=None if compression == "none" else compression,
            ),
            "producer",
            kafka,
            stop=stop,
        )

    def partitions(self) -> int:
        return max(len(self._p.partitions_for(self.topic) or []), 1)

    def send(self, value: bytes, partition: int, timestamp_ms: int | None, tag: Any, *,
             key: bytes | None = None, headers: Headers | None = None) -> None:
        from kafka.errors import KafkaError

        try:
            future = self._p.send(self.topic, value=value, key=key, partition=partition,
                                  timestamp_ms=timestamp_ms, headers=headers)
        except KafkaError as exc:  # no room in the buffer or no metadata in max_block_ms
            raise SendFailed(f"{type(exc).__name__}: {exc}") from exc
        future.add_callback(lambda metadata: self._on_result(tag, None, int(metadata.offset)))
        future.add_errback(lambda exc: self._on_result(tag, exc, -1))

    def flush(self, timeout_s: float) -> bool:
        from kafka.errors import KafkaTimeoutError

        try:
            self._p.flush(timeout=timeout_s)
        except KafkaTimeoutError:
            return False
        return True

    def close(self) -> None:
        try:
            self._p.flush()
        finally:
            self._p.close()
