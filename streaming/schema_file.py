"""Schema files: a click log's fields written in TOML (``--schema path/to/schema.toml``), and
:func:`parse_schema`, which reads every form a ``--schema`` flag takes.

::

    label = "click"          # or ["click", "conversion"]: one task a label

    [dense.price]            # float; transform "log1p" (the default) or "none"
    transform = "none"

    [sparse.item]            # one value, looked up in the table "items"
    table = "items"
    dim = 32                 # the table's rows are 32 wide (default: --embed-dim)

    [sparse.history]         # the last items a user clicked: the same table
    table = "items"
    max_len = 50
    pooling = "mean"

Fields keep the file's order. ``dense = ["I1", "I2"]`` and ``sparse = ["C1", "C2"]`` name plain
fields in one line. Every error is a :class:`~hetgmp.streaming.types.SchemaError` of one short line
naming the file, the line and the field where they are known.

The same settings fit on the command line (:func:`inline_fields`), each after its field's name:
``label=click;dense=price:transform=none;sparse=item:table=items,history:table=items:max_len=50:pooling=mean``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Callable

from hetgmp.streaming.synthetic_config import SHAPES, SyntheticConfig
from hetgmp.streaming.types import MAX_FIELDS, DenseField, Schema, SchemaError, SparseField, shown

__all__ = ["MAX_FILE_BYTES", "inline_fields", "load_schema", "parse_schema"]

# A schema file of 10,000 fields of each kind, every setting given, is under 2 MB; the cap
# keeps a wrong path (a log, a disk image) from being read whole.
MAX_FILE_BYTES = 16 << 20
_SPARSE_KEYS: dict[str, type] = {"table": str, "max_len": int, "pooling": str, "weighted": bool,
                "on_overflow": str, "weights": str, "own_table": bool, "dim": int,
                "first_order": bool}
_DENSE_KEYS: dict[str, type] = {"transform": str}
_HEADER = re.compile(r"^\s*\[\s*(dense|sparse)\s*\.\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*\]")
_KEY = re.compile(r"^\s*(\"[^\"]*\"|'[^']*'|[A-Za-z0-9_-]+)\s*=")
# Arrays and inline tables a schema nests: ``sparse = {a = {max_len = 2}}`` is 2 deep.
_DEEP = 32


def parse_schema(spec: str) -> Schema:
    """The schema a ``--schema`` flag names.

    Args:
        spec: ``criteo`` (or empty), ``"13,26"`` (counts), ``"label=y;dense=a,b;sparse=c,d"``
            (names, each with optional settings:
            ``sparse=item,history:table=item:max_len=20:pooling=mean``), the path of a schema
            file (``*.toml``), the name of a synthetic shape with lists (``multi_hot``,
            ``user_history``: its default schema), or a synthetic shape's name with
            ``+conversion`` (``user_history+conversion``: the stream of
            ``--synthetic-conversion``, two labels).

    Raises:
        SchemaError: A spec of none of these forms, or one describing no valid schema; the
            message is one line naming the file and line, or the spec, and the field.
    """
    spec = spec.strip()
    if not spec or spec.lower() == "criteo":
        return Schema()
    if spec in ("multi_hot", "user_history"):
        return SyntheticConfig(shape=spec).schema  # type: ignore[arg-type]
    shape, plus, extra = spec.partition("+")
    if plus and shape in SHAPES and "=" not in spec and not spec.endswith(".toml"):
        # The synthetic stream of --synthetic-conversion: its shape's schema, two labels.
        if extra != "conversion":
            raise SchemaError(f"schema {shown(spec)}: a synthetic shape takes '+conversion' "
                              "(its second label), nothing else")
        return SyntheticConfig(shape=shape, conversion=True).schema  # type: ignore[arg-type]
    if spec.endswith(".toml"):
        return load_schema(spec)
    if "=" not in spec:
        try:
            n_dense, n_sparse = (int(x) for x in spec.split(","))
        except ValueError:
            raise SchemaError(f"schema {shown(spec)}: expected 'DENSE,SPARSE' counts or "
                              "'label=NAME;dense=A,B;sparse=C,D'") from None
        try:
            return Schema.from_counts(n_dense, n_sparse)
        except SchemaError as exc:
            raise SchemaError(f"schema {shown(spec)}: {exc}") from None
    parts: dict[str, str] = {}
    for item in spec.split(";"):
        key, _, value = item.partition("=")
        parts[key.strip()] = value.strip()
    unknown = sorted(set(parts) - {"label", "dense", "sparse"})
    if unknown:
        raise SchemaError(f"schema {shown(spec)}: unknown key {shown(unknown[0])} (expected "
                          "label, dense, sparse)")
    try:
        labels = [n.strip() for n in parts.get("label", "label").split(",")]
        if not all(labels):
            raise SchemaError(f"schema {shown(spec)}: label must be field names, comma "
                              "separated")
        return Schema.of(labels,
                         inline_fields("dense", parts.get("dense", ""), spec),
                         inline_fields("sparse", parts.get("sparse", ""), spec))
    except SchemaError as exc:
        if str(exc).startswith("schema "):
            raise
        where = f"{exc.kind}.{exc.field}: " if exc.field else ""
        raise SchemaError(f"schema {shown(spec)}: {where}{exc}", exc.kind, exc.field,
                          exc.key) from None


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
        if key and (kind, field, key) in self.keys:
            return self.keys[(kind, field, key)]
        return self.sections.get((kind, field), self.top.get(kind, 1))


def load_schema(path: str | Path) -> Schema:
    """The schema a TOML file describes.

    Raises:
        SchemaError: The file is missing, unreadable, past :data:`MAX_FILE_BYTES`, not UTF-8
            (the message gives the byte and line), not TOML (nested too deep included), or
            describes no valid schema; the message is one line naming the file, the line and
            the field.
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SchemaError(f"schema file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SchemaError(f"schema file {path}: larger than {MAX_FILE_BYTES >> 20} MiB; is it "
                          "a schema?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SchemaError(f"{path} line {line}: not UTF-8 at byte offset {exc.start:,} "
                          f"(0x{raw[exc.start:exc.start + 1].hex()}); TOML is UTF-8") from None
    doc = _toml(text, path)
    lines = _Lines(text)

    def fail(line: int, what: str) -> SchemaError:
        return SchemaError(f"{path} line {line}: {what}")

    unknown = sorted(set(doc) - {"label", "dense", "sparse"})
    if unknown:
        raise fail(lines.top.get(unknown[0], 1),
                   f"unknown key {shown(unknown[0])} (expected label, dense, sparse)")
    label = doc.get("label", "label")
    if isinstance(label, list) and label and all(isinstance(n, str) and n for n in label):
        label = tuple(label)
    elif not isinstance(label, str) or not label:
        raise fail(lines.top.get("label", 1),
                   "label must be a field name, or a list of them (one a task)")
    dense = _fields(doc.get("dense", []), "dense", lines, fail)
    sparse = _fields(doc.get("sparse", []), "sparse", lines, fail)
    try:
        return Schema.of(label, dense, sparse)
    except SchemaError as exc:
        field = f"{exc.kind}.{exc.field}: " if exc.field else ""
        line = lines.of(exc.kind, exc.field, exc.key) if exc.kind else 1
        raise fail(line, f"{field}{exc}") from None


def _toml(text: str, path: Path) -> dict[str, Any]:
    """The parsed file; every way ``tomllib`` fails is one line naming the file."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SchemaError(f"schema file {path} is not valid TOML: {exc}") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables by recursion: a file nested 5,000
        # deep ended in a RecursionError traceback.
        line = _too_deep(text)
        where = f"{path} line {line}" if line else f"schema file {path}"
        raise SchemaError(f"{where}: arrays or inline tables nested too deep to read (a schema "
                          "nests 2 deep)") from None
    except ValueError as exc:  # an integer of over 4,300 digits, which int() refuses
        raise SchemaError(f"schema file {path} is not valid TOML: {shown(str(exc), 80)}") from None


def _too_deep(text: str) -> int:
    """The line where brackets and braces first nest past :data:`_DEEP` (0: nowhere), counted
    outside strings and comments, roughly: it only says where to look."""
    depth = 0
    for n, line in enumerate(text.splitlines(), 1):
        for token in re.findall(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|#.*|[\[\]{}]", line):
            if token in "[{":
                depth += 1
                if depth > _DEEP:
                    return n
            elif token in "]}":
                depth = max(depth - 1, 0)
    return 0


def _fields(raw: Any, kind: str, lines: _Lines,
            fail: Callable[[int, str], SchemaError]) -> list[Any]:
    """The ``kind`` (dense or sparse) fields, checked: a list of names or a table of tables."""
    make, allowed = (DenseField, _DENSE_KEYS) if kind == "dense" else (SparseField, _SPARSE_KEYS)
    if isinstance(raw, (list, dict)) and len(raw) > MAX_FIELDS:  # before a field is made
        raise fail(lines.top.get(kind, 1), f"{len(raw):,} {kind} fields: a schema has at most "
                   f"{MAX_FIELDS:,} of each kind")
    if isinstance(raw, list):
        if not all(isinstance(n, str) and n for n in raw):
            raise fail(lines.top.get(kind, 1), f"{kind} must list field names")
        return [make(n) for n in raw]
    if not isinstance(raw, dict):
        raise fail(lines.top.get(kind, 1), f"{kind}: expected a list of names or [{kind}.NAME] tables")
    out = []
    for name, spec in raw.items():
        where = f"{kind}.{shown(name)[1:-1]}"
        if not isinstance(spec, dict):
            raise fail(lines.of(kind, name), f"{where}: expected a table of settings")
        for key, value in spec.items():
            if key not in allowed:
                raise fail(lines.of(kind, name, key), f"{where}: unknown setting {shown(key)} "
                           f"(expected {', '.join(allowed)})")
            kind_of = allowed[key]
            if not isinstance(value, kind_of) or (kind_of is int and isinstance(value, bool)):
                raise fail(lines.of(kind, name, key),
                           f"{where}: {key} must be a{'n' if kind_of is int else ''} "
                           f"{kind_of.__name__}, not {shown(value)}")
        try:
            out.append(make(name, **spec))
        except SchemaError as exc:
            raise fail(lines.of(kind, name, exc.key), f"{where}: {exc}") from None
    return out


def inline_fields(kind: str, spec: str, where: str) -> list[Any]:
    """The ``kind`` (dense or sparse) fields of a command-line schema: comma-separated names,
    each optionally followed by ``:key=value`` settings (``history:max_len=50:pooling=mean``;
    ``weighted=true``). Errors are :class:`SchemaError` naming ``where`` (the whole spec) and
    the field."""
    make, allowed = (DenseField, _DENSE_KEYS) if kind == "dense" else (SparseField, _SPARSE_KEYS)
    spec_shown = shown(where)
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        name, *settings = (x.strip() for x in item.split(":"))
        field = f"{kind}.{shown(name)[1:-1]}"
        values: dict[str, Any] = {}
        for setting in settings:
            key, sep, raw = (x.strip() for x in setting.partition("="))
            if not sep or key not in allowed:
                raise SchemaError(f"schema {spec_shown}: {field}: expected key=value settings "
                                  f"({', '.join(allowed)}), not {shown(setting)}")
            kind_of = allowed[key]
            if kind_of is bool:
                if raw.lower() not in ("true", "false"):
                    raise SchemaError(f"schema {spec_shown}: {field}: {key} must be true or false")
                values[key] = raw.lower() == "true"
            elif kind_of is int:
                try:
                    values[key] = int(raw)
                except ValueError:
                    raise SchemaError(f"schema {spec_shown}: {field}: {key} must be an int, "
                                      f"not {shown(raw)}") from None
            else:
                values[key] = raw
        try:
            out.append(make(name, **values))
        except SchemaError as exc:
            raise SchemaError(f"schema {spec_shown}: {field}: {exc}") from None
    return out
