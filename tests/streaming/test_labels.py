"""Several labels (issue 56): a schema names them (``label = ["click", "conversion"]``), every
format decodes them into ``labels [B, T]``, a record missing one is dead-lettered as
``missing_label`` (a wrong value as ``bad_label``), and the synthetic stream makes a conversion
label that follows the click."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetgmp.streaming import ClickBatch, RejectReason, SchemaError, parse_schema
from hetgmp.streaming.arrow import encode_arrow
from hetgmp.streaming.codec import DecodeConfig, Decoder
from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

SPEC = "label=click,conversion;dense=price;sparse=user,item"


def _decode(fmt: str, payloads: list[bytes], spec: str = SPEC) -> tuple[ClickBatch, list]:
    d = Decoder(parse_schema(spec), DecodeConfig(format=fmt)).decode(payloads)
    return d.batch, d.rejects


def test_a_schema_names_its_labels_in_a_file_and_inline(tmp_path: Path) -> None:
    inline = parse_schema(SPEC)
    assert inline.labels == ("click", "conversion") and inline.tasks == 2
    assert inline.num_fields == 2 + 1 + 2
    path = tmp_path / "s.toml"
    path.write_text('label = ["click", "conversion"]\ndense = ["price"]\n'
                    'sparse = ["user", "item"]\n')
    assert parse_schema(str(path)) == inline
    assert parse_schema("label=click;dense=price;sparse=user").tasks == 1
    for bad, said in (('label = []', "label must be a field name"),
                      ('label = ["click", 3]', "label must be a field name"),
                      ('label = ["click", "item"]\nsparse = ["item"]', "given more than once")):
        path.write_text(bad + ("\n" if "sparse" in bad else '\nsparse = ["item"]\n'))
        with pytest.raises(SchemaError, match=said) as exc:
            parse_schema(str(path))
        assert "\n" not in str(exc.value)


def test_every_format_decodes_each_label() -> None:
    tsv = b"1\t0\t2.5\tu1\ti1\n1\t1\t0\tu2\ti2\n0\t0\t1\tu3\ti3"
    by_tsv, rejects = _decode("tsv", [tsv])
    assert not rejects
    np.testing.assert_array_equal(by_tsv.labels, [[1, 0], [1, 1], [0, 0]])
    rows = [{"click": 1, "conversion": 0, "price": 2.5, "user": "u1", "item": "i1"},
            {"click": 1, "conversion": 1, "price": 0, "user": "u2", "item": "i2"},
            {"click": 0, "conversion": 0, "price": 1, "user": "u3", "item": "i3"}]
    by_json, rejects = _decode("json", [b"\n".join(json.dumps(r).encode() for r in rows)])
    assert not rejects
    np.testing.assert_array_equal(by_json.labels, by_tsv.labels)
    np.testing.assert_array_equal(by_json.values, by_tsv.values)


def test_a_missing_label_is_dead_lettered_as_missing_and_a_wrong_one_as_bad() -> None:
    _, rejects = _decode("tsv", [b"1\t\t2.5\tu1\ti1\n1\t2\t0\tu2\ti2\n1\t1\t0\tu2\ti2"])
    assert [r.reason for r in rejects] == [RejectReason.MISSING_LABEL, RejectReason.BAD_LABEL]
    lines = [{"click": 1, "price": 1, "user": "a", "item": "b"},
             {"click": 1, "conversion": None, "price": 1, "user": "a", "item": "b"},
             {"click": 1, "conversion": 5, "price": 1, "user": "a", "item": "b"},
             {"click": 0, "conversion": 0, "price": 1, "user": "a", "item": "b"}]
    batch, rejects = _decode("json", [b"\n".join(json.dumps(r).encode() for r in lines)])
    assert len(batch) == 1 and sorted(r.reason.value for r in rejects) == [
        "bad_json", "missing_label", "missing_label"]
    # Arrow: a null conversion is missing, a 2 is bad.
    import pyarrow as pa

    from hetgmp.streaming.arrow import ipc_message
    table = pa.RecordBatch.from_pydict({
        "click": pa.array([1, 1, 0], pa.int8()), "conversion": pa.array([None, 2, 0], pa.int8()),
        "price": pa.array([1.0, 2.0, 3.0]), "user": pa.array([1, 2, 3]),
        "item": pa.array([4, 5, 6])})
    batch, rejects = _decode("arrow", [ipc_message(table)])
    assert len(batch) == 1 and batch.labels.shape == (1, 2)
    assert sorted(r.reason.value for r in rejects) == ["bad_label", "missing_label"]


def test_the_synthetic_conversion_follows_the_click_and_decodes_in_every_format() -> None:
    syn = SyntheticConfig(shape="user_history", users=500, items=800, vocab_max=5_000,
                          conversion=True, seed=3)
    assert syn.schema.labels == ("label", "conversion")
    stream = SyntheticStream(syn)
    block = stream.take(0, 20_000)
    click, bought = block.labels[:, 0], block.labels[:, 1]
    assert not (bought > click).any()  # a conversion only where there was a click
    rate = bought.sum() / click.sum()
    assert 0.2 < rate < 0.7, rate
    # Likelier the likelier the click: the converted clicks' ground-truth click probability
    # is above the others'.
    assert block.prob[bought == 1].mean() > block.prob[(click == 1) & (bought == 0)].mean()
    # Without it the stream is what it was: the same clicks.
    plain = SyntheticStream(SyntheticConfig(shape="user_history", users=500, items=800,
                                            vocab_max=5_000, seed=3)).take(0, 20_000)
    np.testing.assert_array_equal(plain.labels, click)
    tsv = Decoder(syn.schema).decode([b"\n".join(stream.lines(0, 500))]).batch
    np.testing.assert_array_equal(tsv.labels, block.labels[:500])
    values, lengths = stream.sparse(stream.take(0, 500))
    arrow = Decoder(syn.schema, DecodeConfig(format="arrow")).decode(encode_arrow(
        syn.schema, block.labels[:500], block.dense[:500], values, 100, lengths)).batch
    np.testing.assert_array_equal(arrow.labels, tsv.labels)
    np.testing.assert_array_equal(arrow.values, tsv.values)
