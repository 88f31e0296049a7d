"""The model routes' table against the real llama-server: every route with an end marker, streamed
through `forge serve`, ends with that marker, and its length column is the field the child
honours (a whole answer bounded by it is that long). The gateway reports a stream that ends
without its route's marker as cut, so a wrong marker in the table would turn every complete
stream of that route into an error: the loop runs over the table, so a route added with a marker
(or a length) is checked the day it is added.

One module-scoped service on the tiny random-weight GGUF (it never stops early: ``ignore_eos``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rocmforge_supervisor.service.core._routes import FORWARDED, ForwardRoute
from tests.support.service import Service, chat_and_plain_models, running_service, write_config

HELLO = [{"role": "user", "content": "Hello"}]
#: A body per kind of generating route (the model and the length are added per route).
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": HELLO},
    "/chat/completions": {"messages": HELLO},
    "/v1/completions": {"prompt": "Hello"},
    "/completions": {"prompt": "Hello"},
    "/completion": {"prompt": "Hello"},
    "/v1/responses": {"input": "Hello"},
    "/responses": {"input": "Hello"},
    "/v1/messages": {"messages": HELLO},
    "/infill": {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n"},
}
#: The audio upload routes have their own tests (tests/gateway/test_whisper.py): a form, not JSON.
GENERATING = [r for r in FORWARDED if r.model_from == "json" and (r.end_marker or r.length)]
N = 5


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("route-table")
    with running_service(
        write_config(d / "forge.toml", chat_and_plain_models(d)), d / "state", llama_server_bin
    ) as s:
        yield s


def _body(route: ForwardRoute, *, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "chat", "ignore_eos": True, "temperature": 0, **BODIES[route.path]}
    assert route.length is not None
    body[route.length] = N
    if stream:
        body["stream"] = True
    return body


def test_every_generating_route_has_a_body_here() -> None:
    assert {r.path for r in GENERATING} == set(BODIES), "add a body for the new route to BODIES"
    assert all(r.length for r in GENERATING), "a route with an end marker generates: give it its length"


@pytest.mark.parametrize("route", [r for r in GENERATING if r.end_marker], ids=lambda r: r.path)
def test_a_complete_stream_of_the_route_ends_with_its_marker(svc: Service, route: ForwardRoute) -> None:
    assert route.end_marker is not None
    with (
        httpx.Client(base_url=svc.url, timeout=60) as c,
        c.stream("POST", route.path, json=_body(route, stream=True)) as r,
    ):
        assert r.status_code == 200, r.read()
        data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert data, f"{route.path}: no event"
    assert route.end_marker in data[-1].encode(), (route.path, data[-3:])
    # and nothing the gateway adds: no error event in a complete stream
    assert not any('"error"' in d for d in data), (route.path, data[-3:])


def _tokens(route: ForwardRoute, answer: dict[str, Any]) -> int:
    """The tokens the answer says it generated, in its route's own terms."""
    if "tokens_predicted" in answer:  # llama-server's native /completion and /infill
        return int(answer["tokens_predicted"])
    usage = answer["usage"]
    for field in ("completion_tokens", "output_tokens"):  # OpenAI's; Anthropic's and Responses'
        if field in usage:
            return int(usage[field])
    raise AssertionError(f"{route.path}: no token count in {json.dumps(answer)[:300]}")


@pytest.mark.parametrize("route", GENERATING, ids=lambda r: r.path)
def test_the_length_column_is_the_field_the_child_honours(svc: Service, route: ForwardRoute) -> None:
    with httpx.Client(base_url=svc.url, timeout=60) as c:
        r = c.post(route.path, json=_body(route, stream=False))
    assert r.status_code == 200, r.text
    assert _tokens(route, r.json()) == N, (route.path, route.length)
