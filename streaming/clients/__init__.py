"""Kafka client libraries behind one interface, for every consumer and producer of the project
(click logs, dead letters, the delta log and its followers): kafka-python (pure Python, always
there) and librdkafka's confluent-kafka (optional extra ``librdkafka``; several times faster
per message). ``client="auto"`` picks confluent-kafka where it is installed."""

from __future__ import annotations

from typing import Any, Callable

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

__all__ = [
    "CLIENTS",
    "CommitError",
    "CommitMoved",
    "CommitRebalancing",
    "ConsumerClient",
    "DeadLetterSender",
    "Fetched",
    "Headers",
    "NoPosition",
    "Rebalance",
    "RecordSender",
    "SendFailed",
    "TransientError",
    "connect_consumer",
    "dead_letter_sender",
    "record_sender",
    "resolve",
]

CLIENTS = ("auto", "kafka-python", "confluent")


def resolve(name: str) -> str:
    """The library ``name`` means here: ``auto`` is confluent-kafka when it can be imported.

    Raises:
        ValueError: an unknown name, or ``confluent`` where it is not installed.
    """
    from hetgmp.streaming.clients.confluent import available

    if name not in CLIENTS:
        raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {name!r}")
    if name == "auto":
        return "confluent" if available() else "kafka-python"
    if name == "confluent" and not available():
        raise ValueError("client 'confluent' needs confluent-kafka: pip install 'hetgmp-stream"
                         "[librdkafka]' (or confluent-kafka), or use --consumer-client kafka-python")
    return name


def connect_consumer(name: str, kafka: KafkaSettings, topic: str, group: str | None,
                     settings: Any, clock: Clock, *, headers: bool = False,
                     stop: Callable[[], bool] | None = None) -> ConsumerClient:
    """A connected consumer of ``topic`` on library ``name`` (resolved); ``settings`` a
    :class:`~hetgmp.streaming.consumer.ConsumerConfig`; ``headers``: read each message's headers;
    ``stop``: ends a wait for an unreachable broker early (librdkafka's does not wait)."""
    if resolve(name) == "confluent":
        from hetgmp.streaming.clients.confluent import ConfluentConsumer

        return ConfluentConsumer(kafka, topic, group, settings, clock, headers)
    from hetgmp.streaming.clients.kafka_python import KafkaPythonConsumer

    return KafkaPythonConsumer.connect(kafka, topic, group, settings, clock, headers, stop)


def dead_letter_sender(name: str, kafka: KafkaSettings) -> DeadLetterSender:
    """A dead-letter producer on library ``name`` (resolved)."""
    if resolve(name) == "confluent":
        from hetgmp.streaming.clients.confluent import ConfluentDeadLetters

        return ConfluentDeadLetters(kafka)
    from hetgmp.streaming.clients.kafka_python import KafkaPythonDeadLetters

    return KafkaPythonDeadLetters(kafka)


def record_sender(name: str, kafka: KafkaSettings, topic: str, *, acks: str, idempotence: bool,
                  compression: str, on_result: Any, linger_ms: int = 20,
                  stop: Callable[[], bool] | None = None) -> RecordSender:
    """A producer of ``topic`` on library ``name`` (resolved); see :class:`RecordSender`.
    ``linger_ms``: how long a message waits for others to share its request; ``stop``: ends a
    wait for an unreachable broker early."""
    if resolve(name) == "confluent":
        from hetgmp.streaming.clients.confluent import ConfluentSender

        return ConfluentSender(kafka, topic, acks, idempotence, compression, on_result, linger_ms)
    from hetgmp.streaming.clients.kafka_python import KafkaPythonSender

    return KafkaPythonSender(kafka, topic, acks, idempotence, compression, on_result, linger_ms,
                             stop)
