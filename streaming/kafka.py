"""Kafka client settings and the few admin/connection helpers every component shares."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar

from hetgmp.runtime import Clock, SystemClock, redact, register_secret, secret

__all__ = [
    "ConnectStopped",
    "KafkaSettings",
    "KafkaUnavailable",
    "TopicNotFound",
    "connect_with_retry",
    "ensure_topic",
    "topic_partitions",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class KafkaUnavailable(RuntimeError):
    """No broker answered within the connect timeout."""


class ConnectStopped(KafkaUnavailable):
    """A stop was asked for (SIGINT, SIGTERM) while no broker had answered yet."""


class TopicNotFound(RuntimeError):
    """The topic does not exist on the cluster (and did not appear within the wait allowed)."""


class KafkaRefused(RuntimeError):
    """The cluster answered an admin request with an error (an ACL, a policy, a bad value)."""


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach the Kafka cluster; passed through to every kafka-python client.

    Secrets (SASL password, TLS key password) are masked in ``repr`` and in ``--help``.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "hetgmp"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_plain_username: str = ""
    sasl_plain_password: str = secret(help="SASL password (never logged)")
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_password: str = secret(help="password of the TLS key file (never logged)")
    request_timeout_ms: int = 30000
    bootstrap_timeout_ms: int = 5000

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python clients (empty settings left out)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()],
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            # Short bootstrap attempts: connect_with_retry owns the overall wait and its log lines.
            "bootstrap_timeout_ms": self.bootstrap_timeout_ms,
        }
        for name in (
            "sasl_mechanism",
            "sasl_plain_username",
            "sasl_plain_password",
            "ssl_cafile",
            "ssl_certfile",
            "ssl_keyfile",
            "ssl_password",
        ):
            value = getattr(self, name)
            if value:
                kwargs[name] = value
        self._register_secrets()
        return kwargs

    def _register_secrets(self) -> None:
        # Whichever client gets a secret may log it (kafka-python's admin client logs its whole
        # configuration at DEBUG): mask it in every log line from now on.
        for f in dataclasses.fields(self):
            if f.metadata.get("secret"):
                register_secret(getattr(self, f.name))

    def librdkafka_config(self) -> dict[str, Any]:
        """The same settings under librdkafka's names (confluent-kafka clients)."""
        config: dict[str, Any] = {
            "bootstrap.servers": ",".join(s.strip() for s in self.bootstrap_servers.split(",")
                                          if s.strip()),
            "client.id": self.client_id,
            "security.protocol": self.security_protocol.lower(),
            "socket.timeout.ms": self.request_timeout_ms,
        }
        names = {"sasl_mechanism": "sasl.mechanism", "sasl_plain_username": "sasl.username",
                 "sasl_plain_password": "sasl.password", "ssl_cafile": "ssl.ca.location",
                 "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
                 "ssl_password": "ssl.key.password"}
        for name, key in names.items():
            if value := getattr(self, name):
                config[key] = value
        self._register_secrets()
        return config

    def describe(self) -> str:
        """A one-line description safe for logs."""
        d = redact(self)
        return ", ".join(f"{k}={v}" for k, v in d.items() if v not in ("", None))


def connect_with_retry(
    factory: Callable[[], T],
    what: str,
    settings: KafkaSettings,
    timeout_s: float = 300.0,
    clock: Clock | None = None,
    initial_backoff_s: float = 0.5,
    max_backoff_s: float = 10.0,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Call ``factory`` until the cluster answers; exponential backoff with a log line per try.

    ``stop`` (e.g. a signal's stop flag) is looked at before every try and through every wait:
    a program asked to stop while the broker is unreachable (or refuses it) ends within one
    try (``bootstrap_timeout_ms``) instead of retrying for ``timeout_s``.

    Raises:
        KafkaUnavailable: when ``timeout_s`` passes without a connection.
        ConnectStopped: ``stop`` became true first.
    """
    import kafka.errors as ke

    # kafka-python 2.x raises NoBrokersAvailable, 3.x a KafkaTimeoutError ("Unable to bootstrap").
    unreachable = tuple(
        getattr(ke, name)
        for name in ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError")
        if hasattr(ke, name)
    )

    clock = clock or SystemClock()
    deadline = clock.monotonic() + timeout_s
    backoff = initial_backoff_s
    attempt = 1
    last: BaseException | None = None
    while True:
        if stop is not None and stop():
            raise ConnectStopped(
                f"{what}: stopped while waiting for a Kafka broker at "
                f"{settings.bootstrap_servers} ({_tries(attempt - 1)} unanswered"
                + (f"; last error: {last}" if last is not None else "") + ")")
        try:
            return factory()
        except unreachable as exc:
            last = exc
            if stop is not None and stop():
                attempt += 1
                continue  # said at the top of the loop, with the error
            if clock.monotonic() + backoff > deadline:
                raise KafkaUnavailable(
                    f"{what}: no Kafka broker answered at {settings.bootstrap_servers} "
                    f"within {timeout_s:.0f}s (last error: {exc})"
                ) from exc
            log.warning(
                "%s: Kafka not reachable at %s (attempt %d: %s); retrying in %.1fs",
                what,
                settings.bootstrap_servers,
                attempt,
                type(exc).__name__,
                backoff,
            )
            _pause(clock, backoff, stop)
            backoff = min(backoff * 2, max_backoff_s)
            attempt += 1


def _tries(n: int) -> str:
    return f"{n} try" if n == 1 else f"{n} tries"


def _pause(clock: Clock, seconds: float, stop: Callable[[], bool] | None) -> None:
    """Sleep ``seconds``, in short naps when ``stop`` may cut the wait."""
    if stop is None:
        clock.sleep(seconds)
        return
    end = clock.monotonic() + seconds
    while not stop() and (left := end - clock.monotonic()) > 0:
        clock.sleep(min(left, 0.1))


# Partitions a topic may be created with. librdkafka refuses metadata of a topic with more than
# 100,000 (RD_KAFKAP_PARTITIONS_MAX): one such topic breaks every librdkafka client of the
# broker, and the embedded broker kept ~1.2 GB after a 1,000,000-partition topic was deleted.
# A topic past 10,000 is a typo here (a trainer reads a share of them per rank).
MAX_PARTITIONS = 10_000


def check_partitions(partitions: int) -> None:
    """Refuse a partition count outside 1..:data:`MAX_PARTITIONS`.

    Raises:
        ValueError: The message says why.
    """
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"{partitions} partitions: a topic is created with 1 to "
                         f"{MAX_PARTITIONS:,} (past 100,000 librdkafka clients of the broker "
                         "can no longer read its metadata)")


def ensure_topic(
    settings: KafkaSettings,
    topic: str,
    partitions: int,
    replication_factor: int = 1,
    timeout_s: float = 60.0,
    stop: Callable[[], bool] | None = None,
) -> bool:
    """Create ``topic`` with ``partitions`` partitions if missing; True if it was created.

    ``stop``: ends the wait for a broker early (see :func:`connect_with_retry`).

    Raises:
        ValueError: ``partitions`` outside 1..:data:`MAX_PARTITIONS` (nothing is created).
        KafkaRefused: the cluster refused to list or create topics.
        ConnectStopped: ``stop`` became true while no broker answered.
    """
    check_partitions(partitions)
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    admin = connect_with_retry(
        lambda: KafkaAdminClient(**settings.client_kwargs()), "admin", settings, timeout_s,
        stop=stop)
    try:
        if topic in admin.list_topics():
            return False
        try:
            admin.create_topics(
                [NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)]
            )
        except TopicAlreadyExistsError:
            return False
        log.info("created topic %s with %d partitions", topic, partitions)
        return True
    except KafkaError as exc:
        raise KafkaRefused(f"creating topic {topic!r} on {settings.bootstrap_servers}: "
                           f"{type(exc).__name__}: {exc}") from exc
    finally:
        admin.close()


def topic_partitions(
    settings: KafkaSettings,
    topic: str,
    wait_s: float = 0.0,
    clock: Clock | None = None,
    connect_timeout_s: float = 300.0,
    stop: Callable[[], bool] | None = None,
) -> set[int]:
    """The partition ids of ``topic``, without creating it.

    The admin client's metadata request never asks for auto-creation, unlike a consumer's
    (Tansu creates a topic a consumer merely asks about), so a missing topic is seen as missing.

    Args:
        settings: how to reach the cluster.
        topic: the topic to look up.
        wait_s: how long to wait for the topic to appear (0 = report it missing at once).
        clock: time source for the wait (tests pass a fake one).
        connect_timeout_s: how long to wait for a broker to answer at all.
        stop: ends the waits early (see :func:`connect_with_retry`).

    Raises:
        TopicNotFound: ``topic`` does not exist after ``wait_s`` seconds (or a stop came
            first).
        KafkaUnavailable: no broker answered within ``connect_timeout_s``.
        ConnectStopped: ``stop`` became true while no broker answered.
    """
    from kafka.admin import KafkaAdminClient

    clock = clock or SystemClock()
    admin = connect_with_retry(
        lambda: KafkaAdminClient(**settings.client_kwargs()), "admin", settings, connect_timeout_s, clock,
        stop=stop)
    try:
        deadline = clock.monotonic() + wait_s
        waiting = False
        while True:
            # All topics (no names) so that the request cannot create the one asked about.
            described = {t["name"]: t for t in admin.describe_topics()}
            found = described.get(topic)
            if found is not None and found.get("partitions"):
                return {int(p["partition_index"]) for p in found["partitions"]}
            if clock.monotonic() >= deadline or (stop is not None and stop()):
                others = sorted(name for name in described if not name.startswith("__"))
                shown = ", ".join(others[:10]) + (", ..." if len(others) > 10 else "")
                raise TopicNotFound(
                    f"topic {topic!r} does not exist on {settings.bootstrap_servers}"
                    + (f" (after waiting {wait_s:g}s)" if wait_s > 0 else "")
                    + f"; topics there: {shown or 'none'}. `hetgmp produce` creates it, or let the "
                    "consumer wait for it to appear (topic_wait_s, --consumer-topic-wait-s)"
                )
            if not waiting:  # once: a line a second would bury the rest of the log
                log.warning("topic %s does not exist on %s yet; waiting up to %.0fs for it",
                            topic, settings.bootstrap_servers, wait_s)
                waiting = True
            _pause(clock, min(1.0, max(deadline - clock.monotonic(), 0.0)), stop)
    finally:
        admin.close()
