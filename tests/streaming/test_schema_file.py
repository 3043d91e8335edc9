"""Schema files: fields in the file's order, shared tables share ids, dense transforms, and
errors that name the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streaming.codec import Decoder
from streaming.hashing import feature_id
from streaming.schema_file import load_schema
from streaming.types import DenseField, Schema

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
    schema = Schema.parse(_write(tmp_path, SHARED))
    assert schema.label == "click"
    assert schema.dense == ("price", "views") and schema.sparse == ("item", "user", "last_item")
    assert schema.tables == ("items", "user", "items")
    assert schema.dense_fields == (DenseField("price", "none"), DenseField("views"))
    assert schema.log1p.tolist() == [False, True]
    # One line of names is the same schema as the tables without settings.
    short = Schema.parse(_write(tmp_path, 'dense = ["a"]\nsparse = ["b", "c"]\n'))
    assert short == Schema(dense=("a",), sparse=("b", "c"))
    assert short.tables == ("b", "c")


def test_fields_sharing_a_table_give_a_value_the_same_id_and_others_keep_todays(
        tmp_path: Path) -> None:
    schema = Schema.parse(_write(tmp_path, SHARED))
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
     'line 3: sparse.history: pooling must be sum or mean, not \'max\''),
    ('[sparse.tags]\nweighted = "yes"\n', "line 2: sparse.tags: weighted must be a bool"),
    ('[sparse.tags]\nmax_len = 0\n', "line 2: sparse.tags: max_len must be at least 1"),
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
        Schema.parse(path)
    assert expected in str(info.value) and path in str(info.value), str(info.value)


def test_a_missing_schema_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="schema file .*nowhere.toml"):
        Schema.parse(str(tmp_path / "nowhere.toml"))


def test_the_command_line_takes_the_same_settings_after_each_name(tmp_path: Path) -> None:
    inline = Schema.parse("label=click;dense=price:transform=none;sparse=item:table=items,"
                          "history:table=items:max_len=50:pooling=mean,"
                          "tags:max_len=8:weighted=true:on_overflow=reject")
    path = tmp_path / "s.toml"
    path.write_text('label = "click"\n[dense.price]\ntransform = "none"\n'
                    '[sparse.item]\ntable = "items"\n'
                    '[sparse.history]\ntable = "items"\nmax_len = 50\npooling = "mean"\n'
                    '[sparse.tags]\nmax_len = 8\nweighted = true\non_overflow = "reject"\n')
    assert inline == load_schema(path)
    # Names alone are today's form, unchanged.
    assert Schema.parse("label=y;dense=a;sparse=b,c") == Schema("y", ("a",), ("b", "c"))
    for spec, said in (("label=y;sparse=a:pooling=max:max_len=3", "sparse.a: pooling must be"),
                       ("label=y;sparse=a:max_len=x", "sparse.a: max_len must be an int"),
                       ("label=y;sparse=a:size=3", "sparse.a: expected key=value settings"),
                       ("label=y;sparse=a:weighted=yes", "sparse.a: weighted must be true")):
        with pytest.raises(ValueError, match=said):
            Schema.parse(spec)
