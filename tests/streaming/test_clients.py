"""The client layer's pure parts: settings under librdkafka's names, library resolution, the
fetched-messages container, topic ids in one spelling."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

from hetgmp.runtime.logs import redact_text as mask
from hetgmp.streaming.clients import Fetched, resolve
from hetgmp.streaming.clients.confluent import _uuid_text, available
from hetgmp.streaming.kafka import KafkaSettings


def test_settings_reach_librdkafka_under_its_names_and_the_secrets_are_masked():
    k = KafkaSettings(bootstrap_servers="a:1, b:2", security_protocol="SASL_SSL",
                      sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="u",
                      sasl_plain_password="pw-123-secret", ssl_cafile="/ca.pem",
                      ssl_password="key-secret-9")
    c = k.librdkafka_config()
    assert c["bootstrap.servers"] == "a:1,b:2" and c["security.protocol"] == "sasl_ssl"
    assert (c["sasl.mechanism"], c["sasl.username"], c["sasl.password"]) == (
        "SCRAM-SHA-512", "u", "pw-123-secret")
    assert c["ssl.ca.location"] == "/ca.pem" and c["ssl.key.password"] == "key-secret-9"
    assert "ssl.certificate.location" not in c  # empty settings are left out
    # Whatever librdkafka logs of them from now on is masked.
    line = mask(f"config sasl.password={c['sasl.password']} key={c['ssl.key.password']}")
    assert "pw-123-secret" not in line and "key-secret-9" not in line


def test_auto_means_confluent_only_where_it_is_installed(monkeypatch):
    assert resolve("kafka-python") == "kafka-python"
    assert resolve("auto") == ("confluent" if available() else "kafka-python")
    monkeypatch.setattr("hetgmp.streaming.clients.confluent.available", lambda: False)
    assert resolve("auto") == "kafka-python"
    with pytest.raises(ValueError, match="pip install"):
        resolve("confluent")
    with pytest.raises(ValueError, match="one of auto, kafka-python, confluent"):
        resolve("rdkafka")


def test_fetched_splits_and_drops_partitions_in_order():
    f = Fetched.of([b"a", b"b", None, b"d"], [0, 1, 0, 2], [5, 7, 6, 1], [10, 11, 12, 13])
    head, tail = f.split(3)
    assert head.values == [b"a", b"b", None] and tail.offsets.tolist() == [1]
    kept = f.without({0})
    assert kept.values == [b"b", b"d"] and kept.partitions.tolist() == [1, 2]
    both = head + tail
    assert both.values == f.values and np.array_equal(both.timestamps_ms, f.timestamps_ms)
    assert len(Fetched.empty() + f) == 4 and f.without({9}) is f


class _Uuid:
    """librdkafka's Uuid: two signed 64-bit halves."""

    def __init__(self, value: uuid.UUID) -> None:
        self.msb, self.lsb = value.int >> 64, value.int & (2**64 - 1)

    def get_most_significant_bits(self) -> int:
        return self.msb - 2**64 if self.msb >= 2**63 else self.msb

    def get_least_significant_bits(self) -> int:
        return self.lsb - 2**64 if self.lsb >= 2**63 else self.lsb


def test_a_librdkafka_topic_id_reads_as_kafka_pythons_uuid_text():
    # A checkpoint written by one client is resumed by the other: the ids must compare equal.
    value = uuid.UUID("f1a2b3c4-d5e6-4789-8abc-def012345678")  # both halves above 2**63
    assert _uuid_text(_Uuid(value)) == str(value)
    assert _uuid_text(_Uuid(uuid.UUID(int=0))) is None and _uuid_text(None) is None


@pytest.mark.skipif(not available(), reason="confluent-kafka is not installed")
def test_a_fatal_producer_error_at_close_reports_every_unanswered_message_as_failed():
    # Seen in a full run: a restarted broker forgot the idempotent producer's id, librdkafka
    # raised the fatal UNKNOWN_PRODUCER_ID from flush() in close(), and it escaped produce()
    # instead of becoming failed records. Here a real producer holds messages it cannot
    # deliver (nothing listens on the port) and its first flush raises that error.
    from confluent_kafka import KafkaError, KafkaException, Producer

    from hetgmp.runtime import free_port
    from hetgmp.streaming.clients.confluent import ConfluentSender

    class FatalOnFlush:
        def __init__(self, real: Producer) -> None:
            self.real, self.raised = real, False

        def flush(self, timeout: float) -> int:
            if not self.raised:
                self.raised = True
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID,
                                                "unknown producer id", fatal=True))
            return self.real.flush(timeout)

        def __getattr__(self, name: str):
            return getattr(self.real, name)

    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}", request_timeout_ms=60_000)
    results: list = []
    sender = ConfluentSender(kafka, "clicks", acks="all", idempotence=True, compression="none",
                             on_result=lambda tag, err, off: results.append((tag, err, off)))
    sender._p = FatalOnFlush(sender._p)  # the real librdkafka producer, with the error injected
    for tag in range(5):
        sender.send(b"x", 0, None, tag)
    sender.close()  # must not raise
    assert sorted(tag for tag, _, _ in results) == list(range(5))  # each exactly once
    assert all(err is not None and off == -1 for _, err, off in results)
    assert any("unknown producer id" in str(err).lower() for _, err, _ in results)


class _FatalOnFlush:
    """librdkafka's producer as a restarted broker leaves it (idempotence state lost): the
    binding's flush raises the fatal KafkaException, and a delivery report served in the same
    call fails as ``SystemError: <class 'RuntimeError'> returned a result with an exception
    set`` (seen on CI, 2026-12-07), which is what reaches the caller."""

    def __init__(self, config: dict) -> None:
        self.reports: list = []

    def produce(self, topic: str, **kw: object) -> None:
        self.reports.append(kw["on_delivery"])

    def poll(self, timeout: float) -> int:
        time.sleep(timeout)
        return 0

    def flush(self, timeout: float) -> int:
        from confluent_kafka import KafkaException
        try:
            raise KafkaException("Broker: Unknown Producer Id")
        except KafkaException:  # the SystemError's context is the fatal error, as there
            raise SystemError("<class 'RuntimeError'> returned a result with an exception "  # noqa: B904
                              "set")

    def purge(self) -> None:
        pass


def test_a_fatal_error_raised_through_a_delivery_report_fails_the_messages_it_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka

    from hetgmp.streaming.clients.confluent import ConfluentSender
    monkeypatch.setattr(confluent_kafka, "Producer", _FatalOnFlush)
    results: list = []
    sender = ConfluentSender(KafkaSettings(bootstrap_servers="127.0.0.1:9"), "t", "all", True,
                             "none", on_result=lambda tag, err, offset: results.append((tag, err)))
    sender.send(b"record", 0, None, "m1")
    sender.close()  # it raised the SystemError
    (tag, err), = results
    assert tag == "m1" and "Unknown Producer Id" in str(err)
