"""``hetgmp train`` end to end: synthetic source in memory, and a real topic on the broker."""

from __future__ import annotations

import json

import pytest

from hetgmp.streaming.kafka import KafkaSettings
from hetgmp.streaming.producer import ProduceConfig, produce
from hetgmp.streaming.synthetic import SyntheticConfig
from hetgmp.trainer.app.cli import main as cli


def main(argv: list[str]) -> int:
    """``hetgmp train ARGV``: its exit status, usage errors included."""
    return _status(["train", *argv])


def demo_main(argv: list[str]) -> int:
    """``hetgmp demo ARGV``: its exit status, usage errors included."""
    return _status(["demo", *argv])


def _status(argv: list[str]) -> int:
    try:
        return cli(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return int(exc.code or 0)

pytestmark = pytest.mark.distributed

# gloo on CPU whatever the machine has (the tests of CUDA are in test_cuda.py), a small model.
MODEL = ["--device", "cpu", "--embed-dim", "8", "--hidden", "16", "--global-batch", "512"]
SMALL = [*MODEL, "--log-every", "0", "--threads", "1", "--timeout-s", "120"]


def _summary(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_train_synthetic_on_two_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    # Repartitioning off: the graph placement is computed once from a warm-up window (static).
    code = main(["--workers", "2", "--records", "8192", "--warmup", "8000", "--heldout", "4000",
                 "--staleness", "2", "--model", "widedeep", "--synthetic-vocab-max", "20000",
                 "--repartition-interval", "0", *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    assert s["workers"] == 2 and s["samples"] == 8192 and s["steps"] == 16
    assert s["device"] == "cpu"
    assert s["placement"]["kind"] == "graph" and min(s["placement"]["replicas"]) > 0
    assert 0.5 < s["heldout_auc"] < 1.0
    assert s["max_staleness"] <= 2 and s["replica_reads"] > 0
    assert s["bytes_per_sample"] > 0 and s["remote_rows_per_sample"] > 0
    phases = s["seconds_by_phase"]
    assert list(phases) == ["route", "read", "compute", "write", "dense"]
    assert phases["compute"] > 0 and sum(phases.values()) <= 2 * s["seconds"]


@pytest.mark.broker
def test_train_from_kafka_reads_every_partition_once(
    capsys: pytest.CaptureFixture[str], kafka: KafkaSettings, unique
) -> None:
    topic = unique("train")
    report = produce(kafka, ProduceConfig(topic=topic, count=20_000, partitions=4,
                                          records_per_message=16), SyntheticConfig(seed=2))
    assert report.records == 20_000
    # Online placement: hash at first, a full partition after 2,000 records, then repairs
    # (graph: on a run this short, auto may measure that hash is cheaper and go back to it).
    code = main(["--workers", "2", "--source", "kafka", "--records", "0", "--idle-s", "4",
                 "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
                 "--consumer-group-id", "", "--warmup", "2000", "--repartition-interval", "6000",
                 "--placement", "graph", "--staleness", "1", *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    # Every record trained exactly once, whatever rank read it and whichever trained it.
    assert s["samples"] == 20_000
    assert s["placement"]["kind"] == "online" and s["placement"]["version"] >= 1
    assert s["placements_moved_to"] >= 1 and s["placement"]["explicit_ids"] > 0
    assert s["progressive_auc"] is not None and 0.4 < s["progressive_auc"] < 1.0
    assert s["heldout_auc"] is None
    # Honest figures: the --idle-s 4 wait at the end is idle time, not training time.
    assert s["idle_seconds"] >= 3.0 and s["training_seconds"] <= s["seconds"] - 3.0
    assert s["samples_per_s"] == pytest.approx(s["samples"] / s["training_seconds"], rel=1e-2)
    assert s["eval_window"] == 20_000 and 0 < s["progressive_logloss"] < 1.0
    assert s["bytes_per_sample_all"] > s["bytes_per_sample"] + s["dense_bytes_per_sample"]
    assert s["loop_bytes_per_sample"] > 0  # the window went to the partitioner
    assert s["migrations"] >= 1 and s["rows_migrated"] > 0
    assert s["samples_total"] == s["samples"] and s["steps_total"] == s["steps"]


@pytest.mark.broker
def test_the_summary_counts_records_read_rejected_and_dead_lettered(
    capsys: pytest.CaptureFixture[str], kafka: KafkaSettings, unique
) -> None:
    """Records in = trained + dead-lettered, visible in the summary: the run used to show only
    a sample count lower than what was produced."""
    from kafka import KafkaProducer

    topic = unique("read-counts")
    produce(kafka, ProduceConfig(topic=topic, count=3_000, partitions=2, records_per_message=16),
            SyntheticConfig(seed=6))
    raw = KafkaProducer(**kafka.client_kwargs())
    for i in range(5):  # after good records: malformed records among good ones (invariant 6)
        raw.send(topic, value=b"not\ta\tcriteo\trecord %d" % i, partition=i % 2)
    raw.send(topic, value=b"2" + b"\t1" * 39, partition=0)  # a label that is not 0/1
    raw.flush()
    raw.close()
    code = main(["--workers", "2", "--source", "kafka", "--idle-s", "3",
                 "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
                 "--consumer-group-id", "", "--repartition-interval", "0", "--placement", "hash",
                 *SMALL])
    assert code == 0
    out = capsys.readouterr().out
    s = _summary(out)
    assert s["records_decoded"] == s["samples"] == 3_000 and s["records_in"] == 3_006
    assert s["rejected"] == {"bad_label": 1, "wrong_field_count": 5}
    assert s["records_rejected"] == s["dead_lettered"] == 6
    assert s["messages_read"] == -(-3_000 // 16) + 6  # 188 of 16 records (the last of 8)
    assert s["values_truncated"] == {}
    assert s["event_time_order"]["order_overflows"] == 0
    assert "read 3,006 records from Kafka: 3,000 decoded, 6 rejected (wrong_field_count 5, " \
           "bad_label 1; 6 dead-lettered)" in out.strip().splitlines()[-2]


def test_the_read_counts_of_the_ranks_become_the_summarys_fields_and_its_phrase() -> None:
    from hetgmp.trainer.app.train import _read_phrase, _records_read

    summed = {"order_holds": 2, "records_read": 990, "messages_read": 70, "dead_lettered": 12,
              "rejected.bad_label": 2, "rejected.too_many_values": 10, "truncated.hist": 7}
    read = _records_read(summed)
    assert read == {"records_in": 1_002, "records_decoded": 990, "messages_read": 70,
                    "records_rejected": 12,
                    "rejected": {"bad_label": 2, "too_many_values": 10}, "dead_lettered": 12,
                    "values_truncated": {"hist": 7}}
    assert _read_phrase(read) == ("; read 1,002 records from Kafka: 990 decoded, 12 rejected "
                                  "(too_many_values 10, bad_label 2; 12 dead-lettered), 7 list "
                                  "values cut to max_len")
    assert _read_phrase({"samples": 5}) == ""  # the synthetic source reads nothing


@pytest.mark.broker
def test_records_appended_after_heldout_after_are_scored_and_never_trained(
    capsys: pytest.CaptureFixture[str], kafka: KafkaSettings, unique
) -> None:
    import time

    topic = unique("heldout-after")
    produce(kafka, ProduceConfig(topic=topic, count=6_000, partitions=2), SyntheticConfig(seed=3))
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(kafka, ProduceConfig(topic=topic, count=1_500, start=6_000, partitions=2),
            SyntheticConfig(seed=3))
    code = main(["--workers", "2", "--source", "kafka", "--records", "0", "--idle-s", "3",
                 "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
                 "--consumer-group-id", "", "--repartition-interval", "0",
                 "--heldout-after", str(cut), "--eval-window", "2000", *SMALL])
    assert code == 0
    out = capsys.readouterr().out
    s = _summary(out)
    assert s["samples"] == 6_000  # not one of the late records trained
    assert s["heldout_records"] == 1_500  # every one of them scored
    assert 0.4 < s["heldout_auc"] < 1.0 and 0 < s["heldout_logloss"] < 1.0
    assert s["eval_window"] == 2_000 and s["progressive_in_sample"] is False
    assert "(held-out)" in out.strip().splitlines()[-2]


@pytest.mark.broker
def test_passes_count_the_held_out_records_once_and_say_the_progressive_auc_is_in_sample(
    capsys: pytest.CaptureFixture[str], kafka: KafkaSettings, unique
) -> None:
    """--passes 2 reads the held-out records twice (never training them): they are one set of
    1,500, not 3,000; the progressive AUC of the second pass scores records trained in the
    first; and the steps a live source trains short of --global-batch are counted."""
    import time

    topic = unique("passes")
    produce(kafka, ProduceConfig(topic=topic, count=6_000, partitions=2), SyntheticConfig(seed=5))
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce(kafka, ProduceConfig(topic=topic, count=1_500, start=6_000, partitions=2),
            SyntheticConfig(seed=5))
    code = main(["--workers", "2", "--source", "kafka", "--idle-s", "3", "--passes", "2",
                 "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
                 "--consumer-group-id", "", "--placement", "hash", "--repartition-interval", "0",
                 "--heldout-after", str(cut), "--eval-window", "2000", *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    assert s["samples"] == 2 * 6_000  # both passes trained, the late records in neither
    assert s["heldout_records"] == 1_500
    assert s["progressive_in_sample"] is True and s["progressive_auc"] is not None
    # 6,000 records a pass = 11 steps of 512 and 368 over: each pass's last step is short (a
    # live source may end others short too), and the short and full steps add up to the samples.
    short = s["steps_below_global_batch"]
    full = s["steps"] - short
    assert short >= 2
    assert full * 512 + short <= s["samples"] <= full * 512 + short * 511
    assert 0 < s["samples_per_step_min"] < 512
    assert s["samples_per_step_mean"] == pytest.approx(s["samples"] / s["steps"], abs=0.1)


def test_auto_placement_that_never_decided_says_what_was_in_force(
        capsys: pytest.CaptureFixture[str]) -> None:
    # 4,096 records, far below the 50,000 of --warmup: no graph placement was ever computed,
    # so hash was in force all along and auto never compared the two.
    code = main(["--workers", "2", "--records", "4096", "--heldout", "0", "--placement", "auto",
                 "--repartition-interval", "100000", *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    assert s["placement"]["kind"] == "undecided" and s["placement"]["in_force"] == "hash"
    assert s["placement"]["auto_decision"] == "none yet"
    assert s["progressive_in_sample"] is False
    # The synthetic source hands out whole batches: no step short of --global-batch.
    assert s["steps_below_global_batch"] == 0 and s["samples_per_step_min"] == 512


def test_one_rank_reports_the_hash_placement_it_kept(capsys: pytest.CaptureFixture[str]) -> None:
    # No partitioner runs on one rank (it holds every row): "online" named a placement that
    # never came.
    assert main(["--workers", "1", "--records", "1024", "--heldout", "0", *SMALL]) == 0
    assert _summary(capsys.readouterr().out)["placement"]["kind"] == "hash"


def test_a_bad_setting_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--global-batch", "0"]) == 2
    assert "global_batch" in capsys.readouterr().err


@pytest.mark.parametrize("command", [main, demo_main], ids=["train", "demo"])
def test_cuda_with_fewer_gpus_than_ranks_is_a_usage_error_before_anything_starts(
    capsys: pytest.CaptureFixture[str], gpus, command
) -> None:
    gpus(1)
    assert command(["--device", "cuda", "--workers", "2"]) == 2  # the demo's broker never starts
    assert "needs a GPU per rank" in capsys.readouterr().err


@pytest.mark.broker
@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_commits_and_exits_0(kafka: KafkaSettings, unique,
                                                                   tmp_path, capsys) -> None:
    """The whole path a deployment relies on: SIGTERM -> last step -> checkpoint -> commit ->
    exit 0; then --resume continues right after it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from hetgmp.trainer import checkpoint as ckpt

    topic, group = unique("sigterm"), unique("sigterm-group")
    produce(kafka, ProduceConfig(topic=topic, count=40_000, partitions=2), SyntheticConfig(seed=4))
    argv = [sys.executable, "-m", "hetgmp.trainer.app.cli", "train", "--workers", "2", "--source", "kafka",
            "--records", "0", "--idle-s", "300", "--bootstrap-servers", kafka.bootstrap_servers,
            "--consumer-topic", topic, "--consumer-group-id", group, "--warmup", "4000",
            "--repartition-interval", "8000", "--checkpoint-dir", str(tmp_path),
            "--checkpoint-interval", "0", "--log-every", "1", *MODEL]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # Wait until training is under way (progress lines on stderr), then ask it to stop.
        deadline = time.monotonic() + 120
        seen = 0
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if " step " in line and "samples/s" in line:
                seen += 1
                if seen >= 12:
                    break
        assert seen >= 12, "training never got going"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    s = json.loads(out.strip().splitlines()[-1])
    assert 0 < s["samples"] < 40_000  # stopped early, not at the end of the topic
    manifest = ckpt.latest(tmp_path)
    assert manifest is not None and manifest.records == s["samples"]
    assert sum(manifest.offsets.values()) * 16 >= manifest.records  # 16 records a message

    # --resume: the rest of the topic, nothing twice.
    code = main(["--workers", "2", "--source", "kafka", "--records", "0", "--idle-s", "4",
                 "--bootstrap-servers", kafka.bootstrap_servers, "--consumer-topic", topic,
                 "--consumer-group-id", group, "--warmup", "4000", "--repartition-interval",
                 "8000", "--checkpoint-dir", str(tmp_path), "--resume", *SMALL])
    assert code == 0
    final = ckpt.latest(tmp_path)
    assert final is not None and final.records == 40_000
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # This run's samples and steps, and the totals over both runs.
    assert resumed["samples"] == 40_000 - s["samples"] and resumed["samples_total"] == 40_000
    assert resumed["steps_total"] > resumed["steps"] > 0


def test_a_synthetic_resume_below_the_trained_records_is_refused(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # The held-out records follow --records: resumed from a checkpoint of 4096 records with
    # --records 2048, they would be records the checkpoint trained on.
    run = ["--workers", "1", "--heldout", "1000", "--checkpoint-dir", str(tmp_path), *SMALL]
    assert main(["--records", "4096", *run]) == 0
    capsys.readouterr()
    assert main(["--records", "2048", "--resume", *run]) == 2
    assert "trained 4096 records of the synthetic range and --records asks for 2048" in \
        capsys.readouterr().err
    assert main(["--records", "2048", "--resume", *run, "--heldout", "0"]) == 0  # nothing scored
    capsys.readouterr()
    assert main(["--records", "6144", "--resume", *run]) == 0
    resumed = _summary(capsys.readouterr().out)
    assert resumed["samples"] == 2048 and resumed["samples_total"] == 6144


@pytest.mark.parametrize("argv,message", [
    (["--checkpoint-interval", "60s"], "--checkpoint-interval needs --checkpoint-dir"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--repartition-interval", "soon"], "expected records"),
    # Source and metrics settings: a usage error, not a traceback from inside a rank.
    (["--records", "-5"], "--records -5: the synthetic source needs at least one record"),
    (["--records", "0"], "is for --source kafka"),
    (["--heldout", "-1"], "--heldout -1: must be >= 0"),
    (["--source", "kafka", "--records", "-1"], "a Kafka source needs records >= 0"),
    (["--source", "kafka", "--idle-s", "0"], "positive idle and poll times"),
    (["--source", "kafka", "--passes", "2", "--checkpoint-dir", "ckpt"],
     "--passes with --checkpoint-dir"),
    (["--source", "kafka", "--passes", "0"], "passes >= 1"),
    (["--heldout-after", "123"], "--heldout-after is for --source kafka"),
    (["--eval-window", "0"], "--eval-window 0"),
    (["--metrics-port", "65535", "--workers", "2"], "with 2 rank(s) it must lie in 1..65534"),
    # Checked against the machine before any rank starts (they used to end in rank tracebacks).
    (["--workers", "1000"], "--workers 1000 x --threads 1 CPU ranks on"),
    (["--threads", "1000000"], "--threads 1000000: this machine has"),
    (["--embed-dim", "1000000000"], "dense parameters with --embed-dim 1000000000"),
    (["--repartition-interval", "-5"], "is negative"),  # it used to mean "never"
    (["--source", "kafka", "--consumer-max-record-bytes", "0"], "max_record_bytes"),
    # Paths (a file given as the checkpoint directory ended in a 30-line traceback).
    (["--checkpoint-dir", __file__], "is a file, not a directory"),
    (["--checkpoint-dir", f"{__file__}/ckpt"], "is a file, not a directory"),
    (["--delta-key-file", f"{__file__}.missing"], "--delta-key-file"),
])
def test_bad_settings_are_usage_errors_before_any_rank_starts(
        capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--global-batch", "0"], "global_batch must be >= 1"),
    (["--partitions", "0"], "partitions must be >= 1"),  # a topic of no partitions hung it
    (["--warmup", "-1"], "warmup must be >= 0"),
    (["--metrics-port", "70000"], "must lie in 1..65534"),
    (["--checkpoint-interval", "soon"], "expected records"),
])
def test_bad_demo_settings_are_usage_errors_before_the_broker_starts(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
        message: str) -> None:
    import hetgmp.trainer.app.demo as demo
    monkeypatch.setattr(demo, "run_demo", lambda *a: pytest.fail("the demo started"))
    assert demo_main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_metrics_port_range_counts_every_rank_of_a_torchrun_job(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(["--metrics-port", "65530", "--device", "cpu"]) == 2
    assert "with 8 rank(s) it must lie in 1..65528" in capsys.readouterr().err


def test_a_table_past_memory_spills_to_the_disk_tier_and_the_summary_says_so(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--workers", "2", "--records", "8192", "--heldout", "2000",
                 "--store-max-rows", "500", "--store-disk-dir", str(tmp_path), *SMALL])
    assert code == 0
    s = _summary(capsys.readouterr().out)
    store = s["store"]
    assert store["memory_rows"] <= 2 * 500 < store["disk_rows"]
    assert store["memory_rows"] + store["disk_rows"] == store["created"]  # nothing dropped
    assert store["evicted"] == 0 and store["spilled"] > 0 and store["restored"] > 0
    assert 0 < store["memory_hit_rate"] < 1 and store["disk_bytes"] > 0
    assert 0.5 < s["heldout_auc"] < 1.0
    assert list(tmp_path.iterdir()) == []  # each rank's tier removed at its end


def test_a_disk_tier_without_a_memory_cap_is_a_usage_error(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--store-disk-dir", str(tmp_path), *SMALL]) == 2
    assert "max_rows" in capsys.readouterr().err


def test_a_disk_tier_the_disk_cannot_hold_is_refused_before_any_rank_starts(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # 10^12 rows of memory tier spill more than any disk here holds.
    assert main(["--store-max-rows", str(10**12), "--store-disk-dir", str(tmp_path),
                 *SMALL]) == 2
    err = capsys.readouterr().err
    assert "--store-disk-dir" in err and "GiB free" in err and len(err.splitlines()) <= 2
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--store-max-rows", "100", "--store-disk-dir", str(blocker / "tier"),
                 *SMALL]) == 2
    assert "cannot create it" in capsys.readouterr().err
