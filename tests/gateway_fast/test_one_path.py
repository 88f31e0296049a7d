"""One request path for every dialect: a chat in OpenAI's, Anthropic's or Ollama's shape, streamed
or not, goes through the one forwarder, so each shows the same way in ``forge_requests_total``
(under the route the client used), the token counters, the time-to-first-token histogram and the
activity log. Against the FAKE llama-server (Ollama's routes used to have a path of their own that
the metrics never saw: round 4's architecture review)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat
from tests.support.gateway import Gateway, poll

pytestmark = pytest.mark.anyio


def _samples(text: str, sample: str) -> dict[tuple[tuple[str, str], ...], float]:
    """A sample's values (``forge_requests_total``, a histogram's ``…_count``) by their labels."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == sample:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


async def _rows(gw: Gateway, count: int) -> list[dict[str, Any]]:
    store = gw.state.recorder.store
    assert store is not None
    await poll(lambda: len(store.rows(limit=100)) >= count, what=f"{count} activity rows")
    r = await gw.client.get("/api/activity", params={"limit": 100})
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["activity"]
    return rows


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_dialect_is_counted_alike(serve: Serve, dialect: Dialect, stream: bool) -> None:
    async with serve({"m": {"preload": True}}) as gw:
        path, body = chat(dialect, "m", stream=stream)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200, r.text
        assert r.content  # the whole answer, or the stream to its end
        if (
            dialect == "ollama" and not stream
        ):  # compact JSON, as starlette's JSONResponse and Ollama write it
            assert r.headers["content-type"] == "application/json" and b'", "' not in r.content

        metrics = (await gw.client.get("/metrics")).text
        requests = _samples(metrics, "forge_requests_total")
        key = (("endpoint", path), ("model", "m"), ("status", "200"))
        assert requests.get(key) == 1.0, f"{path} not counted: {requests}"
        assert _samples(metrics, "forge_completion_tokens_total").get((("model", "m"),), 0) > 0
        queue = _samples(metrics, "forge_request_queue_seconds_count")
        assert queue.get((("model", "m"),), 0) >= 1
        if stream:
            ttft = _samples(metrics, "forge_time_to_first_token_seconds_count")
            assert ttft.get((("model", "m"),), 0) >= 1

        row = (await _rows(gw, 1))[0]
        assert (row["route"], row["model"], row["status"]) == (path, "m", 200)
        assert row["completion_tokens"], row
