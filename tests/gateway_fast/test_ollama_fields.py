"""Ollama's requests with a top-level field of the wrong type (``"stream": "false"``, ``"tools":
"x"``…) are its server's 400, in Ollama's shape, naming the field — not a stream because a
non-empty string is true, nor the child's 500. In-process, against the fake llama-server; the
rows are ``ollama._api._TYPED``, so a field added there is covered here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rocmforge_supervisor.service.ollama._api import _TYPED
from tests.gateway_fast.conftest import Serve

pytestmark = pytest.mark.anyio

#: The route of each request kind, and what it needs besides the field under test.
_ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/api/chat", {"messages": [{"role": "user", "content": "Hi"}]}),
    "generate": ("/api/generate", {"prompt": "Hi"}),
    "embed": ("/api/embed", {"input": "Hi"}),
}
#: A value of the wrong type for each kind of field.
_WRONG: dict[type, Any] = {bool: "false", list: "x", str: 5}

CASES = [(key, kind) for key, (kinds, *_) in _TYPED.items() for kind in sorted(kinds)]


def test_every_kind_of_request_has_a_route_here() -> None:
    assert {kind for _, kind in CASES} <= set(_ROUTES)


@pytest.mark.parametrize(("key", "kind"), CASES)
async def test_a_field_of_the_wrong_type_is_a_400_naming_it(serve: Serve, key: str, kind: str) -> None:
    _, cls, what, example = _TYPED[key]
    async with serve({"m": {"preload": True}}) as gw:
        path, body = _ROUTES[kind]
        r = await gw.client.post(path, json={"model": "m", **body, key: _WRONG[cls]})
        assert r.status_code == 400, r.text
        assert r.json() == {
            "error": f'"{key}" must be {what}, not {json.dumps(_WRONG[cls])} — e.g. {example}'
        }
        assert gw.model("m").in_flight == 0
        if kind != "embed":  # (the FAKE llama-server has no embeddings route)
            right = await gw.client.post(path, json={"model": "m", **body, "stream": False})
            assert right.status_code == 200, right.text  # the same request, well typed, is served
