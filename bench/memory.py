"""Peak resident memory of the benchmark process (Linux: the kernel's high-water mark)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["peak_mb", "reset_peak"]

_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak() -> None:
    """Start a new peak reading (writing 5 to clear_refs resets VmHWM; a no-op off Linux)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        pass


def peak_mb() -> float | None:
    """The process's peak resident memory since ``reset_peak``, in MiB (None off Linux)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
