"""The click-log consumer: Kafka records in, decoded columnar batches out, offsets under control.

Contract (bytewax-style source): :meth:`ClickConsumer.next_batch` returns whatever is available
within a timeout, decoded; :meth:`ClickConsumer.snapshot` gives the next offset per partition of
what has been *returned*; :meth:`ClickConsumer.commit` commits a snapshot only when the caller
says so (auto-commit is off), so a trainer commits exactly what its checkpoint holds.

Failure handling:

* broker not up at start: :func:`hetgmp.streaming.kafka.connect_with_retry` (backoff, a log line a try);
* topic missing at start: :class:`~hetgmp.streaming.kafka.TopicNotFound` at once (or after
  ``topic_wait_s``), never a silent wait;
* broker restart mid-stream: the client reconnects inside ``poll``; poll errors are logged and
  retried with backoff rather than raised;
* a log that went backwards or was replaced (a broker that lost its storage, a topic created
  again): :class:`~hetgmp.streaming.positions.LogLost`, raised before any record of the new log is
  returned and before the snapshot moves (:mod:`hetgmp.streaming.positions` has the checks). Starting
  positions are resolved here (the committed offset, else ``auto_offset_reset``), and the
  client library's own reset is off, so that it never jumps over records silently;
* group rebalance: revoked partitions leave the snapshot (their new owner resumes from the last
  commit); ``commit`` retries through ``RebalanceInProgressError``, keeping records that the
  rejoining poll returns for the next ``next_batch``;
* undecodable records: counted by reason and sent to the dead-letter topic with the reason in a
  header; the records around them decode as usual. Dead letters are flushed before each commit,
  so a committed offset never covers a rejected record that was not dead-lettered. A topic of
  another format or schema (the first ``stop_on_rejects`` records or 16 messages all rejected,
  none decoded) is :class:`~hetgmp.streaming.format_check.FormatMismatch` instead, which names the
  flag to change (:mod:`hetgmp.streaming.format_check`).

The Kafka client library (kafka-python or librdkafka's confluent-kafka) sits behind
:class:`hetgmp.streaming.clients.ConsumerClient`; everything above is the same on either.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Callable, Iterable, Literal, Mapping, Sequence

import numpy as np

from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming.clients import (
    CommitMoved,
    CommitRebalancing,
    ConsumerClient,
    DeadLetterSender,
    Fetched,
    NoPosition,
    TransientError,
    connect_consumer,
    dead_letter_sender,
    resolve,
)
from hetgmp.streaming.codec import FORMATS, DecodeConfig, Decoder
from hetgmp.streaming.format_check import FirstRecordsCheck, FormatMismatch
from hetgmp.streaming.kafka import KafkaSettings, topic_partitions
from hetgmp.streaming.positions import ConsumerFailed, LogGuard, LogLost
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.types import ClickBatch, Reject

__all__ = ["ClickConsumer", "ConsumerConfig", "ConsumerFailed", "ConsumerStats", "FormatMismatch", "LogLost"]

log = logging.getLogger(__name__)

# Payload bytes decoded at a time (see ClickConsumer._decode).
_DECODE_BYTES = 2 << 20


@dataclass(frozen=True)
class ConsumerConfig:
    """Settings of :class:`ClickConsumer`."""

    topic: str = field(default="clicks", metadata={"help": "topic of click logs"})
    group_id: str = field(
        default="hetgmp",
        metadata={"help": "consumer group; empty = no group, read every partition (or --partitions)"},
    )
    client: Literal["auto", "kafka-python", "confluent"] = field(
        default="auto",
        metadata={"help": "Kafka client library: kafka-python, confluent (librdkafka; several "
                          "times faster a message), or auto (confluent where installed)"})
    format: Literal["tsv", "json", "arrow"] = field(
        default="tsv",
        metadata={"help": "record format: tsv (Criteo lines), json (an object a line) or arrow "
                          "(an Arrow IPC record batch a message)"})
    schema: str = field(
        default="criteo",
        metadata={"help": "fields: 'criteo', 'DENSE,SPARSE', 'label=y;dense=a,b;sparse=c', a "
                          "schema file PATH.toml, multi_hot, user_history, or SHAPE+conversion "
                          "(synthetic shapes; docs/schemas.md)"},
    )
    value_separator: str = field(
        default=",", metadata={"help": "tsv: the character between a list field's values "
                               "(fields with max_len > 1 in a schema file)"})
    dead_letter_topic: str = field(
        default="", metadata={"help": "topic for undecodable records; empty = TOPIC.dlq, 'none' = off"}
    )
    dead_letter_max_bytes: int = field(
        default=262144, metadata={"help": "dead-lettered payloads are cut to this size (header says so)"}
    )
    max_record_bytes: int = field(
        default=65536, metadata={"help": "longer records are rejected as too_large"}
    )
    auto_offset_reset: Literal["earliest", "latest"] = field(
        default="earliest", metadata={"help": "where to start without a committed offset"}
    )
    session_timeout_ms: int = field(
        default=6000, metadata={"help": "group session timeout (a join takes about half of it)"}
    )
    heartbeat_interval_ms: int = field(default=1000, metadata={"help": "group heartbeat interval"})
    max_poll_interval_ms: int = field(
        default=300000, metadata={"help": "longest gap between polls before the group evicts us"}
    )
    fetch_max_bytes: int = field(default=64 << 20, metadata={"help": "bytes per fetch response"})
    max_partition_fetch_bytes: int = field(
        default=8 << 20, metadata={"help": "bytes per partition per fetch"}
    )
    fetch_wait_ms: int = field(
        default=100,
        metadata={"help": "longest the broker holds a fetch waiting for new messages (lower: "
                  "fresher records, more requests while the topic is quiet)"},
    )
    connect_timeout_s: float = field(
        default=300.0, metadata={"help": "give up if no broker answers for this long at start"}
    )
    topic_wait_s: float = field(
        default=0.0,
        metadata={"help": "wait this long for a missing topic to appear; 0 = report it at once"},
    )
    commit_retries: int = field(
        default=30, metadata={"help": "retries of a commit interrupted by a rebalance"}
    )
    stop_on_rejects: int = field(
        default=100,
        metadata={"help": "stop with an error when the first this many records read (or the "
                  "first 16 messages) are all rejected: the topic's format or schema is not "
                  "the one given (a malformed record among good ones is dead-lettered); "
                  "0 = dead-letter them and go on"})

    def __post_init__(self) -> None:
        # Checked here rather than where used: a bad value (max_record_bytes 0 rejected every
        # record and the run ended "done") should stop the program before it reads anything.
        if not self.topic:
            raise ValueError("topic must not be empty")
        resolve(self.client)  # an unknown or uninstalled client stops here, with what to do
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(
                f"auto_offset_reset must be 'earliest' or 'latest', got {self.auto_offset_reset!r}")
        for name in ("max_record_bytes", "dead_letter_max_bytes", "fetch_max_bytes", "fetch_wait_ms",
                     "max_partition_fetch_bytes", "session_timeout_ms", "heartbeat_interval_ms",
                     "max_poll_interval_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below "
                f"session_timeout_ms ({self.session_timeout_ms}): the group would evict a member "
                "between two heartbeats")
        if not self.connect_timeout_s > 0:
            raise ValueError(f"connect_timeout_s must be positive, got {self.connect_timeout_s}")
        if not self.topic_wait_s >= 0:
            raise ValueError(f"topic_wait_s must be >= 0, got {self.topic_wait_s}")
        if self.commit_retries < 0 or self.stop_on_rejects < 0:
            raise ValueError(f"commit_retries and stop_on_rejects must be >= 0, got "
                             f"{self.commit_retries} and {self.stop_on_rejects}")

    @property
    def dead_letter(self) -> str | None:
        """The dead-letter topic name, or None when dead-lettering is off."""
        if self.dead_letter_topic.lower() == "none":
            return None
        return self.dead_letter_topic or f"{self.topic}.dlq"


@dataclass
class ConsumerStats:
    """Counters of what the consumer has done (read by metrics and reports)."""

    messages: int = 0
    records: int = 0
    bytes: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    truncated: Counter[str] = field(default_factory=Counter)  # list values past max_len, by field
    dead_lettered: int = 0
    poll_errors: int = 0
    commits: int = 0
    commit_retries: int = 0
    rebalances: int = 0


class _Listener:
    """Rebalance callbacks: forget revoked partitions (their next owner resumes from the commit)
    and start assigned ones at the group's committed offset, else at ``auto_offset_reset``."""

    def __init__(self, owner: ClickConsumer) -> None:
        self.owner = owner

    def revoked(self, partitions: set[int]) -> None:
        self.owner._forget(partitions)

    def assigned(self, partitions: set[int], committed: Mapping[int, int] | None) -> None:
        self.owner.stats.rebalances += 1
        log.info("assigned partitions %s", sorted(partitions))
        if partitions and committed is not None:
            self.owner._start_at(partitions, committed)


class ClickConsumer:
    """Consumes click logs from Kafka into :class:`~hetgmp.streaming.types.ClickBatch` values."""

    def __init__(
        self,
        kafka: KafkaSettings,
        config: ConsumerConfig | None = None,
        *,
        partitions: Sequence[int] | None = None,
        clock: Clock | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        """Create (not yet connect) a consumer.

        Args:
            kafka: how to reach the cluster.
            config: consumer settings.
            partitions: read exactly these partitions without a group (manual assignment);
                None = join ``config.group_id`` (or read every partition if it is empty).
            clock: time source for backoff (tests pass a fake one).
            stop: a stop flag (a signal's): :meth:`start` gives up waiting for an unreachable
                broker once it is true (:class:`~hetgmp.streaming.kafka.ConnectStopped`).
        """
        self.kafka = kafka
        self.config = config or ConsumerConfig()
        self.schema = parse_schema(self.config.schema)
        self.decoder = Decoder(self.schema, DecodeConfig(self.config.format, self.config.max_record_bytes,
                                                          self.config.value_separator))
        self.stats = ConsumerStats()
        c = self.config
        self._first = FirstRecordsCheck(c.topic, c.format, c.schema, c.stop_on_rejects)
        self._manual = list(partitions) if partitions is not None else None
        self._clock = clock or SystemClock()
        self._stop = stop
        self._client: ConsumerClient | None = None
        self._dlq: DeadLetterSender | None = None
        self._positions: dict[int, int] = {}
        self._newest_ms: dict[int, int] = {}  # append time of the last message returned
        self._pending = Fetched.empty()  # fetched while a commit waited on a rebalance
        self._guard: LogGuard | None = None  # set by start(): fakes in unit tests go without

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def client(self) -> str:
        """The client library this consumer reads with (``kafka-python`` or ``confluent``)."""
        return self._client.name if self._client is not None else resolve(self.config.client)

    def start(self) -> ClickConsumer:
        """Connect (retrying while no broker answers) and subscribe or assign."""
        if self._client is not None:
            return self
        c = self.config
        # A group id also lets a manual (partitions=...) consumer commit and resume.
        group = c.group_id or None
        # Before any consumer exists: its metadata requests would create the topic on Tansu.
        existing = topic_partitions(self.kafka, c.topic, c.topic_wait_s, self._clock,
                                    c.connect_timeout_s, self._stop)
        if self._manual is not None and not set(self._manual) <= existing:
            raise ConsumerFailed(
                f"partitions {sorted(set(self._manual) - existing)} of topic {c.topic!r} do not "
                f"exist on {self.kafka.bootstrap_servers} (it has {len(existing)} partitions)")
        self._client = connect_consumer(c.client, self.kafka, c.topic, group, c, self._clock,
                                        stop=self._stop)
        try:
            self._attach(group, existing)
        except BaseException:
            # A half-started consumer is no use to anyone; a with-block would not stop() it.
            self._client.close()
            self._client, self._guard = None, None
            raise
        return self

    def _attach(self, group: str | None, existing: set[int]) -> None:
        """Remember the topic id, then assign (starting positions resolved) or subscribe."""
        assert self._client is not None
        c = self.config
        self._guard = LogGuard(c.topic, self.kafka.bootstrap_servers)
        self._guard.check(*self._client.observe(()))
        if self._manual is not None or group is None:
            parts = sorted(existing) if self._manual is None else list(self._manual)
            self._client.assign(parts)
            committed = self._client.committed(parts) if group is not None else {}
            self._start_at(set(parts), committed)
            log.info("reading %s partitions %s with %s (no group rebalancing)", c.topic, parts,
                     self._client.name)
        else:
            self._client.subscribe(_Listener(self))
            log.info("joined group %s on topic %s with %s", group, c.topic, self._client.name)

    def _start_at(self, partitions: set[int], committed: Mapping[int, int]) -> None:
        """Start ``partitions`` at their committed offset, the others at ``auto_offset_reset``."""
        assert self._client is not None
        _, highwaters = self._client.observe(partitions)
        for p in sorted(partitions & set(committed)):
            self._client.seek(p, committed[p])
            if self._guard is not None:
                self._guard.expect(p, committed[p], highwaters.get(p))
        fresh = sorted(partitions - set(committed))
        if fresh:
            self.seek_to(fresh, self.config.auto_offset_reset)
        if committed:
            log.info("partitions %s continue from their committed offsets %s",
                     sorted(partitions & set(committed)), dict(committed))
        if fresh:
            log.info("partitions %s have no committed offset; starting at the %s", fresh,
                     self.config.auto_offset_reset)

    def stop(self) -> None:
        """Flush dead letters and close (nothing is committed here: the caller decides).

        The consumer is closed even when the dead letters cannot be flushed (that error is
        raised after)."""
        try:
            if self._dlq is not None:
                try:
                    self._dlq.flush(10.0)
                finally:
                    self._dlq.close()
                    self._dlq = None
        finally:
            if self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> ClickConsumer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- reading -------------------------------------------------------------------------------

    def _poll_raw(self, timeout: float, max_records: int) -> Fetched:
        assert self._client is not None
        try:
            fetched = self._client.poll(timeout, max_records)
        except NoPosition as exc:
            # Only when the rebalance callback could not look the committed offsets up (and
            # the client found none either): these start where auto_offset_reset says.
            log.warning("partitions %s have no position; starting them at the %s",
                        sorted(exc.partitions), self.config.auto_offset_reset)
            self._start_at(exc.partitions, {})
            return Fetched.empty()
        except TransientError as exc:
            # Broker restarts and leader moves surface here; the client recovers on the next
            # poll, so this is logged, counted and retried rather than raised.
            self.stats.poll_errors += 1
            log.warning("poll failed (%s); retrying", exc)
            self._clock.sleep(min(timeout, 1.0))
            return Fetched.empty()
        if self._guard is not None:
            # Before anything of this poll is decoded or counted: records of a replaced log
            # must not leave this method, nor move the snapshot.
            self._guard.check(*self._client.observe(self._guard.partitions))
        return fetched

    def next_batch(self, max_records: int = 8192, timeout: float = 1.0) -> ClickBatch:
        """Records available within ``timeout`` seconds, decoded (possibly an empty batch).

        ``max_records`` bounds the Kafka messages taken; a message packing many records yields
        all of them. Records of one partition come in offset order.
        """
        if self._client is None:
            raise RuntimeError("consumer not started (use start() or a with-block)")
        if len(self._pending):
            fetched, self._pending = self._pending.split(max_records)
        else:
            fetched = self._poll_raw(timeout, max_records)
        if not len(fetched):
            return ClickBatch.empty(self.schema)
        payloads = fetched.values
        partitions, offsets = fetched.partitions, fetched.offsets
        sizes = np.array([len(p) if p else 0 for p in payloads], np.int64)
        batch = self._decode(fetched, sizes)
        self.stats.messages += len(fetched)
        self.stats.bytes += int(sizes.sum())
        self.stats.records += len(batch)
        # Positions advance past every message returned, decoded or dead-lettered alike.
        order = np.lexsort((offsets, partitions))
        last = np.flatnonzero(np.diff(partitions[order], append=-1) != 0)
        stamps = fetched.timestamps_ms
        for i in order[last]:
            p, nxt = int(partitions[i]), int(offsets[i]) + 1
            self._positions[p] = nxt
            self._newest_ms[p] = int(stamps[i])
            if self._guard is not None:
                self._guard.advance(p, nxt)
        return batch

    def _decode(self, fetched: Fetched, sizes: np.ndarray) -> ClickBatch:
        """Decode in slices of about ``_DECODE_BYTES`` of payload: a poll can return 8,192
        messages of 16 records (130k records), whose temporaries decode at half the speed of
        slices that stay in cache."""
        slice_of = np.cumsum(sizes) // _DECODE_BYTES  # a message ends in this slice
        cuts = np.flatnonzero(np.diff(slice_of)) + 2  # a slice ends after its crossing message
        bounds = [0, *[int(c) for c in cuts if c < len(sizes)], len(sizes)]
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            part = fetched[lo:hi]
            decoded = self.decoder.decode(part.values, part.partitions, part.offsets,
                                          part.timestamps_ms)
            # A topic of another format or schema stops here, before its rejects go anywhere.
            self._first.check(part.values, len(decoded.batch), decoded.rejects)
            if decoded.rejects:
                self._dead_letter(decoded.rejects)
            self.stats.truncated.update(decoded.truncated)
            parts.append(decoded.batch)
        return parts[0] if len(parts) == 1 else ClickBatch.concat(parts)

    def _dead_letter(self, rejects: list[Reject]) -> None:
        for r in rejects:
            self.stats.rejected[r.reason.value] += 1
        topic = self.config.dead_letter
        if topic is None:
            return
        if self._dlq is None:
            self._dlq = dead_letter_sender(self.client, self.kafka)
        limit = self.config.dead_letter_max_bytes
        for r in rejects:
            headers = [
                ("hetgmp.reason", r.reason.value.encode()),
                ("hetgmp.detail", r.detail.encode()),
                ("hetgmp.source", f"{self.config.topic}/{r.partition}/{r.offset}".encode()),
                ("hetgmp.original_bytes", str(len(r.payload)).encode()),
                ("hetgmp.truncated", b"1" if len(r.payload) > limit else b"0"),
            ]
            self._dlq.send(topic, r.payload[:limit], headers)
            self.stats.dead_lettered += 1

    # -- offsets -------------------------------------------------------------------------------

    def _forget(self, partitions: set[int]) -> None:
        for p in partitions:
            self._positions.pop(p, None)
            self._newest_ms.pop(p, None)
        if self._guard is not None:
            self._guard.forget(partitions)
        self._pending = self._pending.without(partitions)
        if partitions:
            log.info("partitions %s revoked", sorted(partitions))

    @property
    def assignment(self) -> set[int]:
        """Partitions this consumer reads now."""
        if self._client is None:
            return set()
        return self._client.assignment()

    def lag(self, positions: Mapping[int, int] | None = None,
            now_ms: int | None = None) -> dict[int, tuple[int, float]]:
        """Per partition with a known high watermark: ``(offsets, seconds)`` behind the log.

        Offsets (messages; records where a message holds one) are the high watermark of the
        last fetch response (what the broker had committed to its log, right on Tansu too,
        whose end offsets are not) minus the position in ``positions`` (e.g. what was
        trained) or :meth:`snapshot`; seconds are how long ago the newest record returned was
        appended, where any are behind, else 0 (the next record waiting followed it). Nothing
        is sent to the broker.
        """
        if self._client is None:
            return {}
        at = self.snapshot() if positions is None else dict(positions)
        _, highwaters = self._client.observe(self._client.assignment())
        now_ms = int(self._clock.time() * 1000) if now_ms is None else now_ms
        out = {}
        for p, high in highwaters.items():
            if high is None or p not in at:
                continue
            behind = max(high - at[p], 0)
            newest = self._newest_ms.get(p, -1)
            out[p] = (behind, max(now_ms - newest, 0) / 1000 if behind and newest >= 0 else 0.0)
        return out

    def highwaters(self) -> dict[int, int]:
        """High watermark per assigned partition, as the last fetch response gave it (those
        not fetched yet are left out); nothing is sent to the broker."""
        if self._client is None:
            return {}
        _, highs = self._client.observe(self._client.assignment())
        return {p: h for p, h in highs.items() if h is not None}

    @property
    def topic_id(self) -> str | None:
        """The id of the topic this consumer started on (a UUID as text; None if the cluster
        has no topic ids or the consumer has not started), e.g. for a checkpoint to record."""
        return self._guard.topic_id if self._guard is not None else None

    def snapshot(self) -> dict[int, int]:
        """Next offset per partition of what :meth:`next_batch` has returned so far."""
        return dict(self._positions)

    @property
    def can_hold(self) -> bool:
        """Whether :meth:`hold` works with this consumer's client library (librdkafka)."""
        return self._client is not None and self._client.can_hold

    def hold(self, partitions: set[int]) -> None:
        """Fetch nothing more of exactly these partitions until a later call leaves them out
        (a reader that must wait for another partition bounds what it buffers so; messages
        already fetched are still returned). Only where :attr:`can_hold`."""
        assert self._client is not None, "consumer not started"
        self._client.hold(set(partitions))

    def seek(self, offsets: Mapping[int, int]) -> None:
        """Continue partitions from the given offsets (e.g. those of a checkpoint)."""
        assert self._client is not None, "consumer not started"
        _, highwaters = self._client.observe(offsets)
        for p, off in offsets.items():
            self._client.seek(p, off)
            self._positions[p] = off
            if self._guard is not None:
                self._guard.expect(p, off, highwaters.get(p))
        self._pending = self._pending.without(offsets)

    def seek_to(self, partitions: Iterable[int] | None, where: Literal["earliest", "latest"]) -> None:
        """Start partitions at the beginning or the end of the log the broker has now.

        The way to go on from a lost log (``--reset-offsets earliest|latest``). Their positions
        leave the snapshot until records of them are returned.

        Args:
            partitions: partitions assigned to this consumer; None = all of them.
            where: ``"earliest"`` (the oldest record kept) or ``"latest"`` (only new records;
                Tansu reports as the end one past the first offset of its last batch, so the
                rest of that producer batch is read again there).
        """
        if where not in ("earliest", "latest"):
            raise ValueError(f"where must be 'earliest' or 'latest', got {where!r}")
        parts = sorted(self.assignment if partitions is None else set(partitions))
        if not parts:
            return
        assert self._client is not None, "consumer not started"
        self._client.seek_to(parts, where)
        for p in parts:
            self._positions.pop(p, None)
        if self._guard is not None:
            self._guard.forget(parts)
        self._pending = self._pending.without(parts)

    def flush_dead_letters(self, timeout: float = 30.0) -> None:
        """Block until every dead letter sent so far is acknowledged by the broker.

        Raises:
            ConsumerFailed: A dead letter was not written (the producer only logs that): the
                records it replaces must not be committed past.
        """
        if self._dlq is None:
            return
        sent, failed, why = self._dlq.flush(timeout)
        if failed:
            raise ConsumerFailed(
                f"{failed} of {sent} dead letters were not written to "
                f"{self.config.dead_letter!r} ({why}); the offsets they cover are not committed")

    def commit(self, offsets: Mapping[int, int] | None = None) -> bool:
        """Commit ``offsets`` (default: :meth:`snapshot`) for partitions still assigned.

        Dead letters are flushed first. Returns False when the group took the partitions away
        before the commit landed (their next owner replays from the previous commit).
        """
        assert self._client is not None, "consumer not started"
        self.flush_dead_letters()
        offsets = dict(self.snapshot() if offsets is None else offsets)
        for attempt in range(self.config.commit_retries + 1):
            owned = self.assignment
            payload = {p: o for p, o in offsets.items() if p in owned}
            if not payload:
                return not offsets
            try:
                self._client.commit(payload)
                self.stats.commits += 1
                return len(payload) == len(offsets)
            except CommitRebalancing:
                # The rejoin completes inside poll(); keep what it fetches for next_batch.
                self.stats.commit_retries += 1
                log.info("commit during a rebalance (try %d); rejoining", attempt + 1)
                self._pending = self._pending + self._poll_raw(0.5, 8192)
            except CommitMoved as exc:
                log.warning("commit rejected, partitions moved to another member: %s", exc)
                return False
        log.warning("commit gave up after %d rebalance retries", self.config.commit_retries)
        return False
