"""The hetgmp command line: help, configuration precedence, secrets, error messages."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from hetgmp.runtime import add_flags, build, redact
from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.trainer.app.cli import build_parser, main


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hetgmp.trainer.app.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def test_help_lists_subcommands():
    r = run_cli("--help")
    assert r.returncode == 0
    for name in ("broker", "produce", "consume", "bench", "demo"):
        assert name in r.stdout


def test_produce_help_shows_defaults_and_env_variables_but_no_secret():
    r = run_cli("produce", "--help", env={"HETGMP_KAFKA_SASL_PLAIN_PASSWORD": "hunter2"})
    assert r.returncode == 0
    assert "HETGMP_KAFKA_BOOTSTRAP_SERVERS" in r.stdout
    assert "--synthetic-drift-every" in r.stdout and "100000" in r.stdout
    assert "hunter2" not in r.stdout and "***" in r.stdout


def test_precedence_cli_over_env_over_toml_over_default(tmp_path, monkeypatch):
    toml = tmp_path / "c.toml"
    toml.write_text('[kafka]\nclient_id = "from-toml"\nrequest_timeout_ms = 1234\n[produce]\ncount = 7\n')
    monkeypatch.setenv("HETGMP_KAFKA_CLIENT_ID", "from-env")
    argv = ["--config", str(toml), "produce", "--count", "9"]
    args, _ = build_parser(argv).parse_known_args(argv)
    kafka = build(KafkaSettings, args)
    assert kafka.client_id == "from-env"  # env beats TOML
    assert kafka.request_timeout_ms == 1234  # TOML beats default
    assert args.count == 9  # command line beats TOML
    argv = ["--config", str(toml), "produce", "--client-id", "from-cli"]
    args, _ = build_parser(argv).parse_known_args(argv)
    assert build(KafkaSettings, args).client_id == "from-cli"


@pytest.mark.parametrize("where", ["before", "after"])
def test_train_and_demo_read_the_config_file(tmp_path, capsys, where):
    """train and demo parse their own flags: --config must reach them on either side of the
    command's name (the top-level parser used to consume it and drop it)."""
    toml = tmp_path / "c.toml"
    toml.write_text("[train]\nglobal_batch = 96\n[demo]\nworkers = 3\n")
    for command, shown in (("train", "96 from config file"), ("demo", "3 from config file")):
        argv = ([command, "--config", str(toml)] if where == "after"
                else ["--config", str(toml), command]) + ["--help"]
        with pytest.raises(SystemExit) as ended:
            main(argv)
        assert ended.value.code == 0
        assert shown in " ".join(capsys.readouterr().out.split()), command


@pytest.mark.parametrize("flags,says", [
    (["--count", "-1"], "count, start and rate must be >= 0"),
    (["--chunk-records", "0"], "chunk_records must be >= 1"),
    (["--synthetic-segments", "0"], "segments, hot_size and n_sparse"),
])
def test_produce_refuses_bad_settings_before_connecting(flags, says, capsys):
    """They used to raise from deep inside (or, for --count -1, produce for ever)."""
    with pytest.raises(SystemExit) as ended:
        main(["produce", "--bootstrap-servers", "localhost:1", *flags])
    assert ended.value.code == 2 and says in capsys.readouterr().err


def test_bad_environment_value_is_a_clear_error(monkeypatch):
    import argparse

    monkeypatch.setenv("HETGMP_KAFKA_REQUEST_TIMEOUT_MS", "soon")
    with pytest.raises(SystemExit, match="HETGMP_KAFKA_REQUEST_TIMEOUT_MS"):
        add_flags(argparse.ArgumentParser(), KafkaSettings, "kafka")


def test_secrets_are_masked_in_repr_and_descriptions():
    k = KafkaSettings(sasl_plain_username="me", sasl_plain_password="hunter2", ssl_password="p4ss")
    assert "hunter2" not in repr(k) and "p4ss" not in repr(k)
    assert "hunter2" not in k.describe()
    assert redact(k)["sasl_plain_password"] == "***"
    assert k.client_kwargs()["sasl_plain_password"] == "hunter2"  # still passed to kafka-python


def test_unknown_flag_is_rejected():
    with pytest.raises(SystemExit):
        main(["produce", "--no-such-flag"])


def test_missing_replay_file_is_reported(broker, unique):
    r = run_cli(
        "produce",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        unique("t"),
        "--source",
        "file:/nonexistent/day_0.gz",
    )
    assert r.returncode == 2 and "not found" in r.stderr


@pytest.mark.broker
def test_produce_then_consume_through_the_cli(broker, unique, tmp_path):
    import gzip

    topic = unique("cli")
    r = run_cli(
        "produce",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--count",
        "5000",
        "--seed",
        "3",
    )
    assert r.returncode == 0, r.stderr
    assert "done: 5,000 records" in r.stdout and "ceiling) AUC" in r.stdout
    # Replay a gzip Criteo file into the same topic: two good lines and one bad one.
    good = "\t".join(["1"] + ["2"] * 13 + ["68fd1e64"] * 26)
    path = tmp_path / "day.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(good + "\n" + "broken line\n" + good + "\n")
    r = run_cli(
        "produce",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        topic,
        "--source",
        f"file:{path}",
        "--records-per-message",
        "1",
    )
    assert r.returncode == 0, r.stderr
    r = run_cli(
        "consume",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--consumer-topic",
        topic,
        "--consumer-group-id",
        unique("g"),
        "--idle-exit",
        "3",
        "--commit",
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["records"] == 5002
    assert summary["rejected"] == {"wrong_field_count": 1}
    assert summary["committed"] is True


@pytest.mark.broker
def test_consume_reads_lists_with_a_schema_given_on_the_command_line(broker, unique, tmp_path):
    topic = unique("lists")
    path = tmp_path / "lists.tsv"
    path.write_text("1\t2.5\ta\tb,c,d\tx:0.5\n"   # history over max_len 2: truncated
                    "0\t1\ta\tb\tx:abc\n"          # a weight that is no number
                    "1\t0\ta\t\t\n")               # empty lists
    r = run_cli("produce", "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
                "--source", f"file:{path}", "--records-per-message", "1")
    assert r.returncode == 0, r.stderr
    r = run_cli("consume", "--bootstrap-servers", broker.bootstrap_servers,
                "--consumer-topic", topic, "--consumer-group-id", unique("g"), "--idle-exit", "3",
                "--consumer-schema",
                "label=y;dense=p:transform=none;sparse=item,hist:table=item:max_len=2,"
                "tags:max_len=4:weighted=true")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["records"] == 2
    assert summary["rejected"] == {"bad_weight": 1}
    assert summary["values_truncated"] == {"hist": 1}


@pytest.mark.parametrize("secret", ["pw-5f3a9c1e-not-for-logs", "Zq7Wk\\back'q\"d\tt"])
def test_a_password_never_reaches_the_log_whichever_library_writes_it(kafka, unique, secret):
    """kafka-python's admin client logs its whole configuration at DEBUG, SASL password
    included, as Python's repr (a backslash, a quote or a tab escaped); the log formatter masks
    every secret the project handed to a client, in every form it may be printed."""
    r = run_cli("--log-level", "DEBUG", "produce", "--bootstrap-servers",
                kafka.bootstrap_servers, "--sasl-plain-password", secret, "--count", "64",
                "--topic", unique("secret"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sasl_plain_password" in r.stderr  # the line that used to carry it is there
    assert secret not in r.stdout + r.stderr
    assert repr(secret)[1:-1] not in r.stdout + r.stderr
    assert "'sasl_plain_password': '***'" in r.stderr or \
        "'sasl_plain_password': \"***\"" in r.stderr


@pytest.mark.parametrize("secret", ["Zq7Wk\\back", "it's", 'say "x"', "tab\there", "both'\"",
                                    "ünï", "a b&c=d"])
def test_every_printed_form_of_a_secret_is_masked(secret: str) -> None:
    import json
    import logging
    from urllib.parse import quote_plus

    from hetgmp.runtime import register_secret
    from hetgmp.runtime.logs import RedactingFormatter

    register_secret(secret)
    printed = [repr(secret), repr(secret.encode()), json.dumps(secret), quote_plus(secret),
               repr({"sasl_plain_password": secret})]
    for text in printed:
        record = logging.LogRecord("kafka.admin", logging.DEBUG, __file__, 1, "config %s",
                                   (text,), None)
        line = RedactingFormatter("%(message)s").format(record)
        assert "***" in line and secret not in line, (text, line)
        if len(secret) > 4:
            assert secret[1:-1] not in line, (text, line)


def test_the_formatter_masks_secrets_in_arguments_and_tracebacks():
    import logging

    from hetgmp.runtime import register_secret
    from hetgmp.runtime.logs import RedactingFormatter

    register_secret("s3cr3t-value")
    try:
        raise ValueError("login failed with s3cr3t-value")
    except ValueError:
        record = logging.LogRecord("kafka.conn", logging.ERROR, __file__, 1,
                                   "config %s", ({"password": "s3cr3t-value"},), sys.exc_info())
    line = RedactingFormatter("%(message)s").format(record)
    assert "s3cr3t-value" not in line
    assert "config {'password': '***'}" in line and "ValueError: login failed with ***" in line


def test_top_level_help_lists_every_benchmark_bench_accepts(capsys):
    parser = build_parser(["bench"])
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (which,) = [a for a in sub.choices["bench"]._actions if a.dest == "which"]
    assert which.choices and len(which.choices) > 5
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    line = text[text.index("bench benchmarks:"):]
    line = line[:line.index("(")]
    listed = {w.strip(" ,:") for w in line.split()}
    assert set(which.choices) <= listed, set(which.choices) - listed


@pytest.mark.broker
def test_broker_port_0_picks_a_free_port_and_prints_it():
    import os
    import re
    import signal

    from hetgmp.streaming.broker import kafka_ready

    proc = subprocess.Popen([sys.executable, "-m", "hetgmp.trainer.app.cli", "broker", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.search(r"bootstrap servers: 127\.0\.0\.1:(\d+)", first)
        assert found, first + (proc.stderr.read() if proc.poll() is not None else "")
        port = int(found.group(1))
        assert port > 0 and kafka_ready("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
