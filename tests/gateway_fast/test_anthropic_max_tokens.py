"""Anthropic's Messages API requires ``max_tokens``: a ``/v1/messages`` request without one is
Anthropic's own 400 (``max_tokens: Field required``), not an answer run to the end of the
context. A length the model (``max_tokens``) or the variant gives counts; ``count_tokens``
generates nothing and needs none."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import HELLO, error_of

pytestmark = pytest.mark.anyio

MODELS: dict[str, dict[str, Any]] = {
    "m": {"variants": {"short": {"defaults": {"max_tokens": 4}}, "capped": {"force": {"n_predict": 4}}}},
    "d": {"max_tokens": 8},
}


async def test_messages_without_max_tokens_is_anthropics_400(serve: Serve) -> None:
    async with serve(MODELS) as gw:
        for body in (
            {"model": "m", "messages": HELLO},
            {"model": "m", "messages": HELLO, "max_tokens": None},
            {"model": "m", "messages": HELLO, "n_predict": 30},  # not read on this route
            {"model": "m", "messages": HELLO, "stream": True},
        ):
            r = await gw.client.post("/v1/messages", json=body)
            assert r.status_code == 400, (body, r.text)
            message, kind = error_of("anthropic", r.json())
            assert kind == "invalid_request_error", r.text
            assert message.startswith("max_tokens: Field required"), message
            assert "send" in message and "\n" not in message, message
        assert not gw.model("m").running  # refused before anything loaded

        # a wrong type is named too
        r = await gw.client.post("/v1/messages", json={"model": "m", "messages": HELLO, "max_tokens": "9"})
        assert r.status_code == 400 and "max_tokens" in error_of("anthropic", r.json())[0], r.text


async def test_a_length_from_the_request_the_model_or_the_variant_is_enough(serve: Serve) -> None:
    async with serve(MODELS) as gw:
        for body in (
            {"model": "m", "messages": HELLO, "max_tokens": 3},
            {"model": "m:short", "messages": HELLO},
            {"model": "m:capped", "messages": HELLO},
            {"model": "d", "messages": HELLO},
        ):
            r = await gw.client.post("/v1/messages", json=body)
            assert r.status_code == 200, (body, r.text)
            assert r.json()["type"] == "message", r.text


async def test_count_tokens_needs_no_max_tokens(serve: Serve) -> None:
    async with serve(MODELS) as gw:
        r = await gw.client.post("/v1/messages/count_tokens", json={"model": "m", "messages": HELLO})
        assert not (r.status_code == 400 and "max_tokens" in r.text), r.text
        assert gw.model("m").requests_total == 1  # forwarded to the child
