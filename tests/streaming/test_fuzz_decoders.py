"""Invariant 6 as a property, for every decoder: whatever a record holds, it is decoded to
finite values (finite in float32 as stored, and so are the pooled sums of a bag's weights) or
rejected by reason, exactly once, and nothing raises.

hypothesis draws the records (the house rule: the library that exists, not a hand-made fuzzer)
under a schema with a one-value field, a list sharing its table, a weighted list that rejects
past its max_len with a named weights column, a dense field trained as it is and a ``log1p``
one. Paths: the consumer's decoder in each format (TSV, JSON lines, Arrow IPC messages); the
producer's replay of a Parquet or Arrow file (``TableSource`` -> TSV or Arrow messages -> the
decoder); serve's ``/predict`` decode and score (``Service.score``).

``make test`` runs the ``quick`` profile (a few seconds); ``make fuzz`` the ``long`` one
(``HETGMP_FUZZ_PROFILE=long``, read through ``runtime.env_value``).
"""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from hetgmp.runtime import env_value
from hetgmp.streaming.arrow import ipc_message
from hetgmp.streaming.codec import DecodeConfig, Decoded, Decoder
from hetgmp.streaming.lists import MAX_MAGNITUDE
from hetgmp.streaming.tables import ColumnError, TableSource, arrow_messages, tsv_messages
from hetgmp.streaming.types import DenseField, RejectReason, Schema, SparseField

# deadline=None: the machine is shared, and a slow example is not a wrong one. No example
# database: the failing example is printed (and reproducible with the blob it prints).
settings.register_profile("quick", max_examples=40, deadline=None, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=2500, deadline=None, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
PROFILE = settings.get_profile(env_value("HETGMP_FUZZ_PROFILE") or "quick")

SCHEMA = Schema.of("y", [DenseField("price", "none"), DenseField("views")], [
    SparseField("item", table="items"),
    SparseField("history", table="items", max_len=3),
    SparseField("tags", max_len=2, weighted=True, on_overflow="reject", weights="tags_w"),
])
MAX_LEN = np.array([f.max_len for f in SCHEMA.sparse_fields])
ONE_VALUE = np.array([not f.multi_valued for f in SCHEMA.sparse_fields])
# A whole message refused: the reasons that do not name one record.
MESSAGE_LEVEL = {RejectReason.EMPTY_MESSAGE, RejectReason.BAD_ARROW, RejectReason.ARROW_SCHEMA,
                 RejectReason.TOO_LARGE}


def check(decoded: Decoded, records: list[int | None], fmt: str) -> None:
    """The property. ``records[i]``: records in message ``i`` (its offset), None where the
    message may be refused whole or split otherwise than the test can tell."""
    b, n = decoded.batch, len(decoded.batch)
    assert b.labels.dtype == np.float32 and set(np.unique(b.labels)) <= {0.0, 1.0}
    assert b.dense.dtype == np.float32 and b.dense.shape == (n, len(SCHEMA.dense))
    assert np.isfinite(b.dense).all()
    assert b.lengths.shape == (n, len(SCHEMA.sparse)) and (b.lengths >= 0).all()
    assert (b.lengths <= MAX_LEN).all() and (b.lengths[:, ONE_VALUE] == 1).all()
    assert b.values.dtype == np.int64 and b.values.size == int(b.lengths.sum())
    assert (b.values >= 0).all()
    w = b.value_weights()
    assert w.dtype == np.float32 and w.size == b.values.size and np.isfinite(w).all()
    assert (np.abs(w) <= np.float32(MAX_MAGNITUDE)).all()
    bag = np.repeat(np.arange(b.lengths.size), b.lengths.reshape(-1))
    pooled = np.bincount(bag, np.abs(w).astype(np.float64), b.lengths.size).astype(np.float32)
    assert np.isfinite(pooled).all()  # a bag's weights, summed, as float32 holds them
    for r in decoded.rejects:
        assert isinstance(r.reason, RejectReason) and isinstance(r.payload, bytes)
        r.detail.encode("utf-8")  # the dead letter's header carries it
    # What the draws reach (--hypothesis-show-statistics): records kept, and each reason.
    event(f"{fmt}: {'some' if n else 'no'} records decoded")
    for reason in {r.reason.value for r in decoded.rejects}:
        event(f"{fmt}: {reason}")
    # Exactly once: each message's records are decoded or rejected, or the message is.
    for i, expected in enumerate(records):
        mine = [r for r in decoded.rejects if r.offset == i]
        whole = [r for r in mine if r.reason in MESSAGE_LEVEL]
        got = int((b.offsets == i).sum())
        if whole:
            assert len(mine) == 1 and got == 0, (fmt, i, mine)
        elif expected is not None:
            assert got + len(mine) == expected, (fmt, i, got, mine)


def decode(fmt: str, payloads: list[bytes | None], records: list[int | None],
           schema: Schema = SCHEMA) -> Decoded:
    d = Decoder(schema, DecodeConfig(format=fmt, max_record_bytes=4096))  # type: ignore[arg-type]
    decoded = d.decode(payloads, offsets=np.arange(len(payloads)))
    check(decoded, records, fmt)
    return decoded


def text_records(payload: bytes | None) -> int:
    """Records of a TSV or JSON message: its non-empty lines (none: the message is rejected)."""
    if not payload or payload.isspace():
        return 1
    return sum(1 for line in payload.split(b"\n") if line.removesuffix(b"\r"))


# -- values ------------------------------------------------------------------------------------
# Each value is a plausible one most of the time (so that records get decoded, and the checks
# on decoded values have something to check), else anything, edges first.

EDGES = [0, 1, -1, 2**24 + 1, 2**53 + 1, 2**63, 2**64, 10**18, -(10**18), 10**18 + 1,
         10**400, 1e18, -1e18, 1.0000000000000002e18, 3e38, -3e38, 3.5e38, 1e39, 1e308,
         float("inf"), float("-inf"), float("nan"), 5e-324, -0.0]
numbers = st.one_of(st.sampled_from(EDGES), st.integers(-(10**20), 10**20), st.floats())
texts = st.text(max_size=6)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
LABELS = st.sampled_from([0, 1])
small = st.one_of(st.integers(-1000, 10**6), st.floats(-1e6, 1e6))
words = st.text("abcxyz019_-", max_size=4)  # values no format treats as syntax


def mostly(good: st.SearchStrategy, other: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` about four draws in five, else ``other``."""
    return st.one_of(good, good, good, good, other)


def number_text(v: object) -> str:
    return repr(v) if isinstance(v, float) else str(v)


# -- TSV and JSON records ----------------------------------------------------------------------

@st.composite
def json_line(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 9:  # not a record at all
        return draw(st.one_of(st.text(max_size=40).map(str.encode),
                              st.recursive(scalars, lambda c: st.lists(c, max_size=3),
                                           max_leaves=4).map(lambda v: json.dumps(v).encode())))
    rec: dict[str, Any] = {"y": draw(mostly(LABELS, scalars))}
    for name in SCHEMA.dense:
        if draw(st.integers(0, 5)) < 5:  # else missing: 0
            rec[name] = draw(mostly(small, st.one_of(numbers, numbers.map(number_text), scalars)))
    rec["item"] = draw(mostly(words, st.one_of(st.integers(), scalars, st.lists(scalars, max_size=2))))
    rec["history"] = draw(mostly(st.lists(words, max_size=4),
                                 st.one_of(st.lists(scalars, max_size=5), scalars)))
    tags = draw(mostly(st.lists(words, max_size=2), st.lists(st.one_of(texts, st.integers()),
                                                             max_size=4)))
    rec["tags"] = tags
    kind = draw(st.integers(0, 5))
    if kind <= 3:  # one a value, mostly
        rec["tags_w"] = draw(st.lists(mostly(small, numbers) if kind < 3 else scalars,
                                      min_size=len(tags), max_size=len(tags)))
    elif kind == 4:
        rec["tags_w"] = draw(st.one_of(scalars, st.lists(numbers, max_size=4)))
    return json.dumps(rec).encode()


@st.composite
def tsv_line(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 9:  # not a record at all
        return draw(st.one_of(st.binary(max_size=30), st.text(max_size=30).map(str.encode)))
    label = draw(mostly(LABELS, texts).map(str))
    dense = [draw(mostly(small.map(number_text), st.one_of(numbers.map(number_text), texts)))
             for _ in SCHEMA.dense]
    item = draw(mostly(words, texts))
    history = ",".join(draw(mostly(st.lists(words, max_size=4), st.lists(texts, max_size=5))))
    tags = []
    for tag in draw(mostly(st.lists(words, max_size=2), st.lists(texts, max_size=4))):
        weight = draw(mostly(small.map(number_text),
                             st.one_of(numbers.map(number_text), texts, st.none())))
        tags.append(tag if weight is None else f"{tag}:{weight}")
    fields = [label, *dense, item, history, ",".join(tags)]
    if draw(st.integers(0, 9)) == 9:
        fields = fields[:draw(st.integers(0, len(fields)))]
    return "\t".join(fields).encode()


def messages(lines: st.SearchStrategy[bytes]) -> st.SearchStrategy[list[bytes | None]]:
    """Messages of one to three lines, joined by \\n or \\r\\n, with empty ones among them."""
    joined = st.tuples(st.lists(lines, min_size=1, max_size=3), st.sampled_from(
        [b"\n", b"\r\n"]), st.booleans()).map(lambda t: t[1].join(t[0]) + (t[1] if t[2] else b""))
    return st.lists(st.one_of(joined, joined, st.sampled_from([None, b"", b" \n"])),
                    min_size=1, max_size=4)


# The poison pills of issue 53, run every time beside what is drawn: values past float32
# (finite in float64), a bag whose pooled weights overflow, a weight too long for a float.
TSV_PILLS = [b"1\t1e39\t3\ta\tb\tx:1", b"1\t1\t3\ta\tb\tx:3e38,y:3e38", b"1\t1\t3\ta\tb\tx"]
JSON_PILLS = [json.dumps({"y": 1, "price": 1e39, "item": "a", "tags": []}).encode(),
              json.dumps({"y": 1, "item": "a", "tags": ["x"], "tags_w": [10**400]}).encode(),
              json.dumps({"y": 1, "item": "a", "tags": ["x", "y"], "tags_w": [1]}).encode()]


@PROFILE
@given(messages(tsv_line()))
@example(TSV_PILLS)
def test_the_tsv_decoder_decodes_or_rejects_every_record(payloads: list[bytes | None]) -> None:
    decode("tsv", payloads, [text_records(p) for p in payloads])


@PROFILE
@given(messages(json_line()))
@example(JSON_PILLS)
def test_the_json_decoder_decodes_or_rejects_every_record(payloads: list[bytes | None]) -> None:
    decode("json", payloads, [text_records(p) for p in payloads])


# -- Arrow columns -----------------------------------------------------------------------------

LABEL_TYPES = [pa.int8(), pa.int64(), pa.uint8(), pa.bool_(), pa.float64(), pa.float16()]
DENSE_TYPES = [pa.int32(), pa.int64(), pa.uint64(), pa.float32(), pa.float64(), pa.float16()]
ITEM_TYPES = [pa.string(), pa.binary(), pa.large_string(), pa.int64(), pa.uint64(), pa.int8()]
HISTORY_TYPES = [pa.list_(pa.string()), pa.list_(pa.int64()), pa.large_list(pa.string()),
                 pa.string(), pa.list_(pa.uint64())]
TAG_TYPES = [pa.list_(pa.string()), pa.list_(pa.int64()), pa.string()]
WEIGHT_TYPES = [pa.list_(pa.float64()), pa.list_(pa.float32()), pa.list_(pa.int64()),
                pa.list_(pa.uint64()), pa.large_list(pa.float64())]


def values_of(t: pa.DataType) -> st.SearchStrategy:
    """Python values an Arrow array of type ``t`` holds (None among them)."""
    if pat.is_list(t) or pat.is_large_list(t):
        return mostly(st.lists(values_of(t.value_type), max_size=2),
                      st.one_of(st.lists(values_of(t.value_type), max_size=4), st.none()))
    if pat.is_boolean(t):
        base: st.SearchStrategy = st.booleans()
    elif pat.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        base = mostly(st.integers(0, 100), st.integers(int(info.min), int(info.max)))
    elif pat.is_floating(t):
        base = mostly(st.floats(-100, 100, width=t.bit_width), st.one_of(st.sampled_from(
            [1e18, -1e18, 1e30, 3e38, 1e39]), st.floats(width=t.bit_width)))
    elif pat.is_binary(t):
        base = mostly(words.map(str.encode), st.binary(max_size=6))
    else:
        base = mostly(words, texts)
    return mostly(base, st.none())


def array(values: list, t: pa.DataType) -> pa.Array:
    if pat.is_float16(t):  # pyarrow takes half floats from numpy only
        mask = np.array([v is None for v in values], bool)
        with np.errstate(over="ignore"):
            data = np.array([0.0 if v is None else v for v in values], np.float16)
        return pa.array(data, mask=mask)
    return pa.array(values, t)


@st.composite
def arrow_batch(draw: st.DrawFn) -> pa.RecordBatch:
    """A batch of up to five records, each column of a type drawn for it; now and then a
    column is missing, repeated, or of a type no field takes."""
    n = draw(st.integers(0, 5))
    types = {"y": draw(st.sampled_from(LABEL_TYPES)),
             "price": draw(st.sampled_from(DENSE_TYPES)), "views": draw(st.sampled_from(DENSE_TYPES)),
             "item": draw(st.sampled_from(ITEM_TYPES)),
             "history": draw(st.sampled_from(HISTORY_TYPES)),
             "tags": draw(st.sampled_from(TAG_TYPES)), "tags_w": draw(st.sampled_from(WEIGHT_TYPES))}
    cols = {name: [draw(values_of(t)) for _ in range(n)] for name, t in types.items()
            if name != "tags_w"}
    label = types["y"]
    zero_one = LABELS.map(bool if pat.is_boolean(label) else float if pat.is_floating(label)
                          else int)
    cols["y"] = [draw(mostly(zero_one, values_of(label))) for _ in range(n)]
    weights = []
    for tags in cols["tags"]:
        count = len(tags) if isinstance(tags, list) else 1
        same = st.lists(values_of(types["tags_w"].value_type), min_size=count, max_size=count)
        weights.append(draw(mostly(same, values_of(types["tags_w"]))))
    cols["tags_w"] = weights
    names = list(cols)
    arrays = [array(cols[k], types[k]) for k in names]
    odd = draw(st.integers(0, 11))
    if odd == 9:  # a column missing
        drop = draw(st.integers(0, len(names) - 1))
        del names[drop], arrays[drop]
    elif odd == 10:  # a column twice
        names.append(names[1])
        arrays.append(arrays[1])
    elif odd == 11:  # a type no field takes
        names[2], arrays[2] = "views", pa.array([[1.0]] * n, pa.list_(pa.float64()))
    return pa.RecordBatch.from_arrays(arrays, names=names)


@st.composite
def arrow_payloads(draw: st.DrawFn) -> tuple[list[bytes | None], list[int | None]]:
    payloads: list[bytes | None] = []
    records: list[int | None] = []
    for _ in range(draw(st.integers(1, 3))):
        batch = draw(arrow_batch())
        message = ipc_message(batch)
        kind = draw(st.integers(0, 7))
        if kind == 7:  # cut short, or bytes of another kind
            message = draw(st.one_of(st.just(message[:draw(st.integers(0, len(message)))]),
                                     st.binary(max_size=40)))
            payloads.append(message)
            records.append(None)
            continue
        payloads.append(message)
        records.append(batch.num_rows)
    return payloads, records


@PROFILE
@given(arrow_payloads())
def test_the_arrow_decoder_decodes_or_rejects_every_record(
        drawn: tuple[list[bytes | None], list[int | None]]) -> None:
    payloads, records = drawn
    decode("arrow", payloads, records)


# -- the producer's replay of files ------------------------------------------------------------

@PROFILE
@given(st.lists(arrow_batch(), min_size=1, max_size=2), st.sampled_from(["parquet", "arrow"]),
       st.integers(1, 3))
def test_a_replayed_file_is_sent_whole_and_decoded_or_rejected(
        batches: list[pa.RecordBatch], kind: str, per_message: int) -> None:
    """The file is refused up front (ColumnError, naming the column) or every record is sent
    and decoded or dead-lettered: neither the replay nor the consumer raises."""
    first = batches[0].schema
    batches = [b for b in batches if b.schema.equals(first)]
    if len(set(first.names)) < len(first.names):
        return  # a file cannot hold a column twice (Parquet refuses to write it)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"log.{kind}"
        table = pa.Table.from_batches(batches, first)
        if kind == "parquet":
            pq.write_table(table, path)
        else:
            with pa.ipc.new_file(path, first) as writer:
                writer.write_table(table)
        try:
            source = TableSource([str(path)], SCHEMA)
        except ColumnError as exc:
            assert "column" in str(exc)
            return
        sent = list(source.batches(chunk=4))
    assert sum(b.num_rows for b in sent) == table.num_rows
    for batch in sent:
        arrow = arrow_messages(batch, per_message)
        rows = [min(per_message, batch.num_rows - lo) for lo in range(0, batch.num_rows, per_message)]
        decode("arrow", arrow, rows)  # type: ignore[arg-type]
        # TSV: a value holding a newline or a tab splits its line, so only the whole holds.
        decode("tsv", tsv_messages(batch, per_message), [None] * len(arrow))  # type: ignore[arg-type]


# -- serve's /predict --------------------------------------------------------------------------

@cache
def service() -> Any:
    """serve's request handling with a small model of the schema's widths (3 sparse, 2 dense)."""
    from small_serving import small_model

    from hetgmp.trainer.serving import Service

    return Service(small_model(), None, SCHEMA, "tsv")


@PROFILE
@given(st.one_of(st.tuples(st.just("tsv"), st.lists(tsv_line(), min_size=1, max_size=3)),
                 st.tuples(st.just("json"), st.lists(json_line(), min_size=1, max_size=3))))
@example(("tsv", TSV_PILLS[:2]))
@example(("json", JSON_PILLS[1:2]))
def test_serve_scores_every_record_finitely_or_refuses_the_request_by_reason(
        request: tuple[str, list[bytes]]) -> None:
    fmt, lines = request
    body = b"\n".join(lines)
    status, reply = service().score(body, fmt)
    event(f"{fmt}: {status}")
    json.dumps(reply, allow_nan=False)  # what the handler sends; a NaN made it a 500
    records = body.split(b"\n")
    while records and not records[-1].strip():  # trailing blank lines are no records
        records.pop()
    if status == 200:
        assert len(reply["scores"]) == len(records) and np.isfinite(reply["scores"]).all()
        return
    assert status == 400, reply
    reasons = {r.value for r in RejectReason} | {"out_of_range"}
    assert "error" in reply and all(r["reason"] in reasons for r in reply.get("rejected", []))


@pytest.mark.parametrize("fmt", ["tsv", "json"])
def test_serve_counts_the_lines_it_scores(fmt: str) -> None:
    """The serve property above relies on one score a line: a request that is all good."""
    line = (b"1\t2.5\t3\ta\tb,c\tx:0.5" if fmt == "tsv" else
            json.dumps({"y": 1, "price": 2.5, "item": "a", "tags": ["x"], "tags_w": [0.5]}).encode())
    status, reply = service().score(b"\n".join([line] * 3), fmt)
    assert status == 200 and len(reply["scores"]) == 3
