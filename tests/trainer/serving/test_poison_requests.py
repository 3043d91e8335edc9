"""A record that stopped training (a value past float32, a JSON weight too long for a float)
is a 400 at ``/predict`` with its line's reason, counted under ``code="400"``: never a 500,
never a 200 in the request counter. The HTTP side is serve's own (:func:`build_app`), on
loopback in this process, with a small model and a schema with weights."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
from small_serving import GEN, PUBLISHES, small_model

from hetgmp.streaming import parse_schema
from hetgmp.streaming.hashing import feature_id
from hetgmp.trainer.serving import Service, ServingModel, build_app, log_version

# 2 dense (one trained as it is), 3 sparse (one a weighted list): the small model's widths.
SCHEMA = "label=y;dense=price:transform=none,views;sparse=item,city,tags:max_len=4:weighted=true"
GOOD = b"0\t1.5\t3\t100\t101\t102:0.5,103:2"
GOOD_JSON = {"y": 0, "price": 1.5, "views": 3, "item": 100, "city": 101, "tags": [102, 103],
             "tags_weights": [0.5, 2]}


def post_all(bodies: list[tuple[bytes, str]], model: ServingModel | None = None
             ) -> tuple[list[tuple[int, Any]], dict[str, float]]:
    """Each body POSTed to /predict of a live server: (status, reply) each, and the request
    counter by code afterwards."""
    from aiohttp.test_utils import TestClient, TestServer

    service = Service(model or small_model(), None, parse_schema(SCHEMA), "tsv")

    async def run() -> list[tuple[int, Any]]:
        async with TestClient(TestServer(build_app(service, 1 << 20))) as client:
            out = []
            for body, ctype in bodies:
                r = await client.post("/predict", data=body, headers={"Content-Type": ctype})
                text = await r.text()
                try:
                    reply: Any = json.loads(text)
                except ValueError:
                    reply = text
                out.append((r.status, reply))
            return out

    try:
        replies = asyncio.run(run())
    finally:
        service.pool.shutdown(wait=False)
    counts = {code: service.registry.get_sample_value("hetgmp_serve_requests_total",
                                                      {"code": code}) or 0.0
              for code in ("200", "400", "500")}
    return replies, counts


TSV, JSONL = "text/tab-separated-values", "application/x-ndjson"


def test_records_that_stopped_training_are_a_400_with_their_reason_and_counted_so() -> None:
    weight_past_a_float = json.dumps({**GOOD_JSON, "tags_weights": [10**400, 1]}).encode()
    bodies = [
        (GOOD + b"\n" + GOOD.replace(b"\t1.5\t", b"\t1e39\t"), TSV),  # inf in float32
        (GOOD.replace(b"102:0.5,103:2", b"102:3e38,103:3e38") + b"\n" + GOOD, TSV),  # pooled inf
        (json.dumps(GOOD_JSON).encode() + b"\n" + weight_past_a_float, JSONL),  # OverflowError
        (GOOD.replace(b"102:0.5,103:2", b"102,103"), TSV),  # a weighted field without weights
        (GOOD + b"\n" + GOOD, TSV),
    ]
    replies, counts = post_all(bodies)
    expected = [(2, "bad_dense"), (1, "bad_weight"), (2, "bad_weight"), (1, "bad_weight")]
    for (status, reply), (line, reason) in zip(replies, expected):
        assert status == 400, reply
        assert reply["rejected"] == [{"line": line, "reason": reason,
                                      "detail": reply["rejected"][0]["detail"]}]
    status, reply = replies[-1]
    assert status == 200 and len(reply["scores"]) == 2 and np.isfinite(reply["scores"]).all()
    assert counts == {"200": 1.0, "400": 4.0, "500": 0.0}


def test_a_record_the_model_scores_to_nan_is_a_400_not_a_500() -> None:
    """Values within the decoder's bound can still be too large for a model: DeepFM squares
    its pooled vectors, and weights of 1e18 on rows of 10 make inf - inf. The request is
    refused with the line, not answered with a NaN the JSON encoder refuses (a 500 that was
    counted as a 200)."""
    model = small_model()
    ids = np.array([feature_id("tags", str(v)) for v in range(102, 106)], np.int64)
    model.table.upsert(ids, np.full((4, 17), 10.0, np.float32), log_version(GEN, PUBLISHES + 1))
    big = GOOD.replace(b"102:0.5,103:2", b"102:1e18,103:1e18,104:1e18,105:1e18")
    replies, counts = post_all([(GOOD + b"\n" + big, TSV)], model)
    [(status, reply)] = replies
    assert status == 400, reply
    assert [(r["line"], r["reason"]) for r in reply["rejected"]] == [(2, "out_of_range")]
    assert counts == {"200": 0.0, "400": 1.0, "500": 0.0}
