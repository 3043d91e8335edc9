"""The bottom layer: helpers every package imports and that import nothing of the project and
nothing heavy (no numpy but for the hash, no pyarrow, torch or Kafka client): configuration
(dataclasses -> flags, the environment, TOML), the clock, process and port helpers, logging
with secrets masked, and the 64-bit mixer every process agrees on.

The environment is read here only (:func:`env_value`).
"""

from hetgmp.runtime.clock import Clock, FakeClock, SystemClock
from hetgmp.runtime.config import (
    add_flags,
    build,
    directory_problem,
    env_value,
    load_toml,
    redact,
    secret,
)
from hetgmp.runtime.hashing import FMIX_C1, FMIX_C2, fmix64, fmix64_int
from hetgmp.runtime.lazy import lazy_exports
from hetgmp.runtime.logs import register_secret, setup_logging
from hetgmp.runtime.processes import (
    die_with_parent,
    free_port,
    free_ports,
    port_free,
    stop_on_signals,
    when_gone,
)

__all__ = [
    "FMIX_C1",
    "FMIX_C2",
    "Clock",
    "FakeClock",
    "SystemClock",
    "add_flags",
    "build",
    "die_with_parent",
    "directory_problem",
    "env_value",
    "fmix64",
    "fmix64_int",
    "free_port",
    "free_ports",
    "lazy_exports",
    "load_toml",
    "port_free",
    "redact",
    "register_secret",
    "secret",
    "setup_logging",
    "stop_on_signals",
    "when_gone",
]
