"""The request id is said once per response, whichever part of the gateway answered: an error
rendered in a dialect, a relayed answer (whole or streamed), a plain route (in-process, against
the FAKE llama-server)."""

from __future__ import annotations

import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, chat

pytestmark = pytest.mark.anyio


async def test_each_response_says_its_request_id_once(serve: Serve) -> None:
    async with serve({"m": {"preload": True}}) as gw:
        for dialect in DIALECTS:
            for model in ("m", "nope"):
                for stream in (False, True):
                    path, body = chat(dialect, model, stream=stream)
                    r = await gw.client.post(path, json=body, headers={"X-Request-ID": "rid-1"})
                    assert r.headers.get_list("x-request-id") == ["rid-1"], (dialect, model, stream)
        r = await gw.client.get("/v1/models")
        ids = r.headers.get_list("x-request-id")
        assert len(ids) == 1 and ids[0], ids
