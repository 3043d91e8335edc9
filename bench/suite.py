"""``hetgmp bench all``: every benchmark in turn, each handed the flags it knows.

The benchmarks' flags differ (``--device`` is train's and online's, ``--offline`` partition's), so
one command line cannot go to all of them as it is. A flag goes to every benchmark that defines it
and is left out for the others. A flag that none defines is refused before anything runs, and so
is a share that one benchmark would refuse (a bad value, or ``--device cuda`` without a GPU per
rank): every benchmark checks its share before the first one starts.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Protocol

__all__ = ["BENCHMARKS", "main", "split_flags"]

BENCHMARKS = ("ingest", "partition", "train", "online", "serve", "gpu")


class _Bench(Protocol):
    def build_parser(self) -> argparse.ArgumentParser: ...

    def parse_args(self, argv: list[str] | None) -> argparse.Namespace: ...

    def main(self, argv: list[str] | None = None) -> int: ...


def _module(name: str) -> _Bench:
    module: _Bench = importlib.import_module(f"bench.{name}")  # type: ignore[assignment]
    return module


def _options(parser: argparse.ArgumentParser) -> dict[str, bool]:
    """Each long option of ``parser``, and whether it takes a value (exactly one: a flag taking
    several, or an optional one, could not be split from the flags around it)."""
    out = {}
    for action in parser._actions:  # argparse keeps no public list of its actions
        for flag in action.option_strings:
            if not flag.startswith("--") or flag == "--help":
                continue
            if action.nargs not in (None, 0):
                raise ValueError(f"{parser.prog}: {flag} takes nargs={action.nargs!r}, which "
                                 f"`hetgmp bench all` cannot split")
            out[flag] = action.nargs != 0
    return out


def split_flags(argv: list[str], parsers: dict[str, argparse.ArgumentParser]) -> dict[str, list[str]]:
    """The flags of ``argv`` each benchmark defines, in order; each flag as ``--name`` or
    ``--name=value``, written out in full.

    Raises:
        ValueError: a token that is not a flag any benchmark defines, or a flag without its value.
    """
    known = {name: _options(p) for name, p in parsers.items()}
    out: dict[str, list[str]] = {name: [] for name in parsers}
    i = 0
    while i < len(argv):
        flag, eq, _ = argv[i].partition("=")
        owners = [name for name, opts in known.items() if flag in opts]
        if not owners:
            raise ValueError(f"{argv[i]!r} is not a flag of any benchmark (flags are written out "
                             f"in full here; `hetgmp bench NAME --help` lists each one's)")
        arity = {known[name][flag] for name in owners}
        if len(arity) > 1:  # one would read the next token as its value, another would not
            raise ValueError(f"{flag} takes a value in some benchmarks and none in others: "
                             f"run them one at a time")
        takes_value = arity.pop()
        if takes_value and not eq and i + 1 >= len(argv):
            raise ValueError(f"{flag} needs a value")
        tokens = argv[i:i + 2] if takes_value and not eq else argv[i:i + 1]
        for name in owners:
            out[name].extend(tokens)
        i += len(tokens)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hetgmp bench all",
        usage="hetgmp bench all [-h] [FLAG ...]",
        description=f"Run the benchmarks {', '.join(BENCHMARKS)} one after the other. Each flag "
                    "goes to the benchmarks that define it (`hetgmp bench NAME --help`) and is "
                    "left out for the others, e.g. `--quick` goes to all four and `--device cuda` "
                    "to train and online. Exits non-zero if any benchmark does.")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark with its share of ``argv``; the status is theirs, or-ed."""
    argv = list(argv or [])
    parser = _parser()
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    modules = {name: _module(name) for name in BENCHMARKS}
    parsers = {name: m.build_parser() for name, m in modules.items()}
    try:
        shares = split_flags(argv, parsers)
    except ValueError as exc:
        parser.error(str(exc))
    for name, share in shares.items():  # a bad value stops the suite before the first run
        modules[name].parse_args(share)
    status = 0
    for name, module in modules.items():
        print(f"== hetgmp bench {name} {' '.join(shares[name])}".rstrip(), flush=True)
        status |= module.main(shares[name])
    return status
