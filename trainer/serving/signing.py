"""Signed delta logs: an HMAC over every message, with a key the trainer and serve share.

Anyone who can write to the delta-log topic can craft a message that passes every check a
message can be given alone (:func:`~hetgmp.trainer.serving.deltas.decode`): the lineage is readable in
any message of the topic. With ``--delta-key-file`` on both sides, every message carries
``HMAC-SHA256(key, payload)`` in its Kafka header :data:`HEADER`, and serve applies only messages
whose signature it can verify. A replayed message is signed too, but its version is one serving
has already held, so the version rule makes it a no-op.

The key file holds the key's bytes (one trailing newline is dropped); at least
:data:`MIN_KEY_BYTES`, e.g. ``head -c 32 /dev/urandom > delta.key``.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Sequence

from hetgmp.trainer.serving.deltas import Rejected

__all__ = ["HEADER", "MIN_KEY_BYTES", "Signer", "load_signer"]

HEADER = "hetgmp-hmac-sha256"
MIN_KEY_BYTES = 16


class Signer:
    """Signs and verifies delta-log payloads with one shared key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a delta-log key of {len(key)} bytes; at least {MIN_KEY_BYTES}")
        self._key = key

    def __repr__(self) -> str:
        return "Signer(key=<hidden>)"

    def sign(self, payload: bytes) -> bytes:
        """The signature header's value for ``payload`` (hex)."""
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest().encode()

    def headers(self, payload: bytes) -> list[tuple[str, bytes]]:
        """The Kafka headers a signed message carries."""
        return [(HEADER, self.sign(payload))]

    def verify(self, payload: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None
               ) -> None:
        """Raise unless ``headers`` carry exactly one signature, and it is ``payload``'s.

        Raises:
            Rejected: With reason ``signature``.
        """
        found = [v for k, v in headers or () if k == HEADER]
        if len(found) != 1 or found[0] is None:
            raise Rejected("signature", f"{len(found)} {HEADER} headers; a signed log has one")
        if not hmac.compare_digest(found[0], self.sign(payload or b"")):
            raise Rejected("signature", "the signature is not this payload's under the key")


def load_signer(path: str) -> Signer | None:
    """The signer of key file ``path`` ('' = unsigned: None).

    Raises:
        ValueError: The file cannot be read or holds too short a key (the message names it).
    """
    if not path:
        return None
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"delta-log key file {path}: {exc.strerror or exc}") from None
    if key.endswith(b"\n"):
        key = key[:-1]
    try:
        return Signer(key)
    except ValueError as exc:
        raise ValueError(f"delta-log key file {path}: {exc}") from None
