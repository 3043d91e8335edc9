"""Fixtures of the benchmark tests (the trainer tests' device fixture, shared)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The trainer tests' conftest is not on this directory's path: load its fixture by file.
_spec = importlib.util.spec_from_file_location(
    "trainer_test_fixtures", Path(__file__).parents[1] / "trainer" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
gpus = _fixtures.gpus

__all__ = ["gpus"]
