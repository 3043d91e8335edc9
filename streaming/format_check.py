"""Telling a topic of another format or schema from a malformed record among good ones.

A malformed record is dead-lettered and the records around it go on (invariant 6). But a topic
read with the wrong ``--consumer-format`` or ``--consumer-schema`` rejects *every* record, and
dead-lettering all of them ended a run with exit status 0, nothing trained, and the whole topic
copied to the dead-letter topic (``consume`` of an Arrow topic as TSV: 0 records, 73,413
rejects). The rule here:

* **while no record has decoded yet**, the consumer counts what it rejects; when the first
  ``stop_on_rejects`` records read (100 by default), or the first 16 messages, are all rejected,
  it stops with :class:`FormatMismatch` (a :class:`~hetgmp.streaming.positions.ConsumerFailed`: one line,
  exit status 1), before the rejects of that poll are dead-lettered;
* the line names the cause: the messages' own format where their first bytes tell it
  (:func:`sniff`: Arrow IPC's continuation marker ``FF FF FF FF`` or the Arrow file magic
  ``ARROW1``, a JSON object's ``{``, a tab-separated first line) and it is not the flag's, with
  the flag to give; else the schema, with the reasons and the first record's detail;
* **once one record has decoded**, the check is off for good: a malformed record among good
  ones is dead-lettered and the run goes on. A topic whose first 100 records really are all
  malformed is read past with ``--consumer-stop-on-rejects 0``.

An Arrow message that cannot be read is one reject (its records cannot be counted), hence the
count of messages beside the count of records.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from hetgmp.streaming.positions import ConsumerFailed
from hetgmp.streaming.types import Reject, RejectReason

__all__ = ["FirstRecordsCheck", "FormatMismatch", "sniff"]

# Messages all rejected, before any record decoded, that stop the consumer whatever they held.
FIRST_MESSAGES = 16
# What each format is called in the line.
_NAMES = {"arrow": "Arrow IPC record batches", "json": "JSON lines",
          "tsv": "tab-separated (TSV) lines"}
_ARROW_STREAM = b"\xff\xff\xff\xff"  # the continuation marker that opens every IPC message
_ARROW_FILE = b"ARROW1"


class FormatMismatch(ConsumerFailed):
    """The first records read were all rejected: the topic's format or schema is not the one
    the consumer was given (the message says which and the flag to change)."""


def sniff(payload: bytes | None) -> str | None:
    """The format a message's first bytes show: ``arrow``, ``json`` or ``tsv``; None when
    they show none of them (an empty message, a line without a tab, other binary data)."""
    if not payload:
        return None
    if payload.startswith(_ARROW_STREAM) or payload.startswith(_ARROW_FILE):
        return "arrow"
    head = payload[:4096].lstrip()
    if head.startswith(b"{"):
        return "json"
    line = head.split(b"\n", 1)[0]
    if b"\t" in line and b"\0" not in line:
        return "tsv"
    return None


class FirstRecordsCheck:
    """Counts the rejects of a consumer's first polls, until a record decodes (see the module).

    Args:
        topic: the topic read (for the line).
        format: the ``--consumer-format`` given.
        schema: the ``--consumer-schema`` given.
        records: rejected records, all of the first read, that stop the consumer (0: never).
    """

    def __init__(self, topic: str, format: str, schema: str, records: int) -> None:
        self.topic, self.format, self.schema = topic, format, schema
        self.records = records
        self.armed = records > 0
        self._reasons: Counter[str] = Counter()
        self._messages = 0
        self._formats: Counter[str] = Counter()
        self._first: Reject | None = None

    def check(self, payloads: Sequence[bytes | None], decoded: int, rejects: list[Reject]) -> None:
        """One poll's slice: its messages, how many records decoded, and the rejects.

        Raises:
            FormatMismatch: no record has decoded yet and the rejects reach the limit.
        """
        if not self.armed:
            return
        if decoded:
            self.armed = False  # a good record: what is rejected from now on is dead-lettered
            return
        self._messages += len(payloads)
        self._reasons.update(r.reason.value for r in rejects)
        if self._first is None and rejects:
            self._first = rejects[0]
        self._formats.update(f for f in map(sniff, payloads[:FIRST_MESSAGES]) if f is not None)
        if sum(self._reasons.values()) >= self.records or self._messages >= FIRST_MESSAGES:
            raise FormatMismatch(self.line())

    def line(self) -> str:
        """What the consumer says when it stops (one line)."""
        reasons = ", ".join(f"{why} {k:,}" for why, k in self._reasons.most_common())
        read = "message" if self._messages == 1 else f"{self._messages:,} messages"
        seen = f"every record of the first {read} read was rejected: {reasons}"
        found = self._formats.most_common(1)[0][0] if len(self._formats) == 1 else None
        if found is not None and found != self.format:
            return (f"topic {self.topic!r} holds {_NAMES[found]}, not {_NAMES[self.format]}: "
                    f"read it with --consumer-format {found} ({seen})")
        first = self._first
        detail = ""
        if first is not None:
            detail = f"; the first: {first.detail or first.reason.value}"
            if first.reason is RejectReason.WRONG_FIELD_COUNT and self.format == "tsv":
                fields = first.payload.count(b"\t") + 1
                detail += f" (it has {fields})"
        return (f"topic {self.topic!r}: {seen}{detail}. Its records do not match "
                f"--consumer-schema {self.schema!r} (--consumer-format {self.format}): give the "
                f"schema they were written with, or --consumer-stop-on-rejects 0 to dead-letter "
                f"them and go on")
