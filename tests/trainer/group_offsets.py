"""The offsets a consumer group committed, read from the broker (for the tests that check what
a checkpoint committed; imported by its plain name, as ``exact_jobs`` is)."""

from __future__ import annotations

from hetgmp.streaming.kafka import KafkaSettings


def committed(kafka: KafkaSettings, topic: str, group: str, partitions: int = 2
              ) -> dict[int, int]:
    """Partition -> the group's committed offset, for the partitions it committed."""
    from kafka import KafkaConsumer, TopicPartition

    client = KafkaConsumer(**kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
    try:
        out = {}
        for p in range(partitions):
            off = client.committed(TopicPartition(topic, p))
            if off is not None:
                out[p] = int(off)
        return out
    finally:
        client.close()
