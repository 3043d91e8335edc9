"""The ingest benchmark runs end to end and prints its JSON summary (figures are not judged here)."""

from __future__ import annotations

import json

import pytest

from bench import ingest

pytestmark = pytest.mark.broker


def test_ingest_bench_prints_a_complete_summary(broker, capsys):
    assert (
        ingest.main(["--records", "8000", "--repeats", "1", "--bootstrap-servers", broker.bootstrap_servers])
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    assert summary["bench"] == "ingest"
    for key in ("raw_records_per_s", "decoded_records_per_s", "ratio", "producer_records_per_s"):
        assert summary[key] > 0
    assert [(r["client"], r["format"]) for r in summary["rows"]] == [
        (c, f) for f in ("tsv1", "tsv16", "arrow") for c in ("kafka-python", "confluent")]
    for row in summary["rows"]:
        for key in ("raw_records_per_s", "decoded_records_per_s", "ratio", "producer_records_per_s",
                    "producer_file_records_per_s"):
            assert row[key] > 0, (row, key)
