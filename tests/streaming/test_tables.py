"""Parquet and Arrow files at rest, replayed by ``hetgmp produce --source file:...``: the same ids
as the file's TSV lines, columns mapped, a missing or unreadable column refused before Kafka is
touched."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.consumer import ClickConsumer, ConsumerConfig
from hetgmp.streaming.kafka import TopicNotFound, topic_partitions
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.tables import ColumnError, TableSource, parse_column_map, tsv_messages
from hetgmp.streaming.types import ClickBatch

SCHEMA = "label=label;dense=age,visits;sparse=user,item,city"
N = 3_000


def table(n: int = N, seed: int = 0) -> pa.Table:
    """A rating-style log: integer users and items (the same numbers in both), a city name,
    counts with nulls, a boolean click under its own column name."""
    rng = np.random.default_rng(seed)
    age = rng.integers(0, 90, n)
    return pa.table({
        "clicked": pa.array(rng.random(n) < 0.3),
        "age": pa.array(age, mask=age > 80),  # nulls: empty fields
        "visits": pa.array(rng.integers(0, 10_000, n), pa.int32()),
        "user_id": pa.array(rng.integers(0, 50, n)),
        "item_id": pa.array(rng.integers(0, 50, n)),
        "city": pa.array(rng.choice(["Lyon", "Oslo", "Kyoto", ""], n)),
        "unused": pa.array(rng.random(n)),
    })


MAPPING = "label=clicked,user=user_id,item=item_id"


def tsv_lines(t: pa.Table) -> list[bytes]:
    """The file's records as TSV lines, written by hand (the reference)."""
    rows = t.to_pylist()

    def text(v: object) -> str:
        return "" if v is None else str(int(v)) if isinstance(v, bool) else str(v)

    return [("\t".join(text(r[c]) for c in ("clicked", "age", "visits", "user_id", "item_id",
                                            "city"))).encode() for r in rows]


def decode(lines: list[bytes]) -> ClickBatch:
    n = len(lines)
    d = Decoder(parse_schema(SCHEMA), DecodeConfig("tsv"))
    out = d.decode(lines, np.zeros(n, np.int32), np.arange(n), np.zeros(n, np.int64))
    assert not out.rejects
    return out.batch


def test_tsv_messages_are_the_files_lines_packed(tmp_path):
    t = table()
    pq.write_table(t, tmp_path / "log.parquet")
    schema = parse_schema(SCHEMA)
    source = TableSource([str(tmp_path / "log.parquet")], schema, parse_column_map(MAPPING, schema))
    batches = list(source.batches(chunk=1_000))
    assert [b.num_rows for b in batches] == [1_000] * 3
    payloads = [m for b in batches for m in tsv_messages(b, 16)]
    assert b"\n".join(payloads).split(b"\n") == tsv_lines(t)
    assert len(payloads) == 3 * -(-1_000 // 16)


def test_a_missing_column_is_named_with_the_way_to_map_it(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(table().drop_columns(["city"]), path)
    schema = parse_schema(SCHEMA)
    with pytest.raises(ColumnError) as err:
        TableSource([str(path)], schema, parse_column_map(MAPPING, schema))
    msg = str(err.value)
    assert "'city'" in msg and "sparse" in msg and str(path) in msg
    assert "--column-map city=COLUMN" in msg and "user_id" in msg  # the columns it has
    with pytest.raises(ColumnError) as err:
        TableSource([str(path)], schema, parse_column_map("label=click", schema))
    msg = str(err.value)  # every missing one at once
    assert "'click' for the schema's label field 'label' (--column-map)" in msg
    assert "field 'user'" in msg and "field 'item'" in msg and "field 'city'" in msg


def test_columns_the_consumer_cannot_read_are_refused(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(table().set_column(1, "age", pa.array(["1.5"] * N)), path)
    schema = parse_schema(SCHEMA)
    with pytest.raises(ColumnError, match="'age'.*string.*numbers"):
        TableSource([str(path)], schema, parse_column_map(MAPPING, schema))
    with pytest.raises(ValueError, match="'nope' is not a field"):
        parse_column_map("nope=x", schema)


def consume(kafka, topic: str, fmt: str, expected: int) -> ClickBatch:
    got, n = [], 0
    config = ConsumerConfig(topic=topic, group_id="", format=fmt, schema=SCHEMA)
    with ClickConsumer(kafka, config) as c:
        deadline = time.monotonic() + 60
        while n < expected and time.monotonic() < deadline:
            b = c.next_batch(4096, timeout=0.5)
            got.append(b)
            n += len(b)
        assert c.stats.rejected == {}
    out = ClickBatch.concat(got)
    order = np.lexsort((out.offsets, out.partitions))
    return out.take(order)


@pytest.mark.broker
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["arrow", "tsv"])
def test_a_directory_of_parquet_files_replays_as_its_tsv_lines_would(kafka, unique, tmp_path, fmt):
    parts = [table(N, seed=s) for s in (1, 2)]
    (tmp_path / "log").mkdir()
    for i, t in enumerate(parts):
        pq.write_table(t, tmp_path / "log" / f"part-{i}.parquet")
    topic = unique(f"parquet-{fmt}")
    report = produce(kafka, ProduceConfig(topic=topic, source=f"file:{tmp_path / 'log'}",
                                          format=fmt, schema=SCHEMA, column_map=MAPPING,
                                          partitions=1, chunk_records=1_000))
    assert report.acked == report.records == 2 * N  # all of it: --count has no default here
    got = consume(kafka, topic, fmt, 2 * N)
    want = decode([line for t in parts for line in tsv_lines(t)])
    assert len(got) == 2 * N
    assert np.array_equal(got.ids, want.ids)  # user 5 and item 5 stay different features
    assert np.array_equal(got.labels, want.labels)
    assert np.allclose(got.dense, want.dense)
    # Raw integer values are hashed per field, not taken as ids.
    assert not np.array_equal(got.ids[:, 0], got.ids[:, 1])


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_count_stops_a_file_early_and_a_bad_column_creates_no_topic(kafka, unique, tmp_path):
    path = tmp_path / "log.arrow"
    with pa.ipc.new_file(str(path), table().schema) as writer:
        writer.write_table(table())
    topic = unique("arrow-file")
    report = produce(kafka, ProduceConfig(topic=topic, source=f"file:{path}", format="arrow",
                                          schema=SCHEMA, column_map=MAPPING, count=1_000,
                                          partitions=1))
    assert report.acked == 1_000
    assert len(consume(kafka, topic, "arrow", 1_000)) == 1_000
    other = unique("arrow-file-bad")
    with pytest.raises(ColumnError, match="field 'label'.*field 'user'"):
        produce(kafka, ProduceConfig(topic=other, source=f"file:{path}", schema=SCHEMA))
    with pytest.raises(TopicNotFound):
        topic_partitions(kafka, other)
