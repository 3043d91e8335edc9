"""Returning freed memory to the kernel between the phases of a partition.

glibc keeps freed allocations below its mmap threshold (which it raises up to 32 MB as large
arrays come and go) on its heap for reuse. A partition allocates in phases of different shapes
(numbering, METIS's many mid-sized blocks, the [samples, workers] routing arrays), so what one
phase freed is mostly not what the next one asks for: the next is mapped fresh beside it and
the process's peak counts both. Measured on a 500k x 26 window, 8 workers: 60-200 MB resident
after a phase had freed it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["release_freed_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to call
        return None


def release_freed_heap() -> None:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim(0)``; else nothing)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
