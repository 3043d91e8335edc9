"""Log producers: the synthetic click stream or replayed Criteo files, into a Kafka topic.

Records are packed ``records_per_message`` to a Kafka message (newline separated): the consumer
decodes one-record and many-record messages alike, and packing is what lets a Python producer
reach 100k records/s (kafka-python's per-message cost dominates otherwise). Messages go to the
topic's partitions round robin, going on where the topic ends, with times that never go back and
start after its newest message (:mod:`hetgmp.streaming.append_order`): the order the trainer rebuilds
(append time, offset, partition) is the order of sending, across produce calls too.

Every message's result is checked (a callback per message, counting the records it carries): the
report says how many records the broker acknowledged, and :func:`produce` raises
:class:`ProduceFailed` when any was not. With ``rate`` set, messages go out evenly (a token
bucket holding at most ~0.1 s of records), not a chunk at a time.
"""

from __future__ import annotations

import functools
import gzip
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, TypeVar

import numpy as np

from hetgmp.runtime import Clock, SystemClock
from hetgmp.streaming.append_order import AppendOrder, PartitionEnd, topic_ends
from hetgmp.streaming.clients import SendFailed, record_sender, resolve
from hetgmp.streaming.kafka import KafkaSettings, check_partitions, ensure_topic
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream, auc

__all__ = [
    "ProduceConfig",
    "ProduceFailed",
    "ProduceReport",
    "file_chunks",
    "produce",
    "synthetic_chunks",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Ground truth kept for the ceiling AUC: the most recent this many records.
_CEILING_KEEP = 2_000_000
# Records of the synthetic stream a run produces when --count is not given.
_SYNTHETIC_COUNT = 1_000_000
# Longest burst a paced run sends at once, in seconds of its rate.
_BURST_S = 0.1


@dataclass(frozen=True)
class ProduceConfig:
    """Settings of ``hetgmp produce``."""

    topic: str = field(default="clicks", metadata={"help": "topic to write"})
    source: str = field(
        default="synthetic",
        metadata={"help": "'synthetic' or 'file:PATH[,PATH...]': Criteo TSV text (plain or .gz), "
                          "or Parquet (.parquet) or Arrow (.arrow, .feather) files, or directories "
                          "of them"},
    )
    schema: str = field(
        default="criteo",
        metadata={"help": "fields of a Parquet or Arrow file's records, as the consumer's "
                          "--consumer-schema: 'criteo', 'DENSE,SPARSE' counts, "
                          "'label=y;dense=a,b;sparse=c', or a schema file PATH.toml"},
    )
    column_map: str = field(
        default="",
        metadata={"help": "Parquet or Arrow files: the column each schema field is read from, "
                          "as FIELD=COLUMN,...; a field not named reads the column of its name"},
    )
    count: int | None = field(
        default=None,
        metadata={"help": "records to produce: of the synthetic stream (default 1,000,000; 0 = "
                          "until stopped), or at most this many of the files (default: all)"})
    rate: float = field(default=0.0, metadata={"help": "records per second; 0 = as fast as possible"})
    start: int = field(default=0, metadata={"help": "index of the first synthetic record"})
    partitions: int = field(default=4, metadata={"help": "partitions when the topic is created"})
    client: Literal["auto", "kafka-python", "confluent"] = field(
        default="auto",
        metadata={"help": "Kafka client library: kafka-python, confluent (librdkafka), or auto "
                          "(confluent where installed)"},
    )
    format: Literal["tsv", "arrow"] = field(
        default="tsv",
        metadata={"help": "message format: tsv (Criteo lines, newline separated) or arrow (an "
                          "Arrow IPC record batch a message: the synthetic source's pre-hashed "
                          "ids, or a Parquet or Arrow file's columns)"},
    )
    value_separator: str = field(
        default=",", metadata={"help": "tsv: the character between a list field's values "
                               "(replayed from Parquet or Arrow list columns)"})
    records_per_message: int = field(
        default=0,
        metadata={"help": "records packed into one Kafka message; 0 = the format's default "
                          "(16 for tsv, 1024 for arrow)"},
    )
    compression: str = field(
        default="none", metadata={"help": "none, gzip, snappy, lz4 or zstd (needs the codec library)"}
    )
    chunk_records: int = field(default=16384, metadata={"help": "records generated per step"})
    progress_every_s: float = field(default=2.0, metadata={"help": "seconds between progress lines"})
    acks: Literal["all", "1", "0"] = field(
        default="all",
        metadata={"help": "broker acknowledgement a record needs: 'all' in-sync replicas, '1' the "
                          "leader only (lost if it fails before replicating), '0' none (unchecked)"},
    )
    idempotence: bool = field(
        default=True,
        metadata={"help": "idempotent producer: retries never duplicate or reorder records "
                          "(needs acks 'all')"},
    )

    def __post_init__(self) -> None:
        if (self.count or 0) < 0 or self.start < 0 or self.rate < 0:
            raise ValueError(f"count, start and rate must be >= 0 (count 0: until stopped), got "
                             f"count {self.count}, start {self.start}, rate {self.rate}")
        if min(self.partitions, self.chunk_records) < 1 or self.records_per_message < 0:
            raise ValueError(f"partitions and chunk_records must be >= 1 and records_per_message "
                             f">= 0 (the format's default), got {self.partitions}, "
                             f"{self.chunk_records}, {self.records_per_message}")
        check_partitions(self.partitions)
        if self.acks == "1" and resolve(self.client) == "kafka-python":
            raise ValueError(
                "acks '1' with the kafka-python client: across a broker restart it reports "
                "records as written that the broker no longer holds (36,736 in one probe), so "
                "the producer's count cannot be trusted; use acks 'all', or --client confluent "
                "(librdkafka counts exactly with acks 1)")
        if self.format not in ("tsv", "arrow"):
            raise ValueError(f"format must be 'tsv' or 'arrow', got {self.format!r}")
        if not self.progress_every_s > 0:
            raise ValueError(f"progress_every_s must be positive, got {self.progress_every_s}")
        if self.acks not in ("all", "1", "0"):
            raise ValueError(f"acks must be 'all', '1' or '0', got {self.acks!r}")
        if self.idempotence and self.acks != "all":
            raise ValueError(f"idempotence needs acks 'all', got acks {self.acks!r} (or turn "
                             "idempotence off)")

    @property
    def records(self) -> int:
        """Records to produce, 0 = no limit: ``count``, else the whole of the files, or
        1,000,000 of the synthetic stream."""
        if self.count is not None:
            return self.count
        return _SYNTHETIC_COUNT if self.source == "synthetic" else 0

    @property
    def per_message(self) -> int:
        """Records a message holds (the format's default when ``records_per_message`` is 0)."""
        return self.records_per_message or (1024 if self.format == "arrow" else 16)


@dataclass
class ProduceReport:
    """What a produce run did.

    ``records`` counts what was handed to the producer; ``acked`` what the broker acknowledged,
    ``failed`` what it refused or never answered for (both filled in as the results arrive).
    """

    records: int = 0
    messages: int = 0
    bytes: int = 0
    seconds: float = 0.0
    ceiling_auc: float | None = None
    acked: int = 0
    failed: int = 0
    first_error: str | None = None

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def unacknowledged(self) -> int:
        """Records sent but not acknowledged (failed, or not answered yet)."""
        return self.records - self.acked


class ProduceFailed(RuntimeError):
    """Records of a produce run were not acknowledged by the broker.

    Attributes:
        report: the run's report (``acked``, ``failed``, ``first_error``).
    """

    def __init__(self, report: ProduceReport) -> None:
        super().__init__(
            f"{report.unacknowledged:,} of {report.records:,} records were not acknowledged by "
            f"the broker (first error: {report.first_error or 'none reported'})")
        self.report = report


class _Acks:
    """Counts the records of each message as its result arrives (on the producer's I/O thread,
    or at once on this one when the send had already finished)."""

    def __init__(self, report: ProduceReport) -> None:
        self.report = report
        self._lock = threading.Lock()

    def result(self, records: int, error: BaseException | None, _offset: int = -1) -> None:
        if error is None:
            with self._lock:
                self.report.acked += records
        else:
            self.failure(records, error)

    def failure(self, records: int, exc: BaseException) -> None:
        with self._lock:
            self.report.failed += records
            if self.report.first_error is None:
                self.report.first_error = f"{type(exc).__name__}: {exc}"
                log.error("the broker did not acknowledge records: %s", self.report.first_error)


def _wait(clock: Clock, stop: threading.Event, seconds: float) -> None:
    # The real clock waits on the stop flag, so that stopping does not wait out a pause.
    if isinstance(clock, SystemClock):
        stop.wait(seconds)
    else:
        clock.sleep(seconds)


class _Pacer:
    """A token bucket: ``rate`` records a second, holding at most ``_BURST_S`` of them (or one
    message, if that is more), so a paced run never sends a burst longer than that."""

    def __init__(self, rate: float, per_message: int, clock: Clock, stop: threading.Event) -> None:
        self.rate = rate
        self.capacity = max(rate * _BURST_S, float(per_message))
        self.tokens = float(per_message)  # the first message goes at once, no initial burst
        self.clock = clock
        self.stop = stop
        self.last = clock.monotonic()

    def _refill(self) -> None:
        now = self.clock.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def take(self, records: int) -> None:
        """Wait until ``records`` may be sent, and spend them."""
        self._refill()
        if self.tokens < records:
            _wait(self.clock, self.stop, (records - self.tokens) / self.rate)
            self._refill()
        # Spent even if a little short (a wait cut by stop, float rounding): the debt carries.
        self.tokens -= records


Chunk = tuple[list[bytes], np.ndarray | None, np.ndarray | None]  # lines, labels, probabilities
Packed = tuple[list[bytes], int, np.ndarray | None, np.ndarray | None]  # payloads, records, truth


def _spans(start: int, count: int, chunk: int) -> Iterator[tuple[int, int]]:
    """``(first, n)`` of each chunk of records ``start ..`` (``count`` 0: for ever)."""
    i, end = start, (start + count if count > 0 else None)
    while end is None or i < end:
        n = chunk if end is None else min(chunk, end - i)
        yield i, n
        i += n


def synthetic_chunks(stream: SyntheticStream, start: int, count: int, chunk: int) -> Iterator[Chunk]:
    """Lines of the synthetic stream in chunks, with labels and ground-truth probabilities."""
    for i, n in _spans(start, count, chunk):
        yield stream.lines_with_truth(i, n)


def file_chunks(paths: list[str], chunk: int, count: int = 0) -> Iterator[Chunk]:
    """Lines of Criteo-format files (plain or gzip) in chunks; ``count`` > 0 stops early."""
    sent = 0
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"replay file not found: {path}")
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rb") as fh:  # type: ignore[operator]
            lines: list[bytes] = []
            for line in fh:
                lines.append(line.rstrip(b"\r\n"))
                sent += 1
                if len(lines) == chunk or (count and sent >= count):
                    yield lines, None, None
                    lines = []
                if count and sent >= count:
                    return
            if lines:
                yield lines, None, None


def _prefetch(chunks: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Generate the next chunks on a thread while the caller sends the current one.

    numpy releases the GIL in its array loops, so generation and kafka-python's send path
    overlap on a second core.
    """
    import queue

    q: queue.Queue[T | BaseException | None] = queue.Queue(maxsize=depth)
    done = threading.Event()

    def run() -> None:
        try:
            for chunk in chunks:
                while not done.is_set():
                    try:
                        q.put(chunk, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if done.is_set():
                    return
            q.put(None)
        except BaseException as exc:
            q.put(exc)

    worker = threading.Thread(target=run, name="produce-generator", daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        done.set()


def _pack(lines: list[bytes], per_message: int) -> list[bytes]:
    if per_message <= 1:
        return lines
    return [b"\n".join(lines[i : i + per_message]) for i in range(0, len(lines), per_message)]


def _packed(chunks: Iterator[Chunk], per_message: int) -> Iterator[Packed]:
    for lines, labels, probs in chunks:
        yield _pack(lines, per_message), len(lines), labels, probs


def _replay(config: ProduceConfig) -> Iterator[Packed]:
    """The messages of ``file:PATH[,PATH...]``: TSV text files, or Parquet or Arrow tables."""
    from hetgmp.streaming.schema_file import parse_schema
    from hetgmp.streaming.tables import (
        TableSource,
        arrow_messages,
        is_table_path,
        parse_column_map,
        tsv_messages,
    )

    paths = [p for p in config.source[len("file:") :].split(",") if p]
    if not paths:
        raise ValueError("file source needs at least one path: file:PATH[,PATH...]")
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"replay file not found: {', '.join(missing)}")
    tables = [is_table_path(p) for p in paths]
    if any(tables) and not all(tables):
        raise ValueError(f"{config.source}: mixes text files with Parquet or Arrow ones; "
                         "replay them apart")
    if not all(tables):
        if config.format == "arrow":
            raise ValueError("--format arrow is written from the synthetic source or Parquet "
                             "and Arrow files; text files are sent as the TSV lines they hold")
        return _packed(_prefetch(file_chunks(paths, config.chunk_records, config.records)),
                       config.per_message)
    schema = parse_schema(config.schema)
    source = TableSource(paths, schema, parse_column_map(config.column_map, schema))
    log.info("replaying %s: %s records, columns %s", config.source, f"{source.count():,}",
             ", ".join(f"{f.name}<-{f.column}" if f.name != f.column else f.name
                       for f in source.fields[:8]) + (", ..." if len(source.fields) > 8 else ""))
    if config.format == "arrow":
        encode = arrow_messages
    else:
        encode = functools.partial(tsv_messages, separator=config.value_separator,
                                   labels=schema.tasks)
    per_message = config.per_message

    def messages() -> Iterator[Packed]:
        for batch in source.batches(config.chunk_records, config.records):
            yield encode(batch, per_message), batch.num_rows, None, None

    return _prefetch(messages())


def _arrow_packed(stream: SyntheticStream, start: int, count: int, chunk: int,
                  per_message: int) -> Iterator[Packed]:
    """The synthetic stream as Arrow messages of pre-hashed ids (no text rendered or parsed)."""
    from hetgmp.streaming.arrow import encode_arrow

    for i, n in _spans(start, count, chunk):
        block = stream.take(i, n)
        values, lengths = stream.sparse(block)
        if stream.lists:
            payloads = encode_arrow(stream.config.schema, block.labels, block.dense, values,
                                    per_message, lengths)
        else:
            payloads = encode_arrow(stream.config.schema, block.labels, block.dense,
                                    values.reshape(lengths.shape), per_message)
        yield payloads, n, block.labels, block.prob


def _generator_main(
    synthetic: SyntheticConfig, start: int, count: int, chunk: int, per_message: int, out: Any,
    format: str = "tsv",
) -> None:
    """Child process: generate and pack the synthetic stream into ``out`` (None ends it)."""
    try:
        stream = SyntheticStream(synthetic)
        items = (_arrow_packed(stream, start, count, chunk, per_message) if format == "arrow"
                 else _packed(synthetic_chunks(stream, start, count, chunk), per_message))
        for item in items:
            out.put(item)
        out.put(None)
    except BaseException:
        import traceback

        out.put(("error", traceback.format_exc()))


def _generate_in_child(synthetic: SyntheticConfig, config: ProduceConfig, depth: int = 4) -> Iterator[Packed]:
    """Synthetic chunks generated by a spawned child process while this one sends.

    kafka-python's send path and the generator are both Python-heavy; in one process they
    share the GIL, in two they use two cores (the producer then reaches ~1.4x the rate).
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=depth)
    child = ctx.Process(
        target=_generator_main,
        args=(synthetic, config.start, config.records, config.chunk_records, config.per_message,
              queue, config.format),
        name="hetgmp-generator",
        daemon=True,
    )
    child.start()
    try:
        while True:
            try:
                item = queue.get(timeout=5.0)
            except Exception:  # queue.Empty: is the child still there?
                if not child.is_alive():
                    raise RuntimeError(f"synthetic generator died (exit code {child.exitcode})") from None
                continue
            if item is None:
                return
            if isinstance(item, tuple) and len(item) == 2 and item[0] == "error":
                raise RuntimeError(f"synthetic generator failed:\n{item[1]}")
            yield item
    finally:
        child.terminate()
        child.join(timeout=5)
        if child.is_alive():
            child.kill()
            child.join()
        queue.close()


def _append_order(kafka: KafkaSettings, config: ProduceConfig, partitions: int, clock: Clock,
                  stop: threading.Event) -> AppendOrder:
    """Where this call's messages go and when: on from where the topic ends (see
    :mod:`hetgmp.streaming.append_order`)."""
    ends = topic_ends(kafka, config.topic, partitions, config.client, clock=clock,
                      stop=stop.is_set)
    order = AppendOrder(ends or {p: PartitionEnd(0) for p in range(partitions)})
    if order.continued:
        log.info("topic %s holds %s messages: this call's go on after them", config.topic,
                 f"{order.continued:,}")
    return order


def produce(
    kafka: KafkaSettings,
    config: ProduceConfig,
    synthetic: SyntheticConfig | None = None,
    *,
    stop: threading.Event | None = None,
    progress: Callable[[ProduceReport], None] | None = None,
    clock: Clock | None = None,
    report: ProduceReport | None = None,
) -> ProduceReport:
    """Produce ``config.records`` records (creating the topic if missing) and report.

    Args:
        kafka: cluster settings.
        config: what to produce.
        synthetic: generator settings for ``source='synthetic'``.
        stop: set it to end an endless (or long) run early; what was sent is flushed.
        progress: called every ``config.progress_every_s`` with the running report.
        clock: time source for pacing and reports.
        report: filled in as the run goes (e.g. read by a metrics collector); a new one if None.

    The run stops sending at the first record the broker did not acknowledge: the topic has a
    gap from there on, and an endless run would otherwise never report it.

    Raises:
        ProduceFailed: some record was not acknowledged by the broker (after the final flush);
            its ``report`` says how many were.
        ConnectStopped: ``stop`` was set while no broker answered.
    """
    clock = clock or SystemClock()
    stop = stop or threading.Event()
    packed: Iterator[Packed]
    if config.source == "synthetic":
        packed = _generate_in_child(synthetic or SyntheticConfig(), config)
    elif config.source.startswith("file:"):
        # Everything is checked before Kafka is touched: a typo should not create a topic.
        packed = _replay(config)
    else:
        raise ValueError(f"unknown source {config.source!r}: use 'synthetic' or 'file:PATH'")

    ensure_topic(kafka, config.topic, config.partitions, stop=stop.is_set)
    report = report if report is not None else ProduceReport()
    acks = _Acks(report)
    producer = record_sender(config.client, kafka, config.topic, acks=config.acks,
                             idempotence=config.idempotence, compression=config.compression,
                             on_result=acks.result, stop=stop.is_set)
    try:
        order = _append_order(kafka, config, producer.partitions(), clock, stop)
    except BaseException:
        producer.close()
        raise
    per_message = config.per_message
    pacer = _Pacer(config.rate, per_message, clock, stop) if config.rate > 0 else None
    labels_kept: list[np.ndarray] = []
    probs_kept: list[np.ndarray] = []
    kept = 0
    t0 = clock.monotonic()
    last_progress = t0
    try:
        for payloads, n_records, labels, probs in packed:
            if stop.is_set() or report.failed:
                break
            if report.messages == 0:  # rates count from the first record, not the start-up
                t0 = last_progress = clock.monotonic()
            sent = 0
            for payload in payloads:
                n = min(per_message, n_records - sent)
                if pacer is not None:
                    pacer.take(n)
                if stop.is_set() or report.failed:
                    break
                report.messages += 1
                report.records += n
                sent += n
                try:
                    producer.send(payload, order.partition(),
                                  order.stamp(int(clock.time() * 1000)), n)
                except SendFailed as exc:  # no room in the buffer or no metadata in time
                    acks.failure(n, exc)
                    break
                report.bytes += len(payload)
                now = clock.monotonic()
                report.seconds = now - t0
                if progress and now - last_progress >= config.progress_every_s:
                    last_progress = now
                    progress(report)
            if labels is not None and probs is not None and sent:
                labels_kept.append(labels[:sent])
                probs_kept.append(probs[:sent])
                kept += sent
                while kept - labels_kept[0].size >= _CEILING_KEEP:
                    kept -= labels_kept.pop(0).size
                    probs_kept.pop(0)
    finally:
        producer.close()  # flushes: every message's result is in before the counts are read
        report.seconds = clock.monotonic() - t0
    if labels_kept:
        report.ceiling_auc = auc(np.concatenate(labels_kept), np.concatenate(probs_kept))
    if report.acked < report.records:
        raise ProduceFailed(report)
    return report
