"""The tree passes ruff and mypy with the settings in pyproject.toml, and reads the environment
in one place."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["runtime", "streaming", "partitioner", "trainer", "bench"]  # folders
# What mypy checks: the library by its import name (hetgmp/ links to the folders), and bench.
TYPED = ["hetgmp", "bench"]


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it comes with the test extra (make setup)")
    return found


def test_ruff_finds_nothing():
    r = subprocess.run([tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing():
    r = subprocess.run([tool("mypy"), *TYPED], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_environment_is_read_in_one_place():
    """``runtime.env_value`` is the one reader of the environment, so every setting's
    variable is found from there (launch still sets the children's thread caps)."""
    reads = re.compile(r"os\.getenv\(|os\.environ\.get\(|os\.environ\[[^]]+\](?!\s*=[^=])")
    allowed = ROOT / "runtime" / "config.py"
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == allowed:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if reads.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "read the environment through runtime.env_value:\n" + "\n".join(found)
