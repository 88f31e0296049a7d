"""The 401 says how to send the key the way the route's clients do: Anthropic's send ``x-api-key``
(which the gateway takes), the others a Bearer token."""

from __future__ import annotations

import pytest

from tests.gateway_fast.conftest import Serve

pytestmark = pytest.mark.anyio


async def test_the_anthropic_route_names_x_api_key_and_bearer(serve: Serve) -> None:
    async with serve({"m": {}}, server={"api_key": "secret-key"}) as gw:
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        r = await gw.client.post("/v1/messages", json=body)
        assert r.status_code == 401 and r.json()["type"] == "error", r.text
        message = r.json()["error"]["message"]
        assert "x-api-key" in message and "Bearer" in message, message
        ok = await gw.client.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": "secret-key"})
        assert ok.status_code != 401, ok.text  # what the 401 says works

        other = await gw.client.get("/v1/models")
        assert other.status_code == 401 and "x-api-key" not in other.text and "Bearer" in other.text
