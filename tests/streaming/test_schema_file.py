"""Schema files: fields in the file's order, shared tables share ids, dense transforms, and
errors that name the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetgmp.streaming.codec import Decoder
from hetgmp.streaming.hashing import feature_id
from hetgmp.streaming.schema_file import load_schema, parse_schema
from hetgmp.streaming.types import MAX_FIELDS, MAX_LEN, DenseField, Schema, SchemaError

SHARED = """\
label = "click"

[dense.price]
transform = "none"

[dense.views]

[sparse.item]
table = "items"

[sparse.user]

[sparse.last_item]          # the item a user clicked before: the same table
table = "items"
"""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "schema.toml"
    path.write_text(text)
    return str(path)


def test_a_schema_file_gives_its_fields_in_order_with_their_tables(tmp_path: Path) -> None:
    schema = parse_schema(_write(tmp_path, SHARED))
    assert schema.label == "click"
    assert schema.dense == ("price", "views") and schema.sparse == ("item", "user", "last_item")
    assert schema.tables == ("items", "user", "items")
    assert schema.dense_fields == (DenseField("price", "none"), DenseField("views"))
    assert schema.log1p.tolist() == [False, True]
    # One line of names is the same schema as the tables without settings.
    short = parse_schema(_write(tmp_path, 'dense = ["a"]\nsparse = ["b", "c"]\n'))
    assert short == Schema(dense=("a",), sparse=("b", "c"))
    assert short.tables == ("b", "c")


def test_fields_sharing_a_table_give_a_value_the_same_id_and_others_keep_todays(
        tmp_path: Path) -> None:
    schema = parse_schema(_write(tmp_path, SHARED))
    line = b"1\t25\t3\tshoe\tu7\tshoe"
    batch = Decoder(schema).decode([line]).batch
    item, user, last = batch.ids[0].tolist()
    assert item == last == feature_id("items", "shoe")
    assert user == feature_id("user", "u7")  # a field without a table: its own name, as today
    # The price is taken as it is, the views through log1p.
    assert batch.dense[0].tolist() == pytest.approx([25.0, np.log1p(3.0)])
    # Without a schema file nothing changes: ids hash the field's name, as every id so far.
    default = Schema()
    assert default.tables == default.sparse
    criteo = b"0\t" + b"\t".join([b"1"] * 13) + b"\t" + b"\t".join([b"68fd1e64"] * 26)
    ids = Decoder(default).decode([criteo]).batch.ids[0]
    assert ids.tolist() == [feature_id(f"C{i}", "68fd1e64") for i in range(1, 27)]


@pytest.mark.parametrize(("text", "expected"), [
    ('[sparse.history]\nmax_len = 50\npooling = "max"\n',
     'line 3: sparse.history: pooling must be sum, mean or none, not \'max\''),
    ('[sparse.tags]\nweighted = "yes"\n', "line 2: sparse.tags: weighted must be a bool"),
    ('[sparse.tags]\nmax_len = 0\n', "line 2: sparse.tags: max_len must be from 1 to 1,000,000, not 0"),
    ('[sparse.a]\n\n[dense.x]\ntransfrom = "none"\n',
     "line 4: dense.x: unknown setting 'transfrom'"),
    ('labels = "y"\n[sparse.a]\n', "line 1: unknown key 'labels'"),
    ('[sparse.t]\nweighted = true\npooling = "mean"\n', "sparse.t: a weighted field pools by sum"),
    ('[sparse.a]\non_overflow = "drop"\n',
     "line 2: sparse.a: on_overflow must be truncate or reject"),
    ('[sparse.a\n', "is not valid TOML"),
    ('[dense.x]\n', "a schema needs at least one sparse"),
])
def test_errors_name_the_file_the_line_and_the_field(tmp_path: Path, text: str,
                                                     expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        parse_schema(path)
    assert expected in str(info.value) and path in str(info.value), str(info.value)


def test_a_missing_schema_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="schema file .*nowhere.toml"):
        parse_schema(str(tmp_path / "nowhere.toml"))


def test_the_command_line_takes_the_same_settings_after_each_name(tmp_path: Path) -> None:
    inline = parse_schema("label=click;dense=price:transform=none;sparse=item:table=items,"
                          "history:table=items:max_len=50:pooling=mean,"
                          "tags:max_len=8:weighted=true:on_overflow=reject")
    path = tmp_path / "s.toml"
    path.write_text('label = "click"\n[dense.price]\ntransform = "none"\n'
                    '[sparse.item]\ntable = "items"\n'
                    '[sparse.history]\ntable = "items"\nmax_len = 50\npooling = "mean"\n'
                    '[sparse.tags]\nmax_len = 8\nweighted = true\non_overflow = "reject"\n')
    assert inline == load_schema(path)
    # Names alone are today's form, unchanged.
    assert parse_schema("label=y;dense=a;sparse=b,c") == Schema("y", ("a",), ("b", "c"))
    for spec, said in (("label=y;sparse=a:pooling=max:max_len=3", "sparse.a: pooling must be"),
                       ("label=y;sparse=a:max_len=x", "sparse.a: max_len must be an int"),
                       ("label=y;sparse=a:size=3", "sparse.a: expected key=value settings"),
                       ("label=y;sparse=a:weighted=yes", "sparse.a: weighted must be true")):
        with pytest.raises(ValueError, match=said):
            parse_schema(spec)


# -- issue 53: every schema error is one short line, naming the file and the line -------------


def _refused(tmp_path: Path, text: str | bytes) -> tuple[str, str]:
    """(message, path) of the SchemaError a schema file is refused with."""
    path = tmp_path / "schema.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SchemaError) as info:
        parse_schema(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    return message, str(path)


@pytest.mark.parametrize("nested", ["x = " + "[" * 5000 + "]" * 5000,
                                    "x = " + "{a = " * 5000 + "1" + "}" * 5000])
def test_a_file_nested_5000_deep_is_one_line_naming_the_line(tmp_path: Path, nested: str) -> None:
    """tomllib reads nesting by recursion: a RecursionError traceback in consume, train and
    serve."""
    message, _ = _refused(tmp_path, f'label = "y"\nsparse = ["a"]\n{nested}\n')
    assert "line 3: arrays or inline tables nested too deep" in message


def test_max_len_is_bounded_at_load_naming_the_field_and_line(tmp_path: Path) -> None:
    """10**20 was accepted, and the decoder then overflowed int64 on the first batch."""
    message, _ = _refused(tmp_path, '[sparse.a]\n\n[sparse.hist]\npooling = "mean"\n'
                                    'max_len = 100000000000000000000\n')
    assert "line 5: sparse.hist: max_len must be from 1 to 1,000,000, not " \
           "100000000000000000000" in message
    assert parse_schema(_write(tmp_path, f"[sparse.a]\nmax_len = {MAX_LEN}\n")) \
        .sparse_fields[0].max_len == MAX_LEN
    # An integer too long for int() is a line too, not a bare ValueError without the file.
    message, _ = _refused(tmp_path, "[sparse.a]\nmax_len = " + "9" * 5000 + "\n")
    assert "not valid TOML" in message and len(message) < 400
    # The command line's settings and counts have the same bounds.
    with pytest.raises(SchemaError, match="sparse.a: max_len must be from 1 to 1,000,000"):
        parse_schema("label=y;sparse=a:max_len=100000000000000000000")
    for counts in ("0,10001", "-1,3", "10001,1", "2,0"):
        with pytest.raises(SchemaError, match="a schema has 0 to 10,000 dense and 1 to 10,000"):
            parse_schema(counts)
    assert len(parse_schema("10000,10000").sparse) == MAX_FIELDS


def test_a_file_of_too_many_fields_is_refused_before_they_are_made(tmp_path: Path) -> None:
    names = ", ".join(f'"f{i}"' for i in range(MAX_FIELDS + 1))
    message, _ = _refused(tmp_path, f"dense = []\nsparse = [{names}]\n")
    assert "line 2: 10,001 sparse fields: a schema has at most 10,000" in message


def test_a_file_that_is_not_utf8_names_the_line_and_byte(tmp_path: Path) -> None:
    message, _ = _refused(tmp_path, b'label = "y"\n[sparse.a]\ntable = "caf\xe9"\n')
    assert "line 3: not UTF-8 at byte offset 35 (0xe9)" in message


def test_a_duplicate_among_10000_fields_is_one_short_line(tmp_path: Path) -> None:
    """It was one 89,047-character line listing every name."""
    sparse = "".join(f"[sparse.field_{i}]\n" for i in range(9_999))
    message, _ = _refused(tmp_path, f'label = "y"\n{sparse}[dense.field_1234]\n')
    assert message.endswith("line 1236: sparse.field_1234: field names must be unique: "
                            "'field_1234' given more than once"), message
    # The list form: many duplicates, a few named and the rest counted.
    listed = ", ".join(f'"f{i % 5000}"' for i in range(10000))
    message, _ = _refused(tmp_path, f"sparse = [{listed}]\n")
    assert "'f0', 'f1', 'f2', 'f3', 'f4' and 4,995 more given more than once" in message
    assert len(message) < 300


def test_long_names_and_values_are_cut_in_messages(tmp_path: Path) -> None:
    message, _ = _refused(tmp_path, f'[sparse.a]\npooling = "{"m" * 1_000_000}"\n')
    assert "line 2: sparse.a: pooling must be sum, mean or none, not 'mmm" in message
    assert len(message) < 300
    message, _ = _refused(tmp_path, f'[sparse.{"n" * 100_000}]\nsize = 3\n')
    assert "unknown setting 'size'" in message and len(message) < 300


def test_a_file_past_16_mib_is_refused_unread(tmp_path: Path) -> None:
    message, _ = _refused(tmp_path, '[sparse.a]\n' + "#" * (16 << 20) + "\n")
    assert "larger than 16 MiB" in message


TYPO = """\
[sparse.movie]

[sparse.watched]            # meant to share the movie field's rows
table = "movies"
max_len = 20
"""


def test_a_table_one_edit_from_another_fields_is_refused_with_what_was_meant(
        tmp_path: Path) -> None:
    """``table = "movies"`` for ``movie`` silently stopped sharing: its own table, new ids."""
    message, _ = _refused(tmp_path, TYPO)
    assert ("line 4: sparse.watched: table 'movies' is looked up by no other field, so "
            "'watched' shares no rows: did you mean 'movie'?") in message
    for typo, meant in (("Movie", "movie"), ("MOVIE", "movie"), ("mvoie", "movie"),
                        ("moive", "movie")):
        message, _ = _refused(tmp_path, TYPO.replace('"movies"', f'"{typo}"'))
        assert f"did you mean '{meant}'?" in message
    # A table that is a field's name, when that field looks up another table, shares nothing.
    message, _ = _refused(tmp_path, '[sparse.movie]\ntable = "films"\n'
                                    '[sparse.watched]\ntable = "movie"\n')
    assert "line 4: sparse.watched: table 'movie' is looked up by no other field" in message
    assert "did you mean 'films'?" in message
    with pytest.raises(SchemaError, match="did you mean 'movie'"):
        parse_schema("label=y;sparse=movie,watched:table=movies:max_len=20")
    assert parse_schema("label=y;sparse=movie,watched:table=movies:own_table=true").tables \
        == ("movie", "movies")


@pytest.mark.parametrize("text", [
    TYPO.replace('"movies"', '"movie"'),                           # shares the field's table
    '[sparse.item]\ntable = "items"\n[sparse.hist]\ntable = "items"\n',  # two share a table
    '[sparse.item]\ntable = "item_id"\n[sparse.user]\n',           # renamed, keeps its old ids
    '[sparse.C2]\n[sparse.x]\ntable = "C1"\n',                     # short names are not typos
    '[sparse.movie]\ntable = "movies"\n',                          # its own name is no typo
    '[sparse.user_v2]\n[sparse.x]\ntable = "user_v1"\n',            # a series, not a typo
    '[sparse.f1]\ntable = "old_f1"\n[sparse.f2]\ntable = "old_f2"\n',  # renamed, both
    TYPO.replace("max_len = 20", "own_table = true"),              # said to be its own
])
def test_tables_of_their_own_that_are_no_typo_are_legal(tmp_path: Path, text: str) -> None:
    assert parse_schema(_write(tmp_path, text)).sparse


def test_a_table_typo_among_10000_lone_tables_is_found(tmp_path: Path) -> None:
    """The check indexes the names once: 10,000 fields with tables of their own load (difflib
    against every name, for every field, took minutes)."""
    fields = "".join(f'[sparse.f{i}]\ntable = "old_f{i}"\n' for i in range(9_998))
    schema = parse_schema(_write(tmp_path, f"{fields}[sparse.movie]\n"))
    assert len(schema.sparse) == 9_999 and schema.tables[0] == "old_f0"
    message, _ = _refused(tmp_path, f'{fields}[sparse.movie]\n[sparse.w]\ntable = "movies"\n')
    assert "did you mean 'movie'?" in message


def test_every_schema_error_is_a_schema_error(tmp_path: Path) -> None:
    """The commands print a SchemaError as one line and exit 2; anything else would be a
    traceback."""
    for text in ('[sparse.a\n', '[dense.x]\n', 'x = 1\n', '[sparse.a]\nmax_len = 0\n'):
        _refused(tmp_path, text)
    for spec in ("a,b", "label=y;sparse=a:size=3", "foo=1", "label=y;sparse=a,a"):
        with pytest.raises(SchemaError):
            parse_schema(spec)
    with pytest.raises(SchemaError, match="nowhere.toml"):
        parse_schema(str(tmp_path / "nowhere.toml"))


@pytest.mark.parametrize("weights", ["price", "item", "y", "hist_w"])
def test_a_weights_column_named_as_a_field_or_other_weights_is_refused(
        tmp_path: Path, weights: str) -> None:
    # Issue 53: records whose weights column was another field's were rejected at random
    # rather than the schema refused; now the schema says which name clashes.
    text = f"""label = "y"
[dense.price]
[sparse.item]
[sparse.hist]
max_len = 4
weighted = true
weights = "hist_w"
[sparse.tags]
max_len = 4
weighted = true
weights = "{weights}"
"""
    with pytest.raises(SchemaError, match=f"weights '{weights}' is the name of another field"):
        load_schema(_write(tmp_path, text))


def test_a_synthetic_shape_with_conversion_is_named_by_its_shape_and_plus_conversion() -> None:
    from hetgmp.streaming.synthetic import SyntheticConfig, SyntheticStream

    for shape in ("segments", "user_history"):
        schema = parse_schema(f"{shape}+conversion")
        syn = SyntheticConfig(shape=shape, conversion=True)  # type: ignore[arg-type]
        assert schema == syn.schema and schema.labels == ("label", "conversion")
        # The records the producer writes for that stream decode with it, both labels.
        lines = SyntheticStream(syn).lines(0, 50)
        result = Decoder(schema).decode([b"\n".join(lines)])
        assert len(result.batch) == 50 and result.batch.labels.shape == (50, 2)
    assert parse_schema("user_history").labels == ("label",)
    with pytest.raises(SchemaError, match=r"takes '\+conversion'"):
        parse_schema("user_history+clicks")
