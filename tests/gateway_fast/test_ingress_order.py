"""The one ingress (``service/proxy/_ingress``): every model route, of every dialect, meets the
same steps in the same order. Loops over the route table (``core/_routes.MODEL_ROUTES``), so a
route added to it is covered the day it is added. In-process, against the FAKE llama-server."""

from __future__ import annotations

from typing import Any

import pytest

from rocmforge_supervisor.service.core._routes import MODEL_ROUTES, ForwardRoute
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import HELLO, error_of

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "scoped", "key": "scoped-secret", "models": ["mine"]},
    {"name": "root", "key": "root-secret", "admin": True},
]
SCOPED = {"Authorization": "Bearer scoped-secret"}
ADMIN = {"Authorization": "Bearer root-secret"}

#: The model routes whose model is named in a JSON body: every dialect's (the form and query
#: routes name it elsewhere; the scope matrix walks those).
JSON_ROUTES = [r for r in MODEL_ROUTES if r.method == "POST" and r.model_from == "json"]


def _body(route: ForwardRoute, model: str) -> dict[str, Any]:
    """A body the route's dialect reads as well formed (its fields beyond the model are the
    child's to judge)."""
    if route.path in ("/api/embed", "/api/embeddings"):
        return {"model": model, "input": "hi", "prompt": "hi"}
    if route.path == "/api/generate":
        return {"model": model, "prompt": "hi", "stream": False}
    if route.checks in ("chat", "messages") or route.path == "/api/chat":
        return {"model": model, "messages": HELLO, "stream": False}
    return {"model": model}


def _ids(routes: list[ForwardRoute]) -> list[str]:
    return [r.path for r in routes]


def test_the_table_holds_every_dialect() -> None:
    assert {r.dialect for r in JSON_ROUTES} == {"openai", "anthropic", "ollama"}


@pytest.mark.parametrize("route", JSON_ROUTES, ids=_ids(JSON_ROUTES))
async def test_an_unknown_model_is_a_404_in_the_route_dialect(serve: Serve, route: ForwardRoute) -> None:
    async with serve({"mine": {}}) as gw:
        r = await gw.client.post(route.path, json=_body(route, "nosuch"))
        assert r.status_code == 404, (route.path, r.text)
        message, _ = error_of(route.dialect, r.json())
        assert "nosuch" in message, message


async def test_the_key_scope_comes_before_every_check_of_what_the_body_asks(serve: Serve) -> None:
    """A key naming a model outside its scope learns nothing more than that: each of these bodies
    would meet a later step's refusal (a length the Messages API requires, tools a model cannot
    use, Ollama's context or unload), but the key's scope is checked first, in every dialect."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    asked: list[tuple[str, str, dict[str, Any]]] = [
        ("anthropic", "/v1/messages", {"model": "theirs", "messages": HELLO}),  # no max_tokens
        ("openai", "/v1/chat/completions", {"model": "theirs", "messages": HELLO, "tools": tools}),
        ("ollama", "/api/chat", {"model": "theirs", "messages": HELLO, "options": {"num_ctx": 10**9}}),
        ("ollama", "/api/generate", {"model": "theirs", "prompt": "", "keep_alive": 0}),  # an unload
    ]
    models = {"mine": {}, "theirs": {"tools": False}}
    async with serve(models, server={"keys": KEYS}) as gw:
        for dialect, path, body in asked:
            r = await gw.client.post(path, json=body, headers=SCOPED)
            assert r.status_code == 403, (path, r.text)
            message, _ = error_of(dialect, r.json())  # type: ignore[arg-type]
            assert "theirs" in message and "scoped" in message, message
            # The same body from the admin key meets the later step's own refusal (or, for the
            # unload, does it): the 403 above was the scope, not the body.
            r = await gw.client.post(path, json=body, headers=ADMIN)
            assert r.status_code != 403, (path, r.text)
        assert gw.model("theirs").status().state.value == "stopped"  # nothing loaded for a refusal
