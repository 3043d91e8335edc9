"""Logging for every process of the project, with secrets masked whichever library logs them.

kafka-python's admin client logs its whole configuration at DEBUG, SASL password included, and a
library's exception text may quote a setting too. So masking cannot rely on each caller: every
secret the project hands to a client is registered here (:func:`register_secret`, called by
:meth:`hetgmp.streaming.KafkaSettings.client_kwargs`), and the one formatter every handler uses
replaces each registered value in the finished line (message, arguments and traceback alike).
"""

from __future__ import annotations

import logging
import threading

__all__ = ["MASK", "RedactingFormatter", "register_secret", "setup_logging"]

MASK = "***"
_DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_lock = threading.Lock()
_secrets: set[str] = set()


def _forms(value: str) -> set[str]:
    """The ways a library may print ``value``: as it is, escaped as Python's ``repr`` of a
    string or of its UTF-8 bytes writes it (a backslash doubled, a tab as ``\\t``, either
    quote escaped), as JSON writes it, and URL-quoted."""
    import json
    from urllib.parse import quote, quote_plus

    forms = {value, repr(value)[1:-1], repr(value.encode())[2:-1], json.dumps(value)[1:-1],
             value.encode("unicode_escape").decode("ascii"), quote(value, safe=""),
             quote_plus(value)}
    for q in ("'", '"'):  # either quote escaped, whichever repr chose to wrap it in
        forms.add(value.encode("unicode_escape").decode("ascii").replace(q, "\\" + q))
    return {f for f in forms if f}


def register_secret(value: str) -> None:
    """Mask ``value`` in every log line from now on, in every form :func:`_forms` knows
    (empty values are ignored)."""
    if value:
        with _lock:
            _secrets.update(_forms(value))


def redact_text(text: str) -> str:
    """``text`` with every registered secret masked (longest first, so that a secret holding
    another is masked whole)."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


class RedactingFormatter(logging.Formatter):
    """A formatter whose output never holds a registered secret."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def setup_logging(level: int | str = logging.INFO, fmt: str = _DEFAULT_FORMAT,
                  kafka_level: int = logging.CRITICAL) -> None:
    """Configure the root logger once per process: one stderr handler, secrets masked.

    Unless ``level`` is DEBUG, kafka-python's own lines below ``kafka_level`` are left out: it
    logs every failed connection at ERROR, and our retry lines say what matters.
    """
    level = logging.getLevelName(level) if isinstance(level, str) else level
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler()
    handler.setFormatter(RedactingFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kafka").setLevel(logging.NOTSET if level <= logging.DEBUG
                                        else max(level, kafka_level))
