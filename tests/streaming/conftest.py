"""The consumer suite runs on each Kafka client library: ``library`` makes ``client="auto"``
(every ConsumerConfig's default) resolve to one, then the other."""

from __future__ import annotations

from typing import Iterator

import pytest

from hetgmp.streaming.clients.confluent import available

LIBRARIES = ["kafka-python", "confluent"]


@pytest.fixture(params=LIBRARIES)
def library(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "confluent" and not available():
        pytest.skip("confluent-kafka is not installed (pip install '.[librdkafka]')")
    monkeypatch.setattr("hetgmp.streaming.clients.confluent.available",
                        lambda: request.param == "confluent")
    yield request.param
