"""The house layout holds: rooms in layers (a lower one never imports a higher one), no import
cycle, no module past 600 lines, the library never imports the benchmarks or the test doubles,
and one package uses another only through what that package's ``__init__`` exports."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("hetgmp.runtime", "hetgmp.streaming", "hetgmp.partitioner", "hetgmp.trainer")
APP = "hetgmp.trainer.app"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    """Every module of the library by import name (``hetgmp.streaming.types``): the folders
    sit at the top of the repository and install under ``hetgmp``."""
    out = {}
    for package in LIBRARY:
        for path in sorted((ROOT / package.split(".", 1)[1]).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("hetgmp", *(parts[:-1] if parts[-1] == "__init__" else parts)))
            out[name] = path
    return out


MODULES = _modules()


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every test here (read, never changed)."""
    return ast.parse(path.read_text())


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import of the project's packages,
    at module level and inside functions alike."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
    return [f for f in found if _package(f[0]) in (*LIBRARY, "bench")]


def _target(module: str, names: list[str]) -> list[str]:
    """The project modules an import statement loads (``from pkg import mod`` loads pkg.mod)."""
    out = [module] if module in MODULES else []
    out += [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES]
    return out


def _package(module: str) -> str:
    """``hetgmp.trainer`` of ``hetgmp.trainer.step``; ``bench`` of ``bench.train``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "hetgmp" else parts[0]


def test_no_module_is_longer_than_600_lines() -> None:
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concern: {long}"


def test_no_library_module_imports_the_benchmarks_or_the_application_layer() -> None:
    bad = []
    for name, path in MODULES.items():
        if name == APP or name.startswith(APP + "."):
            continue
        for module, _, line in _imports(path):
            if _package(module) == "bench" or module == APP or module.startswith(APP + "."):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


# The rooms, lowest first: a room imports only from rooms below it (and itself), at module
# level or inside a function. The bottom layer imports nothing of the project; the pure
# placement algorithms and the Kafka/log package sit on it; the trainer's rooms climb from
# ranks and collectives to the command line.
LAYERS = (
    "hetgmp.runtime",
    "hetgmp.partitioner",
    "hetgmp.streaming",
    "hetgmp.trainer.dist",
    "hetgmp.trainer.model",
    "hetgmp.trainer.checkpoint",
    "hetgmp.trainer.sources",
    "hetgmp.trainer.embedding",
    "hetgmp.trainer.step",
    "hetgmp.trainer.serving",
    "hetgmp.trainer.online",
    "hetgmp.trainer.run",
    "hetgmp.trainer.testing",
    "hetgmp.trainer.app",
)


def _layer(module: str) -> int | None:
    for i, room in reversed(list(enumerate(LAYERS))):
        if module == room or module.startswith(room + "."):
            return i
    return None


def test_every_library_module_has_a_room() -> None:
    homeless = [name for name in MODULES if name != "hetgmp.trainer" and _layer(name) is None]
    assert not homeless, f"modules outside every room of LAYERS: {homeless}"


def test_lower_rooms_never_import_higher_ones() -> None:
    bad = []
    for name, path in MODULES.items():
        here = _layer(name)
        if here is None:
            continue
        for module, names, line in _imports(path):
            for target in _target(module, names) or [module]:
                there = _layer(target)
                if there is not None and there > here:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {LAYERS[here]} imports "
                               f"{target} ({LAYERS[there]}, above it)")
    assert not bad, "\n".join(bad)


def test_no_library_module_imports_the_test_doubles() -> None:
    """Tests and benchmarks reach a run through the observers it accepts
    (:mod:`hetgmp.trainer.online.observe`); production code never imports ``trainer.testing``."""
    bad = [f"{path.relative_to(ROOT)}:{line}"
           for name, path in MODULES.items() if name != "hetgmp.trainer.testing"
           for module, names, line in _imports(path)
           if module == "hetgmp.trainer.testing" or (module == "hetgmp.trainer" and "testing" in names)]
    assert not bad, "\n".join(bad)


def test_packages_use_each_other_through_their_exports_only() -> None:
    """``from streaming.consumer import X`` in the trainer reaches past streaming's surface;
    ``from streaming import X`` (X in ``streaming.__all__``) does not. Subpackages count as
    packages of their own: ``trainer.online`` uses ``trainer.embedding`` through its
    ``__init__``. Within a package, its own modules import each other freely."""
    import importlib

    exported = {name: set(getattr(importlib.import_module(name), "__all__", ()))
                for name, path in MODULES.items() if path.name == "__init__.py"}
    exported = {name: names for name, names in exported.items() if names}
    bad = []
    for name, path in MODULES.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, names, line in _imports(path):
            if _package(module) == "bench" or module not in MODULES:
                continue
            owner = next((p for p in sorted(exported, key=len, reverse=True)
                          if module == p or module.startswith(p + ".")), None)
            if owner is None or here == owner or here.startswith(owner + "."):
                continue  # inside the package (or a package without a surface of its own)
            if module != owner:
                bad.append(f"{path.relative_to(ROOT)}:{line}: from {module} (use {owner})")
                continue
            missing = [n for n in names if n not in exported[owner]
                       and f"{owner}.{n}" not in MODULES]
            if missing:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {owner} does not export {missing}")
    assert not bad, "\n".join(bad)


def _module_level_imports(path: Path) -> list[tuple[str, list[str]]]:
    """Imports a module makes when it is loaded (not those inside its functions)."""
    found: list[tuple[str, list[str]]] = []
    body = list(_tree(path).body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            body += [h for handler in getattr(node, "handlers", []) for h in handler.body]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def test_there_is_no_import_cycle() -> None:
    """No module, loaded, ends up importing itself (imports inside functions, which load
    later, do not count)."""
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, names in _module_level_imports(path):
            edges[name].update(t for t in _target(module, names) if t != name)
    cycles = set()
    for start in MODULES:
        stack, seen = [(start, (start,))], {start}
        while stack:
            node, trail = stack.pop()
            for nxt in edges[node]:
                if nxt == start:
                    cycles.add(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*trail, nxt)))
    assert not cycles, "\n".join(sorted(cycles))


def _shortest_cycle(start: str, edges: dict[str, dict[str, str]]) -> list[str] | None:
    """The shortest chain of imports from ``start`` back to it (breadth first), or None."""
    parent: dict[str, str] = {}
    queue, seen = [start], {start}
    while queue:
        node = queue.pop(0)
        for nxt in sorted(edges[node]):
            if nxt == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return chain[::-1]
            if nxt not in seen:
                seen.add(nxt)
                parent[nxt] = node
                queue.append(nxt)
    return None


def test_no_import_cycle_between_the_modules_of_one_room() -> None:
    """Within a room (a package of LAYERS), modules import each other one way, so that they
    stand in an order, lowest first (``streaming.types`` at the bottom of ``streaming``).
    Imports inside functions count here: they hide a cycle from the loader, not from the
    design (``types`` once reached up into ``arrow``, ``schema_file`` and ``synthetic`` from
    inside its methods, and ``synthetic`` and ``user_item`` imported each other). The message
    names each cycle with the line of every import in it."""
    edges: dict[str, dict[str, str]] = {name: {} for name in MODULES}  # target -> where
    for name, path in MODULES.items():
        room = _layer(name)
        if room is None:
            continue
        for module, names, line in _imports(path):
            for target in _target(module, names):
                if target != name and _layer(target) == room:
                    edges[name].setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    cycles = set()
    for start in MODULES:
        chain = _shortest_cycle(start, edges)
        if chain is None:
            continue
        low = chain.index(min(chain))  # one way to write each cycle, whichever module found it
        chain = chain[low:] + chain[:low]
        steps = [f"{a} ({edges[a][b]})" for a, b in zip(chain, [*chain[1:], chain[0]])]
        cycles.add(" -> ".join([*steps, chain[0]]))
    assert not cycles, ("import cycles within a room (move what both need into a lower "
                        "module):\n" + "\n".join(sorted(cycles)))


@pytest.mark.parametrize("package", LIBRARY)
def test_every_package_says_what_it_offers(package: str) -> None:
    for name, path in MODULES.items():
        if path.name == "__init__.py" and _package(name) == package:
            tree = _tree(path)
            assert ast.get_docstring(tree), f"{name} has no docstring"


@pytest.mark.parametrize("package", [n for n, p in MODULES.items() if p.name == "__init__.py"])
def test_every_exported_name_is_there(package: str) -> None:
    import importlib

    module = importlib.import_module(package)
    missing = [n for n in getattr(module, "__all__", []) if not hasattr(module, n)]
    assert not missing, f"{package} exports names it does not have: {missing}"


def test_the_partitioner_process_loads_neither_torch_nor_the_loop() -> None:
    """The partitioner's spawned process imports :mod:`hetgmp.trainer.online.partition_process`; an
    eager ``trainer.online`` would load torch and the loop on its way (seconds at every start:
    short runs ended before their first placement came back)."""
    import subprocess
    import sys

    code = ("import sys, trainer.online.partition_process; "
            "print([m for m in ('torch', 'hetgmp.trainer.online.loop') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_command_line_parser_loads_no_torch() -> None:
    """``hetgmp --help``, ``produce`` and ``consume`` need no torch: the packages' surfaces load
    their modules on first use (an eager ``trainer.run`` made every ``--help`` import torch:
    3.7 s instead of 1.1 s here)."""
    import subprocess
    import sys

    code = ("import sys; from trainer.app.cli import build_parser; build_parser([]); "
            "print([m for m in ('torch', 'hetgmp.trainer.run.rank') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("package", [n for n, p in MODULES.items() if p.name == "__init__.py"])
def test_no_exported_name_is_also_a_module_of_its_package(package: str) -> None:
    """Importing ``trainer.dist.launch`` set the package's ``launch`` to that module, and a
    surface that loads names on first use then handed the module to
    ``from trainer.dist import launch`` (the chaos job's 31 runs died of it)."""
    import importlib

    module = importlib.import_module(package)
    clash = [n for n in getattr(module, "__all__", []) if f"{package}.{n}" in MODULES]
    assert not clash, f"{package} exports names that are also its modules: {clash}"
