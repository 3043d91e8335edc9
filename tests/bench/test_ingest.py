"""The ingest benchmark runs end to end and prints its JSON summary (figures are not judged here)."""

from __future__ import annotations

import json

import pytest

from bench import ingest

pytestmark = pytest.mark.broker


def test_ingest_bench_prints_a_complete_summary(broker, capsys):
    assert (
        ingest.main(["--records", "4000", "--repeats", "1", "--bootstrap-servers", broker.bootstrap_servers])
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    assert summary["bench"] == "ingest"
    for key in ("raw_records_per_s", "decoded_records_per_s", "ratio", "producer_records_per_s"):
        assert summary[key] > 0
    assert [(r["client"], r["format"]) for r in summary["rows"]] == [
        (c, f) for f in ("tsv1", "tsv16", "arrow", "tsv_lists", "arrow_lists")
        for c in ("kafka-python", "confluent")]
    for row in summary["rows"]:
        for key in ("raw_records_per_s", "decoded_records_per_s", "ratio", "producer_records_per_s",
                    "producer_file_records_per_s", "decoded_ids_per_s"):
            assert row[key] > 0, (row, key)
        # MLPerf's bags hold 214 values a record; a field is missing 2% of the time.
        expected = (200, 214) if row["format"].endswith("_lists") else (26, 26)
        assert expected[0] <= row["ids_per_record"] <= expected[1], row
    by = {r["format"]: r for r in summary["rows"] if r["client"] == "kafka-python"}
    assert summary["ratios"]["ids_ratio_arrow_lists_over_arrow"] == pytest.approx(
        by["arrow_lists"]["decoded_ids_per_s"] / by["arrow"]["decoded_ids_per_s"], abs=1e-3)
    assert {"ids_ratio_tsv_lists_over_arrow", "ids_ratio_arrow_lists_over_arrow_confluent",
            "ids_ratio_tsv_lists_over_arrow_confluent"} <= set(summary["ratios"])
