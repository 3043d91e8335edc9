"""What the chaos benchmark proves from the ranks' ledgers and the topic itself.

The ledgers (``trainer.testing.Ledger``) hold, per step, the records each rank trained from each
(partition, message offset). Read back in the order the job's runs started:

* a message is *skipped* when fewer of its records were trained than it holds;
* a crash *threw away* the records its run trained that a later run trained again: what came
  after the last checkpoint, read again after the resume;
* the *distinct* records trained are what the final checkpoint must count.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetgmp.streaming import KafkaSettings
from hetgmp.trainer.testing import read_ledger

__all__ = ["Account", "LedgerWatch", "account", "topic_offsets"]

# Keys of (partition, offset) pairs as one int64: partitions below 2**20, offsets below 2**43.
_SHIFT = 43


def _keys(partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return (partitions.astype(np.int64) << _SHIFT) | offsets.astype(np.int64)


class LedgerWatch:
    """The newest step any rank has written to its ledger, read as the files grow."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._read: dict[Path, int] = {}
        self._latest = 0.0

    def latest_ms(self) -> float:
        """Wall time (ms) of the newest step written so far (0 before any)."""
        for path in self.directory.glob("run-*/rank-*.i64"):
            done = self._read.get(path, 0)
            size = path.stat().st_size // 32 * 32
            if size > done:
                with path.open("rb") as f:
                    f.seek(size - 32)
                    self._latest = max(self._latest, float(np.frombuffer(f.read(32),
                                                                         np.int64)[0]))
                self._read[path] = size
        return self._latest


@dataclass(frozen=True)
class Account:
    """What the ledgers and the topic show together.

    Attributes:
        expected: Records the topic holds.
        distinct: Records trained at least once.
        skipped: Messages of the topic with fewer records trained than they hold.
        replays: For each run that a crash ended, the records it trained that a later run
            trained again (what the crash threw away).
        max_replay: The largest of those.
    """

    expected: int
    distinct: int
    skipped: int
    replays: list[int]
    max_replay: int


def _sum_by_key(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts, minlength=uniq.size).astype(np.int64)


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The value of each query key in sorted ``keys`` (0 where absent)."""
    if keys.size == 0:
        return np.zeros(query.size, np.int64)
    pos = np.minimum(np.searchsorted(keys, query), keys.size - 1)
    return np.where(keys[pos] == query, values[pos], 0)


def account(directory: Path, ends: dict[int, int], per_message: int) -> Account:
    """Read every ledger of ``directory`` against a topic whose partitions end at ``ends``
    (messages of ``per_message`` records each)."""
    runs: dict[str, list[np.ndarray]] = defaultdict(list)
    for path in directory.glob("run-*/rank-*.i64"):
        runs[path.parent.name].append(read_ledger(path))
    per_run = []
    for run in sorted(runs):
        rows = np.concatenate(runs[run]) if runs[run] else np.zeros((0, 4), np.int64)
        per_run.append(_sum_by_key(_keys(rows[:, 1], rows[:, 2]), rows[:, 3]))
    # What a crash threw away: the records its run trained that a later run trained again
    # (a record a checkpoint covered is never trained again). Two crashes in a row each count
    # what they lost, so a record lost twice counts for both.
    replays: list[int] = []
    later_k, later_c = np.zeros(0, np.int64), np.zeros(0, np.int64)
    for i in range(len(per_run) - 2, -1, -1):
        k_next, c_next = per_run[i + 1]
        later_k, later_c = _sum_by_key(np.concatenate([later_k, k_next]),
                                       np.concatenate([later_c, c_next]))
        k, c = per_run[i]
        replays.insert(0, int(np.minimum(c, _lookup(later_k, later_c, k)).sum()))
    keys, counts = _sum_by_key(
        np.concatenate([k for k, _ in per_run] or [np.zeros(0, np.int64)]),
        np.concatenate([c for _, c in per_run] or [np.zeros(0, np.int64)]))
    expected = np.concatenate([_keys(np.full(end, p), np.arange(end))
                               for p, end in sorted(ends.items())] or [np.zeros(0, np.int64)])
    trained = _lookup(keys, counts, expected)
    return Account(expected=int(expected.size * per_message),
                   distinct=int(np.minimum(counts, per_message).sum()),
                   skipped=int((trained < per_message).sum()), replays=replays,
                   max_replay=max(replays, default=0))


def topic_offsets(kafka: KafkaSettings, topic: str, timeout_s: float = 60.0) -> dict[int, int]:
    """Next offset of every partition of ``topic``: the topic read back whole (the broker's
    end offsets are not to be trusted on the embedded broker; what a fetch returns is)."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    from hetgmp.streaming import topic_partitions

    parts = sorted(topic_partitions(kafka, topic))
    client = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in parts]
        client.assign(tps)
        client.seek_to_beginning(*tps)
        ends = dict.fromkeys(parts, 0)
        quiet = time.monotonic()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() - quiet < 3.0 and time.monotonic() < deadline:
            got = client.poll(timeout_ms=500, max_records=100_000)
            for tp, records in got.items():
                ends[tp.partition] = max(ends[tp.partition], records[-1].offset + 1)
                quiet = time.monotonic()
        return ends
    finally:
        client.close()
