"""The tree passes ruff and mypy with the settings in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["streaming", "partitioner", "trainer", "bench"]


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
    r = subprocess.run([tool("mypy"), *PACKAGES], cwd=ROOT, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
