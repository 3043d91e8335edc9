"""The Kafka tools of the ``hetgmp`` command: ``broker``, ``produce`` and ``consume``.

Each command has a function that adds its flags to its subparser and one that runs it from the
parsed flags and returns the exit status: 0 done, 1 failed while running, 2 refused settings,
130 stopped by SIGINT or SIGTERM before the broker answered.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, TypeVar

from hetgmp.runtime import add_flags, build, stop_on_signals
from hetgmp.streaming import (
    BrokerUnavailable,
    ClickConsumer,
    ConnectStopped,
    ConsumerConfig,
    ConsumerFailed,
    EmbeddedBroker,
    KafkaSettings,
    KafkaUnavailable,
    ProduceConfig,
    SchemaError,
    SyntheticConfig,
    TopicNotFound,
    produce,
)

__all__ = [
    "add_broker_flags",
    "add_consume_flags",
    "add_kafka_flags",
    "add_produce_flags",
    "run_broker",
    "run_consume",
    "run_produce",
    "settings",
]

T = TypeVar("T")

# Exit status of a command stopped by a signal before it could begin (the shell's for Ctrl-C).
STOPPED = 130


def settings(cls: type[T], args: argparse.Namespace, prefix: str = "") -> T:
    """The settings dataclass from the flags; a value it refuses is a usage error (exit 2)."""
    try:
        return build(cls, args, prefix)
    except ValueError as exc:
        print(f"hetgmp {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def add_kafka_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """How to reach the cluster."""
    group = parser.add_argument_group("kafka", "how to reach the cluster (passed to the client)")
    add_flags(group, KafkaSettings, "kafka", toml=toml)


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("metrics", "Prometheus exposition")
    group.add_argument("--metrics-port", type=int, default=0,
                       help="serve /metrics on this port (0: off)")
    group.add_argument("--metrics-host", default="127.0.0.1", help="address to serve metrics on")


def _serve(collector: Any, args: argparse.Namespace) -> None:
    from prometheus_client import CollectorRegistry

    from hetgmp.streaming import serve_metrics as serve

    registry = CollectorRegistry()
    registry.register(collector)
    serve(registry, args.metrics_port, args.metrics_host)


# -- broker ------------------------------------------------------------------------------------


def add_broker_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """Flags of ``hetgmp broker``."""
    parser.add_argument("--port", type=int, default=0,
                        help="port (default 0: a free one; the address printed names it)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--log-file", default=None, help="write the broker's own log here")


def run_broker(args: argparse.Namespace) -> int:
    """Run the embedded broker until Ctrl-C or SIGTERM."""
    if not 0 <= args.port <= 65535:
        print(f"hetgmp broker: error: --port {args.port}: a port lies in 1..65535 (0: a free "
              f"one)", file=sys.stderr)
        return 2
    with stop_on_signals(threading.Event()) as stop:
        try:
            # --port 0: the broker picks a free port, which the line below prints.
            with EmbeddedBroker(port=args.port, host=args.host, log_file=args.log_file) as broker:
                print(f"bootstrap servers: {broker.bootstrap_servers}", flush=True)
                print("embedded Tansu broker (in-memory storage); Ctrl-C stops it", flush=True)
                while not stop.wait(1.0):
                    if broker.pid is None:
                        print("error: the broker process exited", file=sys.stderr)
                        return 1
        except BrokerUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


# -- produce -----------------------------------------------------------------------------------


def add_produce_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """Flags of ``hetgmp produce``."""
    add_kafka_flags(parser, toml)
    add_flags(parser.add_argument_group("produce"), ProduceConfig, "produce", toml=toml)
    add_flags(parser.add_argument_group("synthetic stream", "shape of --source synthetic"),
              SyntheticConfig, "synthetic", prefix="synthetic", toml=toml)
    _metrics_flags(parser)
    parser.add_argument("--seed", dest="synthetic_seed", type=int, default=argparse.SUPPRESS,
                        help="alias of --synthetic-seed")


def run_produce(args: argparse.Namespace) -> int:
    """Produce, with progress lines; exit 1 when records were not acknowledged."""
    from hetgmp.streaming import KafkaRefused, KafkaUnavailable, ProduceFailed, ProduceReport

    kafka = settings(KafkaSettings, args)
    config = settings(ProduceConfig, args)
    synthetic = settings(SyntheticConfig, args, "synthetic")
    report = ProduceReport()
    if args.metrics_port:
        from hetgmp.streaming import ProducerCollector

        _serve(ProducerCollector(lambda: report, {"topic": config.topic}), args)

    def progress(r: ProduceReport) -> None:
        print(f"produced {r.records:,} records in {r.messages:,} messages "
              f"({r.records_per_s:,.0f} records/s)", flush=True)

    failed = None
    with stop_on_signals(threading.Event()) as stop:
        try:
            produce(kafka, config, synthetic, stop=stop, progress=progress, report=report)
        except ProduceFailed as exc:
            failed = exc
        except ConnectStopped as exc:
            print(f"stopped: {exc}", file=sys.stderr)
            return STOPPED
        except (KafkaRefused, KafkaUnavailable, TopicNotFound, ValueError,
                FileNotFoundError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    line = (f"done: {report.records:,} records, {report.messages:,} messages, "
            f"{report.bytes / 1e6:,.1f} MB in {report.seconds:.1f}s = "
            f"{report.records_per_s:,.0f} records/s")
    if report.ceiling_auc is not None:
        line += f"; ground-truth (ceiling) AUC {report.ceiling_auc:.4f}"
    print(line, flush=True)
    if failed is not None:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    return 0


# -- consume -----------------------------------------------------------------------------------


def add_consume_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    """Flags of ``hetgmp consume``."""
    add_kafka_flags(parser, toml)
    add_flags(parser.add_argument_group("consumer"), ConsumerConfig, "consumer",
              prefix="consumer", toml=toml)
    parser.add_argument("--batch", type=int, default=8192, help="messages per poll")
    parser.add_argument("--max-records", type=int, default=0, help="stop after this many records")
    parser.add_argument("--idle-exit", type=float, default=0.0,
                        help="stop after this many idle seconds")
    parser.add_argument("--commit", action="store_true",
                        help="commit the final offsets (needs --consumer-group-id)")
    _metrics_flags(parser)


def run_consume(args: argparse.Namespace) -> int:
    """Read and decode a topic, with progress lines; a JSON summary last."""
    kafka = settings(KafkaSettings, args)
    config = settings(ConsumerConfig, args, "consumer")
    if args.batch < 1 or args.max_records < 0 or args.idle_exit < 0:
        print(f"hetgmp consume: error: --batch must be >= 1 and --max-records, --idle-exit "
              f">= 0 (got {args.batch}, {args.max_records}, {args.idle_exit})", file=sys.stderr)
        return 2
    if args.commit and not config.group_id:
        print("hetgmp consume: error: --commit needs a consumer group (--consumer-group-id)",
              file=sys.stderr)
        return 2
    try:
        return _consume(args, kafka, config)
    except SchemaError as exc:  # refused as train and serve refuse it, before any broker is asked
        print(f"hetgmp consume: error: --consumer-schema: {exc}", file=sys.stderr)
        return 2
    except ConnectStopped as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return STOPPED
    except (TopicNotFound, KafkaUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ConsumerFailed as exc:  # a lost log, refused credentials, unwritten dead letters
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _consume(args: argparse.Namespace, kafka: KafkaSettings, config: ConsumerConfig) -> int:
    t0 = last = idle_since = time.monotonic()
    with stop_on_signals(threading.Event()) as stop, \
            ClickConsumer(kafka, config, stop=stop.is_set) as consumer:
        if args.metrics_port:
            from hetgmp.streaming import ConsumerCollector

            _serve(ConsumerCollector(consumer), args)
        while not stop.is_set():
            batch = consumer.next_batch(args.batch, timeout=0.5)
            now = time.monotonic()
            if len(batch) or not consumer.assignment:  # a group join is not idleness
                idle_since = now
            elif args.idle_exit and now - idle_since > args.idle_exit:
                break
            if args.max_records and consumer.stats.records >= args.max_records:
                break
            if now - last > 2:
                last = now
                s = consumer.stats
                print(f"{s.records:,} records ({s.records / (now - t0):,.0f}/s), rejected "
                      f"{sum(s.rejected.values()):,}", flush=True)
        committed = consumer.commit() if args.commit else False
        s = consumer.stats
        summary = {"records": s.records, "messages": s.messages, "rejected": dict(s.rejected),
                   "values_truncated": dict(s.truncated), "dead_lettered": s.dead_lettered,
                   "snapshot": consumer.snapshot(), "committed": committed}
    print(json.dumps(summary), flush=True)
    return 0
