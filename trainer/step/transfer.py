"""Host arrays onto the device a step runs on."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["to_device"]


def to_device(array: np.ndarray, device: torch.device,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """A host array as a tensor on ``device`` (in ``dtype``; default the array's).

    On CUDA the array goes through pinned memory and a non-blocking copy: a copy from pageable
    memory makes the host wait for it, a pinned one is queued (torch's caching host allocator
    keeps the buffer until the copy is done, so the next step's input never overwrites it).
    """
    t = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cuda":
        t = t.pin_memory().to(device, non_blocking=True)
    return t.to(device=device, dtype=t.dtype if dtype is None else dtype)
