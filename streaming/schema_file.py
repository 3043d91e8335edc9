"""Schema files: a click log's fields written in TOML (``--schema path/to/schema.toml``).

::

    label = "click"

    [dense.price]            # float; transform "log1p" (the default) or "none"
    transform = "none"

    [sparse.item]            # one value, looked up in the table "items"
    table = "items"

    [sparse.history]         # the last items a user clicked: the same table
    table = "items"
    max_len = 50
    pooling = "mean"

Fields keep the file's order. ``dense = ["I1", "I2"]`` and ``sparse = ["C1", "C2"]`` name plain
fields in one line. Every error names the file, the line and the field.

The same settings fit on the command line (:func:`inline_fields`), each after its field's name:
``label=click;dense=price:transform=none;sparse=item:table=items,history:table=items:max_len=50:pooling=mean``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Callable

from streaming.types import DenseField, Schema, SparseField

__all__ = ["inline_fields", "load_schema"]

_SPARSE_KEYS: dict[str, type] = {"table": str, "max_len": int, "pooling": str, "weighted": bool,
                "on_overflow": str, "weights": str}
_DENSE_KEYS: dict[str, type] = {"transform": str}
_HEADER = re.compile(r"^\s*\[\s*(dense|sparse)\s*\.\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*\]")
_KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=")


class _Lines:
    """Where each section and key of the file sits (1-based), for the error messages."""

    def __init__(self, text: str) -> None:
        self.sections: dict[tuple[str, str], int] = {}
        self.keys: dict[tuple[str, str, str], int] = {}
        self.top: dict[str, int] = {}
        section: tuple[str, str] | None = None
        for n, line in enumerate(text.splitlines(), 1):
            header = _HEADER.match(line)
            if header:
                section = (header.group(1), header.group(2).strip("\"'"))
                self.sections[section] = n
                continue
            if line.lstrip().startswith("["):
                section = None
                continue
            key = _KEY.match(line)
            if key is None:
                continue
            name = key.group(1).strip("\"'")
            if section is None:
                self.top.setdefault(name, n)
            else:
                self.keys.setdefault((*section, name), n)

    def of(self, kind: str, field: str, key: str | None = None) -> int:
        if key is not None and (kind, field, key) in self.keys:
            return self.keys[(kind, field, key)]
        return self.sections.get((kind, field), self.top.get(kind, 1))


def load_schema(path: str | Path) -> Schema:
    """The schema a TOML file describes.

    Raises:
        ValueError: The file is missing, is not TOML, or describes no valid schema; the
            message names the file, the line and the field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"schema file {path}: {exc.strerror or exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"schema file {path} is not valid TOML: {exc}") from None
    lines = _Lines(text)

    def fail(line: int, what: str) -> ValueError:
        return ValueError(f"{path} line {line}: {what}")

    unknown = sorted(set(doc) - {"label", "dense", "sparse"})
    if unknown:
        raise fail(lines.top.get(unknown[0], 1),
                   f"unknown key {unknown[0]!r} (expected label, dense, sparse)")
    label = doc.get("label", "label")
    if not isinstance(label, str) or not label:
        raise fail(lines.top.get("label", 1), "label must be a field name")
    dense = _fields(doc.get("dense", []), "dense", lines, fail)
    sparse = _fields(doc.get("sparse", []), "sparse", lines, fail)
    try:
        return Schema.of(label, dense, sparse)
    except ValueError as exc:
        raise fail(1, str(exc)) from None


def _fields(raw: Any, kind: str, lines: _Lines,
            fail: Callable[[int, str], ValueError]) -> list[Any]:
    """The ``kind`` (dense or sparse) fields, checked: a list of names or a table of tables."""
    make, allowed = (DenseField, _DENSE_KEYS) if kind == "dense" else (SparseField, _SPARSE_KEYS)
    if isinstance(raw, list):
        if not all(isinstance(n, str) and n for n in raw):
            raise fail(lines.top.get(kind, 1), f"{kind} must list field names")
        return [make(n) for n in raw]
    if not isinstance(raw, dict):
        raise fail(lines.top.get(kind, 1), f"{kind}: expected a list of names or [{kind}.NAME] tables")
    out = []
    for name, spec in raw.items():
        where = f"{kind}.{name}"
        if not isinstance(spec, dict):
            raise fail(lines.of(kind, name), f"{where}: expected a table of settings")
        for key, value in spec.items():
            if key not in allowed:
                raise fail(lines.of(kind, name, key),
                           f"{where}: unknown setting {key!r} (expected {', '.join(allowed)})")
            kind_of = allowed[key]
            if not isinstance(value, kind_of) or (kind_of is int and isinstance(value, bool)):
                raise fail(lines.of(kind, name, key),
                           f"{where}: {key} must be a{'n' if kind_of is int else ''} "
                           f"{kind_of.__name__}, not {value!r}")
        try:
            out.append(make(name, **spec))
        except ValueError as exc:
            key = next((k for k in spec if k in str(exc)), None)
            raise fail(lines.of(kind, name, key), f"{where}: {exc}") from None
    return out


def inline_fields(kind: str, spec: str, where: str) -> list[Any]:
    """The ``kind`` (dense or sparse) fields of a command-line schema: comma-separated names,
    each optionally followed by ``:key=value`` settings (``history:max_len=50:pooling=mean``;
    ``weighted=true``). Errors name ``where`` (the whole spec) and the field."""
    make, allowed = (DenseField, _DENSE_KEYS) if kind == "dense" else (SparseField, _SPARSE_KEYS)
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        name, *settings = (x.strip() for x in item.split(":"))
        field = f"{kind}.{name}"
        values: dict[str, Any] = {}
        for setting in settings:
            key, sep, raw = (x.strip() for x in setting.partition("="))
            if not sep or key not in allowed:
                raise ValueError(f"schema {where!r}: {field}: expected key=value settings "
                                 f"({', '.join(allowed)}), not {setting!r}")
            kind_of = allowed[key]
            if kind_of is bool:
                if raw.lower() not in ("true", "false"):
                    raise ValueError(f"schema {where!r}: {field}: {key} must be true or false")
                values[key] = raw.lower() == "true"
            elif kind_of is int:
                try:
                    values[key] = int(raw)
                except ValueError:
                    raise ValueError(f"schema {where!r}: {field}: {key} must be an int, "
                                     f"not {raw!r}") from None
            else:
                values[key] = raw
        try:
            out.append(make(name, **values))
        except ValueError as exc:
            raise ValueError(f"schema {where!r}: {field}: {exc}") from None
    return out
