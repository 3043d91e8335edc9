"""Configuration: frozen dataclasses -> command-line flags, with environment and TOML defaults.

Each component describes its settings as one frozen dataclass. :func:`add_flags` turns a dataclass
into argparse flags (``--field-name``), :func:`build` turns the parsed namespace back into the
dataclass. A value is taken from, in order: the command line, the environment variable shown in
``--help`` (``HETGMP_<SECTION>_<FIELD>``), the TOML file given with ``--config`` (table
``[section]``), the dataclass default.

This is the one module of the project that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar

__all__ = ["add_flags", "build", "load_toml", "env_value", "secret", "redact"]

T = TypeVar("T")
ENV_PREFIX = "HETGMP_"


def secret(default: Any = "", help: str = "") -> Any:
    """A dataclass field whose value never appears in logs, reprs or ``--help`` defaults."""
    return dataclasses.field(default=default, repr=False, metadata={"help": help, "secret": True})


def redact(obj: Any) -> dict[str, Any]:
    """The dataclass as a dict with secret fields masked, for logs and reports."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = "***" if f.metadata.get("secret") and value else value
    return out


def env_value(name: str) -> str | None:
    """Read one environment variable (the only place the project does)."""
    return os.environ.get(name)


def load_toml(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The TOML file's tables, or ``{}`` without a path."""
    if not path:
        return {}
    try:
        with Path(path).open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise SystemExit(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"config file {path} is not valid TOML: {exc}") from None


def _env_name(section: str, name: str) -> str:
    return f"{ENV_PREFIX}{section}_{name}".upper().replace("-", "_")


def _flag(prefix: str, name: str) -> str:
    return "--" + (f"{prefix}-" if prefix else "") + name.replace("_", "-")


def _dest(prefix: str, name: str) -> str:
    return (f"{prefix}_" if prefix else "") + name


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(tp: Any) -> tuple[Any, list[str] | None]:
    """(function from string to value, choices) for a field type."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = [str(c) for c in typing.get_args(tp)]
        return str, choices
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _converter(args[0])
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        conv, _ = _converter(inner)
        return (lambda s: tuple(conv(x.strip()) for x in s.split(",") if x.strip())), None
    if tp is bool:
        return _parse_bool, None
    if tp in (int, float, str):
        return tp, None
    raise TypeError(f"unsupported config field type: {tp!r}")


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    section: str,
    prefix: str = "",
    toml: Mapping[str, Any] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Add one flag per field of dataclass ``cls``; defaults come from env, TOML, dataclass."""
    hints = typing.get_type_hints(cls)
    table = (toml or {}).get(section, {})
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        conv, choices = _converter(hints[f.name])
        env = _env_name(section, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        source = "default"
        if f.name in table:
            default, source = table[f.name], "config file"
        raw_env = env_value(env)
        if raw_env is not None:
            try:
                default, source = conv(raw_env), "environment"
            except ValueError as exc:
                raise SystemExit(f"environment variable {env}: {exc}") from None
        shown = "***" if f.metadata.get("secret") and default else default
        if isinstance(shown, tuple):
            shown = ",".join(str(x) for x in shown)
        help_text = f.metadata.get("help", "")
        suffix = f"(default: {shown!s}{'' if source == 'default' else ' from ' + source}; env {env})"
        kwargs: dict[str, Any] = {
            "dest": _dest(prefix, f.name),
            "default": default,
            "help": f"{help_text} {suffix}".strip(),
        }
        if hints[f.name] is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = conv
            kwargs["metavar"] = f.name.upper()
            if choices:
                kwargs["choices"] = choices
                kwargs.pop("metavar")
        parser.add_argument(_flag(prefix, f.name), **kwargs)


def build(cls: type[T], ns: argparse.Namespace, prefix: str = "", **overrides: Any) -> T:
    """The dataclass built from the namespace filled by :func:`add_flags` (plus overrides)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        dest = _dest(prefix, f.name)
        if f.init and hasattr(ns, dest):
            values[f.name] = getattr(ns, dest)
    values.update(overrides)
    return cls(**values)


def directory_problem(flag: str, path: str, *, write: bool = True) -> str:
    """Why ``path`` (given as ``flag``) cannot be a directory this process uses ('' = it can),
    so that a command refuses it in one line before anything starts: a file there, a file
    above it, or (``write``) no permission to create or write it."""
    import os
    from pathlib import Path

    p = Path(path)
    if p.exists() and not p.is_dir():
        return f"{flag} {path} is a file, not a directory"
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag} {path}: {existing} is a file, not a directory"
    if write and not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {path}: {existing} is not writable by this user"
    return ""
