"""JSON the way the commands print it: strict (no bare NaN or Infinity, which JSON lacks)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["strict_json"]


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None, recursively (numpy scalars too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return strict_json(value.item())
    return value
