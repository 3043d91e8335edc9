"""A topic of another format or schema stops the consumer with one line naming the flag; a
malformed record among good ones is still dead-lettered and the run goes on (invariant 6)."""

from __future__ import annotations

import pytest

from hetgmp.streaming.arrow import encode_arrow
from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.format_check import FirstRecordsCheck, FormatMismatch, sniff
from hetgmp.streaming.schema_file import parse_schema
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream
from hetgmp.streaming.types import Schema

STREAM = SyntheticStream(SyntheticConfig(seed=1))
TSV = b"\n".join(STREAM.lines(0, 16))


def arrow_messages(n: int = 64, per_message: int = 16) -> list[bytes]:
    block = STREAM.take(0, n)
    values, lengths = STREAM.sparse(block)
    return encode_arrow(STREAM.config.schema, block.labels, block.dense,
                        values.reshape(lengths.shape), per_message)


def json_message() -> bytes:
    return b'{"label": 1, "I1": 3, "C1": "a"}\n{"label": 0, "I1": 4, "C1": "b"}'


def test_the_first_bytes_tell_the_formats_apart():
    assert sniff(arrow_messages()[0]) == "arrow"
    assert sniff(b"ARROW1\0\0rest") == "arrow"
    assert sniff(TSV) == "tsv"
    assert sniff(b"  \n" + json_message()) == "json"
    for other in (b"", None, b"hello", b"\x00\x01\x02\x03\t", b"   "):
        assert sniff(other) is None


def feed(check: FirstRecordsCheck, decoder: Decoder, messages: list[bytes]) -> None:
    decoded = decoder.decode(messages)
    check.check(messages, len(decoded.batch), decoded.rejects)


def test_arrow_read_as_tsv_stops_at_the_first_poll_naming_the_flag():
    check = FirstRecordsCheck("clicks", "tsv", "criteo", 100)
    with pytest.raises(FormatMismatch) as err:
        feed(check, Decoder(Schema(), DecodeConfig("tsv")), arrow_messages())
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("topic 'clicks' holds Arrow IPC record batches, not tab-separated")
    assert "read it with --consumer-format arrow" in line


@pytest.mark.parametrize(("given", "found"), [("arrow", "tsv"), ("json", "tsv")])
def test_text_read_as_another_format_stops_after_16_messages(given, found):
    check = FirstRecordsCheck("clicks", given, "criteo", 10_000)
    decoder = Decoder(Schema(), DecodeConfig(given))
    for _ in range(15):  # 15 messages all rejected: not yet
        feed(check, decoder, [TSV])
    with pytest.raises(FormatMismatch, match=f"--consumer-format {found} "):
        feed(check, decoder, [TSV])


def test_a_wrong_schema_stops_after_100_records_with_the_field_counts():
    check = FirstRecordsCheck("clicks", "tsv", "12,26", 100)
    decoder = Decoder(parse_schema("12,26"), DecodeConfig("tsv"))
    for _ in range(6):  # 96 records
        feed(check, decoder, [TSV])
    with pytest.raises(FormatMismatch) as err:
        feed(check, decoder, [TSV])
    line = str(err.value)
    assert "wrong_field_count 112" in line and "expected 39 tab-separated fields (it has 40)" in line
    assert "--consumer-schema '12,26'" in line and "--consumer-stop-on-rejects 0" in line


def test_one_good_record_turns_the_check_off_for_good():
    """Bad messages first, then a good one: from then on every reject is a malformed record
    among good ones, dead-lettered, never a stop."""
    check = FirstRecordsCheck("clicks", "tsv", "criteo", 100)
    decoder = Decoder(Schema(), DecodeConfig("tsv"))
    feed(check, decoder, arrow_messages()[:2] + [b"not\ta\trecord"] * 5)
    feed(check, decoder, [TSV])
    for _ in range(50):
        feed(check, decoder, arrow_messages() + [b"not\ta\trecord"] * 20)
    assert not check.armed


def test_zero_never_stops():
    check = FirstRecordsCheck("clicks", "tsv", "criteo", 0)
    for _ in range(20):
        feed(check, Decoder(Schema(), DecodeConfig("tsv")), arrow_messages())
