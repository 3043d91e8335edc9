"""Shared fixtures: the real embedded broker (started here, once per session) and name factories."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hetgmp.streaming.broker import EmbeddedBroker
from hetgmp.streaming.kafka import KafkaSettings

# Keep torch and numpy to one thread per process: the CI machine has two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--bootstrap-servers``: run the broker tests against an existing cluster."""
    parser.addoption(
        "--bootstrap-servers",
        default=None,
        metavar="HOST:PORT",
        help="Kafka cluster for the `kafka` fixture instead of the embedded broker (tests that "
        "kill and restart a broker still start their own embedded one)",
    )
    parser.addoption(
        "--hog",
        type=int,
        default=0,
        metavar="N",
        help="load the machine for the whole session: N processes spinning on a core each, and "
        "this process's threads switched every 10 us (make stress): the thread ranks' exactness "
        "tests must hold on a busy machine",
    )


@contextlib.contextmanager
def loaded_machine(processes: int) -> Iterator[None]:
    """``processes`` busy processes beside this one, and the interpreter switching threads every
    10 us instead of every 5 ms: the ranks that are threads of one process interleave at many
    more points, and every wall-clock measurement a run takes is skewed by the load, as on a
    shared CI machine. A result that depends on either shows up as a difference."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.fixture(scope="session", autouse=True)
def _session_load(request: pytest.FixtureRequest) -> Iterator[None]:
    """``--hog N``: the whole session on a loaded machine (see :func:`loaded_machine`)."""
    n = request.config.getoption("--hog")
    with loaded_machine(n) if n else contextlib.nullcontext():
        yield


@pytest.fixture()
def hog() -> Iterator[None]:
    """One test on a loaded machine (see :func:`loaded_machine`): one busy process."""
    with loaded_machine(1):
        yield


_TESTS = Path(__file__).resolve().parent
_seen: set[Path] = set()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> None:
    """Note every test module pytest looks at (see :func:`pytest_collection_finish`)."""
    if file_path.name.startswith("test_") and file_path.suffix == ".py":
        _seen.add(file_path.resolve())


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run of the whole suite stops if a test module was never collected: pytest skips
    directories that match ``norecursedirs`` without a word, and its default list has
    ``dist``, ``build`` and ``venv``."""
    if [Path(a).resolve() for a in session.config.args] != [_TESTS]:
        return  # a part of the suite was asked for
    missing = sorted(str(p.relative_to(_TESTS)) for p in _TESTS.rglob("test_*.py")
                     if p.resolve() not in _seen)
    if missing:
        raise pytest.UsageError(f"test modules pytest did not collect (norecursedirs in "
                                f"pyproject.toml?): {', '.join(missing)}")


# The modules that take a minute or more (measured: chaos 73-85 s, torchrun 52-76 s, the demo
# 48-53 s, the 2-rank gloo launch 40 s, the serve benchmark 37-46 s, test_online 47-70 s).
_LONGEST = {"test_chaos.py", "test_torchrun.py", "test_demo.py", "test_distributed.py",
            "test_serve_bench.py", "test_online.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the broker (directly or through ``kafka``) ``broker``, so that
    ``-m "not broker"`` leaves out all of them, marked by hand or not.

    Then put the longest modules first, then those that hold a slow test, then those with a
    broker or distributed one, each module's tests together and in their order: xdist's
    ``loadfile`` hands modules out in this order, and a minute-long test handed out last keeps
    one worker busy while the others have nothing left.
    """
    for item in items:
        # ``kafka`` asks for ``broker`` only at run time (not with --bootstrap-servers), so it
        # is not in the fixture closure: name both.
        if {"broker", "kafka"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
    tier: dict[Path, int] = {}
    for item in items:
        weight = 0 if item.path.name in _LONGEST else 1 if item.get_closest_marker("slow") \
            else 2 if any(item.get_closest_marker(m) for m in ("broker", "distributed")) else 3
        tier[item.path] = min(weight, tier.get(item.path, 3))
    items.sort(key=lambda item: tier[item.path])


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port for the whole test session."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture()
def kafka(request: pytest.FixtureRequest) -> KafkaSettings:
    """Client settings pointing at the session broker, or at ``--bootstrap-servers`` if given."""
    external = request.config.getoption("--bootstrap-servers")
    if external:
        return KafkaSettings(bootstrap_servers=external, client_id="hetgmp-test")
    # Asked for here, not as a parameter: with an external cluster no embedded one starts.
    broker: EmbeddedBroker = request.getfixturevalue("broker")
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers, client_id="hetgmp-test")


_counter = itertools.count()


@pytest.fixture()
def unique() -> Callable[[str], str]:
    """Unique topic / group names, so tests sharing the broker never see each other's data."""
    run = uuid.uuid4().hex[:6]

    def make(prefix: str) -> str:
        return f"{prefix}-{run}-{next(_counter)}"

    return make
