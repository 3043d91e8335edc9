"""A schema the commands refuse is one line on stderr naming the file and the line, exit 2, in
every command that takes one (issue 53: consume printed a 22-line traceback for each, and a file
nested 5,000 deep was a RecursionError traceback in all of them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BAD = {
    "nested": ('label = "y"\nsparse = ["a"]\nx = ' + "[" * 5000 + "]" * 5000 + "\n",
               "line 3: arrays or inline tables nested too deep"),
    "max_len": ('[sparse.a]\nmax_len = 100000000000000000000\n',
                "line 2: sparse.a: max_len must be from 1 to 1,000,000"),
    "pooling": ('[sparse.a]\npooling = "max"\n',  # consume: a 22-line traceback
                "line 2: sparse.a: pooling must be sum, mean or none, not 'max'"),
    "typo": ('[sparse.movie]\n[sparse.watched]\ntable = "movies"\n',
             "line 3: sparse.watched: table 'movies' is looked up by no other field"),
}
NOWHERE = "127.0.0.1:9"  # no broker: a schema that got past the check would wait on it


def _command(name: str, schema: str, tmp_path: Path) -> list[str]:
    if name == "consume":
        return ["consume", "--bootstrap-servers", NOWHERE, "--consumer-schema", schema]
    if name == "train":
        return ["train", "--source", "kafka", "--bootstrap-servers", NOWHERE,
                "--consumer-schema", schema]
    if name == "serve":
        return ["serve", "--checkpoint-dir", str(tmp_path), "--schema", schema]
    table = tmp_path / "records.parquet"  # the schema is read before the file or the broker
    table.write_bytes(b"")
    return ["produce", "--bootstrap-servers", NOWHERE, "--source", f"file:{table}",
            "--schema", schema]


# Each case starts the command (1.5-2 s an interpreter): two in the fast lane, the rest slow.
FAST = {("consume", "pooling"), ("train", "nested")}


@pytest.mark.parametrize(("command", "bad"), [
    pytest.param(c, b, marks=() if (c, b) in FAST else (pytest.mark.slow,), id=f"{c}-{b}")
    for c in ("consume", "train", "serve", "produce") for b in sorted(BAD)])
def test_a_bad_schema_file_is_one_line_and_exit_2(tmp_path: Path, command: str, bad: str) -> None:
    text, said = BAD[bad]
    schema = tmp_path / "schema.toml"
    schema.write_text(text)
    r = subprocess.run([sys.executable, "-m", "hetgmp.trainer.app.cli",
                        *_command(command, str(schema), tmp_path)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if str(schema) in line]
    assert len(lines) == 1 and said in lines[0] and len(lines[0]) < 400, r.stderr[-3000:]
