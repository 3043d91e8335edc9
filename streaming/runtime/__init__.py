"""Project-wide helpers every package may import: configuration (dataclasses -> flags, the
environment, TOML), the clock, process and port helpers, and logging with secrets masked.

The environment is read here only (:func:`env_value`).
"""

from streaming.runtime.clock import Clock, FakeClock, SystemClock
from streaming.runtime.config import (
    add_flags,
    build,
    directory_problem,
    env_value,
    load_toml,
    redact,
    secret,
)
from streaming.runtime.logs import register_secret, setup_logging
from streaming.runtime.processes import (
    die_with_parent,
    free_port,
    free_ports,
    port_free,
    stop_on_signals,
)

__all__ = [
    "Clock",
    "FakeClock",
    "SystemClock",
    "add_flags",
    "build",
    "die_with_parent",
    "directory_problem",
    "env_value",
    "free_port",
    "free_ports",
    "load_toml",
    "port_free",
    "redact",
    "register_secret",
    "secret",
    "setup_logging",
    "stop_on_signals",
]
