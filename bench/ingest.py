"""Ingest benchmark: raw consumption against our consume + decode, per message format, in one run.

For each format (``tsv1``: one TSV record a Kafka message, as log producers in the field write;
``tsv16``: 16 a message, the TSV producer's default; ``arrow``: an Arrow record batch of 1,024
a message; ``tsv_lists`` and ``arrow_lists``: the same two layouts of the ``multi_hot`` shape,
MLPerf DLRM-DCNv2's 26 lists of 214 values a record, as comma-separated TSV fields and Arrow
``list<int64>`` columns) the same topic is read by

* ``raw``: a plain ``KafkaConsumer`` that iterates the messages and counts them (the baseline:
  what any Python consumer pays before doing anything with the data), and
* ``decoded``: :class:`hetgmp.streaming.consumer.ClickConsumer`, which also decodes every record into a
  columnar batch (labels, log-dense features, hashed int64 feature ids).

Both read every partition by manual assignment (no group join in the timing), alternate runs, and
the best of ``--repeats`` is kept for each. The producer's rate is measured while filling each
topic from the synthetic generator, and again replaying the same records from files at rest (a
TSV text file for the TSV formats, a Parquet file for Arrow), which takes the generator out of
the figure. The last line is a JSON summary with a row per (client, format); its top-level figures
are those of the first format. A row's ``decoded_ids_per_s`` counts the ids the decoder made
(a list's values each): a record of lists costs what its ids do, and
``ids_ratio_<format>_over_arrow`` compares it with the one-value Arrow format's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

__all__ = ["build_parser", "main", "parse_args"]


# name: (message format, records a message, synthetic shape)
FORMATS = {"tsv1": ("tsv", 1, "segments"), "tsv16": ("tsv", 16, "segments"),
           "arrow": ("arrow", 1024, "segments"), "tsv_lists": ("tsv", 16, "multi_hot"),
           "arrow_lists": ("arrow", 1024, "multi_hot")}


def _raw_consume(kafka: KafkaSettings, topic: str, records: int, partitions: int,
                 per_message: int) -> float:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        **kafka.client_kwargs(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=64 << 20,
        max_partition_fetch_bytes=8 << 20,
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.partitions_for_topic(topic)  # metadata before the clock starts
    messages = -(-records // per_message)
    got = 0
    t0 = time.perf_counter()
    try:
        while got < messages:
            polled = consumer.poll(timeout_ms=1000, max_records=8192)
            for batch in polled.values():
                for message in batch:
                    got += message.value is not None
        return records / (time.perf_counter() - t0)
    finally:
        consumer.close(autocommit=False)


def _raw_confluent(kafka: KafkaSettings, topic: str, records: int, partitions: int,
                   per_message: int) -> float:
    """The same baseline with librdkafka's client (confluent-kafka), where it is installed."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**kafka.librdkafka_config(), "group.id": "hetgmp-bench-raw",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                         "max.partition.fetch.bytes": 8 << 20})
    consumer.list_topics(topic, timeout=10)  # metadata before the clock starts
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    messages = -(-records // per_message)
    got = 0
    t0 = time.perf_counter()
    try:
        while got < messages:
            # consume() waits out its timeout until it has num_messages: ask for what is left.
            for message in consumer.consume(num_messages=min(8192, messages - got), timeout=1.0):
                got += message.error() is None and message.value() is not None
        return records / (time.perf_counter() - t0)
    finally:
        consumer.close()


def _decoded_consume(kafka: KafkaSettings, topic: str, records: int, partitions: int,
                     fmt: str, client: str, schema: str = "criteo") -> float:
    cfg = ConsumerConfig(topic=topic, group_id="", dead_letter_topic="none", format=fmt,  # type: ignore[arg-type]
                         client=client, schema=schema)  # type: ignore[arg-type]
    with ClickConsumer(kafka, cfg, partitions=list(range(partitions))) as consumer:
        got = 0
        t0 = time.perf_counter()  # after start(): connected, assigned, positions resolved
        while got < records:
            got += len(consumer.next_batch(8192, timeout=1.0))
        return got / (time.perf_counter() - t0)


RAW = {"kafka-python": _raw_consume, "confluent": _raw_confluent}


def _write_files(records: int, seed: int, where: Path, shape: str = "segments"
                 ) -> dict[str, Path]:
    """The synthetic records as a TSV text file and as a Parquet file (sparse values as text,
    a list field's as a list of them)."""
    import io

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    config = SyntheticConfig(seed=seed, shape=shape)  # type: ignore[arg-type]
    lines, _, _ = SyntheticStream(config).lines_with_truth(0, records)
    text = b"\n".join(lines) + b"\n"
    tsv = where / f"records-{shape}.tsv"
    tsv.write_bytes(text)
    schema = config.schema
    names = [schema.label, *schema.dense, *schema.sparse]
    table = pcsv.read_csv(
        io.BytesIO(text), read_options=pcsv.ReadOptions(column_names=names),
        parse_options=pcsv.ParseOptions(delimiter="\t"),
        convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in schema.sparse}))
    for f in schema.sparse_fields:
        if f.multi_valued:  # "a,b,c" -> ["a", "b", "c"]; an empty field -> []
            col = pc.fill_null(table.column(f.name), "")
            split = pc.split_pattern(col, ",")
            empty = pc.equal(col, "")
            lists = pc.if_else(empty, pa.scalar([], pa.list_(pa.string())), split)
            table = table.set_column(table.schema.get_field_index(f.name), f.name, lists)
    parquet = where / f"records-{shape}.parquet"
    pq.write_table(table, parquet)
    return {"tsv": tsv, "arrow": parquet}


def _layout(kafka: KafkaSettings, args: argparse.Namespace, name: str,
            files: dict[str, dict[str, Path]]) -> list[dict[str, Any]]:
    """One row per client: its producer's rate (each fills a topic of its own), its raw and its
    decoded consumption of the same topic, alternating runs."""
    fmt, per_message, shape = FORMATS[name]
    records = args.records if shape == "segments" else args.list_records
    synthetic = SyntheticConfig(seed=args.seed, shape=shape)  # type: ignore[arg-type]
    schema = "criteo" if shape == "segments" else shape
    stream = SyntheticStream(synthetic)
    ids_per_record = float(stream.sample_csr(stream.take(0, records))[0][-1]) / records
    reports, topics = {}, {}
    for client in args.clients:
        topics[client] = f"bench-ingest-{name}-{client}-{int(time.time() * 1000)}"
        reports[client] = produce(
            kafka,
            ProduceConfig(topic=topics[client], count=records, partitions=args.partitions,
                          records_per_message=per_message, format=fmt,  # type: ignore[arg-type]
                          client=client, schema=schema),  # type: ignore[arg-type]
            synthetic,
        )
    replayed = {}
    for client in args.clients:
        replayed[client] = produce(
            kafka,
            ProduceConfig(topic=f"{topics[client]}-file", source=f"file:{files[shape][fmt]}",
                          partitions=args.partitions, records_per_message=per_message,
                          format=fmt, client=client, schema=schema),  # type: ignore[arg-type]
        )
    topic = topics[args.clients[0]]
    raw: dict[str, list[float]] = {c: [] for c in args.clients}
    decoded: dict[str, list[float]] = {c: [] for c in args.clients}
    for _ in range(args.repeats):
        for client in args.clients:
            raw[client].append(RAW[client](kafka, topic, records, args.partitions,
                                           per_message))
            decoded[client].append(_decoded_consume(kafka, topic, records,
                                                    args.partitions, fmt, client, schema))
    rows = []
    for client in args.clients:
        report = reports[client]
        row: dict[str, Any] = {
            "client": client,
            "format": name,
            "records_per_message": per_message,
            "producer_records_per_s": round(report.records_per_s),
            "producer_file_records_per_s": round(replayed[client].records_per_s),
            "raw_records_per_s": round(max(raw[client])),
            "decoded_records_per_s": round(max(decoded[client])),
            "shape": shape,
            "ids_per_record": round(ids_per_record, 2),
            "decoded_ids_per_s": round(max(decoded[client]) * ids_per_record),
        }
        row["ratio"] = round(row["decoded_records_per_s"] / row["raw_records_per_s"], 3)
        # Bytes a record on the wire: the broker's fetch ceiling, in MB/s, bounds records/s.
        row["bytes_per_record"] = round(report.bytes / max(report.records, 1), 1)
        row["raw_mb_per_s"] = round(row["raw_records_per_s"] * row["bytes_per_record"] / 1e6, 1)
        print(
            f"{client:<12} {name:<6} | produce {row['producer_records_per_s']:>9,}/s "
            f"(file {row['producer_file_records_per_s']:>9,}/s) | "
            f"raw consume {row['raw_records_per_s']:>9,}/s ({row['raw_mb_per_s']:.0f} MB/s) | "
            f"consume+decode {row['decoded_records_per_s']:>9,}/s "
            f"({row['decoded_ids_per_s'] / 1e6:.1f}M ids/s) | ratio {row['ratio']:.3f}",
            flush=True,
        )
        rows.append(row)
    return rows


def _has_confluent() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's flags (``hetgmp bench all`` reads them to hand each benchmark its own)."""
    p = argparse.ArgumentParser(prog="hetgmp bench ingest", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="records per layout")
    p.add_argument("--list-records", type=int, default=0,
                   help="records per layout of lists (tsv_lists, arrow_lists; 0: --records / 8, "
                        "as a multi_hot record carries 8 times a Criteo one's ids)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--clients", default="kafka-python,confluent",
                   help="comma-separated client libraries (confluent where installed)")
    p.add_argument("--formats", default=",".join(FORMATS),
                   help=f"comma-separated formats to run ({', '.join(FORMATS)})")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs; the best of each is kept")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="50k records per layout, best of 2 (a smoke run)")
    p.add_argument(
        "--bootstrap-servers", default="", help="use this Kafka instead of starting the embedded broker"
    )
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of ``argv``, checked (a usage error exits 2 before anything runs)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(args.formats) - set(FORMATS))
    if unknown or not args.formats:
        parser.error(f"--formats: unknown {', '.join(unknown) or 'none given'} "
                     f"(choose from {', '.join(FORMATS)})")
    args.clients = [c for c in args.clients.split(",") if c]
    if not set(args.clients) <= set(RAW) or not args.clients:
        parser.error(f"--clients: choose from {', '.join(RAW)}")
    if "confluent" in args.clients and not _has_confluent():
        print("note: confluent-kafka is not installed; measuring kafka-python only")
        args.clients = [c for c in args.clients if c != "confluent"] or ["kafka-python"]
    if args.quick:
        args.records, args.repeats = min(args.records, 50_000), min(args.repeats, 2)
    args.list_records = args.list_records or max(args.records // 8, 1)
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
            f"ingest benchmark: {args.records:,} synthetic Criteo records per format, "
            f"{args.partitions} partitions, best of {args.repeats}",
            flush=True,
        )
        where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        shapes = {FORMATS[name][2] for name in args.formats}
        files = {shape: _write_files(args.records if shape == "segments" else args.list_records,
                                     args.seed, where, shape) for shape in sorted(shapes)}
        rows = [row for name in args.formats for row in _layout(kafka, args, name, files)]
    first = rows[0]
    ratios = {}
    for client in args.clients:
        by = {r["format"]: r for r in rows if r["client"] == client}
        for name in ("arrow_lists", "tsv_lists"):
            if name in by and "arrow" in by:
                key = f"ids_ratio_{name}_over_arrow" + ("" if client == args.clients[0]
                                                        else f"_{client}")
                ratios[key] = round(by[name]["decoded_ids_per_s"]
                                    / max(by["arrow"]["decoded_ids_per_s"], 1), 3)
    for k, v in ratios.items():
        print(f"{k}: {v}", flush=True)
    summary = {
        "bench": "ingest",
        "raw_records_per_s": first["raw_records_per_s"],
        "decoded_records_per_s": first["decoded_records_per_s"],
        "ratio": first["ratio"],
        "producer_records_per_s": max(r["producer_records_per_s"] for r in rows),
        "producer_file_records_per_s": max(r["producer_file_records_per_s"] for r in rows),
        "ratios": ratios,
        "rows": rows,
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
