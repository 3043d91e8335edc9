"""The torch device a benchmark runs on: its flag checked, and the wait that ends a timed span."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

__all__ = ["parse_device", "synchronizer"]


def parse_device(parser: argparse.ArgumentParser, text: str) -> torch.device:
    """``--device`` as a torch device that can hold a tensor; a usage error (exit 2) if not."""
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        parser.error(f"--device {text}: {exc}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA device")
    try:
        torch.zeros(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        parser.error(f"--device {text}: {exc}")
    return device


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work before a clock is read (nothing off CUDA)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
