"""Package surfaces that load their modules on first use (PEP 562).

A package lists where each exported name lives; the module that holds it is imported when the
name is first asked for. ``hetgmp --help``, ``hetgmp produce`` and the partitioner's process
then import the few modules they use instead of every room's torch code on the way in.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` whose names live in ``homes`` (name -> module).

    A name is imported from its module the first time it is asked for, then kept on the
    package (later lookups do not come here).
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
