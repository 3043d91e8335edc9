"""Ingest benchmark: raw kafka-python consumption against our consume + decode, in one run.

For each message layout (one record per Kafka message, and records packed N to a message, the
producer's default), the same topic is read by

* ``raw``: a plain ``KafkaConsumer`` that iterates the messages and counts their records
  (the baseline: what any Python consumer pays before doing anything with the data), and
* ``decoded``: :class:`streaming.consumer.ClickConsumer`, which also decodes every record into a
  columnar batch (labels, log-dense features, hashed int64 feature ids).

Both read every partition by manual assignment (no group join in the timing), alternate runs, and
the best of ``--repeats`` is kept for each. The producer's rate is measured while filling each
topic. The last line is a JSON summary; its top-level figures are those of the one-record
layout, where "raw consume of N records" means N messages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from streaming.broker import EmbeddedBroker
from streaming.consumer import ClickConsumer, ConsumerConfig
from streaming.kafka import KafkaSettings
from streaming.producer import ProduceConfig, produce
from streaming.synthetic import SyntheticConfig

__all__ = ["build_parser", "main", "parse_args"]


def _raw_consume(kafka: KafkaSettings, topic: str, records: int, partitions: int) -> float:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        **kafka.client_kwargs(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=64 << 20,
        max_partition_fetch_bytes=8 << 20,
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    got = 0
    t0 = None
    try:
        while got < records:
            polled = consumer.poll(timeout_ms=1000, max_records=8192)
            if t0 is None and polled:
                t0 = time.perf_counter()
            for batch in polled.values():
                for message in batch:
                    got += message.value.count(b"\n") + 1
        return got / (time.perf_counter() - (t0 or time.perf_counter()))
    finally:
        consumer.close(autocommit=False)


def _decoded_consume(kafka: KafkaSettings, topic: str, records: int, partitions: int) -> float:
    cfg = ConsumerConfig(topic=topic, group_id="", dead_letter_topic="none")
    with ClickConsumer(kafka, cfg, partitions=list(range(partitions))) as consumer:
        got = 0
        t0 = None
        while got < records:
            batch = consumer.next_batch(8192, timeout=1.0)
            if t0 is None and len(batch):
                t0 = time.perf_counter()
            got += len(batch)
        return got / (time.perf_counter() - (t0 or time.perf_counter()))


def _layout(kafka: KafkaSettings, args: argparse.Namespace, per_message: int) -> dict[str, Any]:
    topic = f"bench-ingest-{per_message}-{int(time.time() * 1000)}"
    report = produce(
        kafka,
        ProduceConfig(
            topic=topic, count=args.records, partitions=args.partitions, records_per_message=per_message
        ),
        SyntheticConfig(seed=args.seed),
    )
    raw, decoded = [], []
    for _ in range(args.repeats):
        raw.append(_raw_consume(kafka, topic, args.records, args.partitions))
        decoded.append(_decoded_consume(kafka, topic, args.records, args.partitions))
    row: dict[str, float] = {
        "records_per_message": per_message,
        "producer_records_per_s": round(report.records_per_s),
        "raw_records_per_s": round(max(raw)),
        "decoded_records_per_s": round(max(decoded)),
    }
    row["ratio"] = round(row["decoded_records_per_s"] / row["raw_records_per_s"], 3)
    print(
        f"{per_message:>4} rec/msg | produce {row['producer_records_per_s']:>9,}/s | "
        f"raw consume {row['raw_records_per_s']:>9,}/s | consume+decode "
        f"{row['decoded_records_per_s']:>9,}/s | ratio {row['ratio']:.3f}",
        flush=True,
    )
    return row


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(prog="hetgmp bench ingest", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="records per layout")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument(
        "--packed",
        type=int,
        default=ProduceConfig.records_per_message,
        help="records per message of the packed layout",
    )
    p.add_argument("--repeats", type=int, default=3, help="alternating runs; the best of each is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="50k records per layout, best of 2 (a smoke run)")
    p.add_argument(
        "--bootstrap-servers", default="", help="use this Kafka instead of starting the embedded broker"
    )
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.records, args.repeats = min(args.records, 50_000), min(args.repeats, 2)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; prints a table and, last, a JSON summary line."""
    args = parse_args(argv)

    with contextlib.ExitStack() as stack:
        if args.bootstrap_servers:
            kafka = KafkaSettings(bootstrap_servers=args.bootstrap_servers)
        else:
            broker = stack.enter_context(EmbeddedBroker())
            kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        print(
            f"ingest benchmark: {args.records:,} synthetic Criteo records per layout, "
            f"{args.partitions} partitions, best of {args.repeats}",
            flush=True,
        )
        rows = [_layout(kafka, args, 1), _layout(kafka, args, args.packed)]
    single, packed = rows
    summary = {
        "bench": "ingest",
        "raw_records_per_s": single["raw_records_per_s"],
        "decoded_records_per_s": single["decoded_records_per_s"],
        "ratio": single["ratio"],
        "producer_records_per_s": packed["producer_records_per_s"],
        "layouts": rows,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
