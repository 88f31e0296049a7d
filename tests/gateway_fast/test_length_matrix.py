"""An answer's length, over every forwarded route of the route table (``_routes.FORWARDED``) and
Ollama's: a variant's forced length caps the request in the route's own field whatever spelling
the request used (llama-server reads ``n_predict`` before ``max_tokens``), a variant's or the
model's default applies only when the request sends none, and a route that generates no text gets
none. What the child is sent is read off the one forwarder (``_forwarder.open_upstream``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from rocmforge_supervisor.service.core._names import LENGTH_FIELD, LENGTHS, length_field, lengths_read
from rocmforge_supervisor.service.core._routes import FORWARDED
from rocmforge_supervisor.service.proxy import _forwarder
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import HELLO

pytestmark = pytest.mark.anyio

#: Model ``x``: a forced length (OpenAI's spelling), a forced length in llama-server's own
#: spelling, a default; and the model's own ``max_tokens`` default under them.
MODELS: dict[str, dict[str, Any]] = {
    "x": {
        "max_tokens": 9,
        "variants": {
            "capped": {"force": {"max_tokens": 5}},
            "native": {"force": {"n_predict": 5}},
            "roomy": {"defaults": {"max_tokens": 7}},
            "loose": {"strip": ["max_tokens"]},
        },
    }
}

#: One body every JSON route takes (each route reads the fields it knows).
BODY: dict[str, Any] = {
    "messages": HELLO,
    "prompt": "Hi",
    "input": "Hi",
    "input_prefix": "def f(",
    "input_suffix": ")",
    "content": "Hi",
    "tokens": [1, 2],
    "query": "q",
    "documents": ["a", "b"],
}

JSON_ROUTES = [r.path for r in FORWARDED if r.method == "POST" and r.model_from == "json"]
GENERATING = [p for p in JSON_ROUTES if length_field(p) is not None]
QUIET = [p for p in JSON_ROUTES if length_field(p) is None]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """(upstream path, body) of every request the forwarder sends to a child."""
    seen: list[tuple[str, dict[str, Any]]] = []
    real = _forwarder.open_upstream

    def spy(st: Any, name: str, method: str, path: str, body: bytes, rid: str | None, **kw: Any) -> Any:
        seen.append((path, json.loads(body) if body else {}))
        return real(st, name, method, path, body, rid, **kw)

    monkeypatch.setattr(_forwarder, "open_upstream", spy)
    yield seen


@contextmanager
def _one(sent: list[tuple[str, dict[str, Any]]]) -> Iterator[list[dict[str, Any]]]:
    """The bodies sent during the block."""
    start = len(sent)
    bodies: list[dict[str, Any]] = []
    yield bodies
    bodies += [b for _, b in sent[start:]]


def _lengths(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in LENGTHS if k in body}


def test_every_forwarded_route_is_classified() -> None:
    """A route added to the table must say whether it generates text, and in which field."""
    assert {r.path for r in FORWARDED} <= set(LENGTH_FIELD)
    assert GENERATING, "no forwarded route generates text?"
    assert length_field("/completion") == "n_predict" and length_field("/v1/messages") == "max_tokens"


async def test_a_forced_length_caps_every_generating_route_in_its_own_field(
    serve: Serve, sent: list[tuple[str, dict[str, Any]]]
) -> None:
    asked_all = dict.fromkeys(LENGTHS, 30)
    async with serve(MODELS) as gw:
        for path in GENERATING:
            field = length_field(path)
            for name in ("x:capped", "x:native"):
                for asked in [asked_all, *({k: 30} for k in LENGTHS)]:
                    with _one(sent) as bodies:
                        await gw.client.post(path, json={**BODY, **asked, "model": name})
                    assert bodies, (path, name, "nothing was sent")
                    assert _lengths(bodies[0]) == {field: 5}, (path, name, asked, bodies[0])

        # the reported case, end to end: llama-server (and the fake) read n_predict first
        r = await gw.client.post("/completion", json={"model": "x:capped", "prompt": "Hi", "n_predict": 30})
        assert r.status_code == 200, r.text
        assert r.json()["tokens_predicted"] == 5, r.text


async def test_a_default_length_applies_only_when_the_request_sends_none(
    serve: Serve, sent: list[tuple[str, dict[str, Any]]]
) -> None:
    async with serve(MODELS) as gw:
        for path in GENERATING:
            field = length_field(path)
            # the variant's default, over the model's (9); the model's for the model itself
            for name, default in (("x:roomy", 7), ("x", 9), ("x:loose", 9)):
                with _one(sent) as bodies:
                    await gw.client.post(path, json={**BODY, "model": name})
                assert bodies and _lengths(bodies[0]) == {field: default}, (path, name, bodies)
                # the request's own value, in any spelling, wins (none is added beside it)
                for key in LENGTHS:
                    with _one(sent) as bodies:
                        await gw.client.post(path, json={**BODY, key: 30, "model": name})
                    if name == "x:loose":  # a stripped length goes in every spelling
                        expected = {field: 9}  # then the model's default applies
                    elif key in lengths_read(path):
                        expected = {key: 30}
                    else:  # a spelling the route ignores (Anthropic reads max_tokens only)
                        expected = {key: 30, field: default}
                    assert bodies and _lengths(bodies[0]) == expected, (path, name, key, bodies)


async def test_a_route_that_generates_nothing_gets_no_length(
    serve: Serve, sent: list[tuple[str, dict[str, Any]]]
) -> None:
    async with serve(MODELS) as gw:
        for path in QUIET:
            for name in ("x", "x:capped", "x:roomy"):
                with _one(sent) as bodies:
                    await gw.client.post(path, json={**BODY, "model": name})
                for body in bodies:  # a route the model does not serve is refused before sending
                    assert not _lengths(body), (path, name, body)


@pytest.mark.parametrize(
    ("path", "extra", "upstream", "field"),
    [
        ("/api/chat", {"messages": HELLO}, "/v1/chat/completions", "max_tokens"),
        ("/api/generate", {"prompt": "Hi"}, "/v1/chat/completions", "max_tokens"),
        ("/api/generate", {"prompt": "Hi", "raw": True}, "/completion", "n_predict"),
        ("/api/generate", {"prompt": "def f(", "suffix": ")"}, "/infill", "n_predict"),
    ],
)
async def test_ollama_num_predict_is_capped_and_defaulted_the_same_way(
    serve: Serve,
    sent: list[tuple[str, dict[str, Any]]],
    path: str,
    extra: dict[str, Any],
    upstream: str,
    field: str,
) -> None:
    async with serve(MODELS) as gw:
        cases = [
            ("x:capped", {"num_predict": 30}, 5),
            ("x:native", {"num_predict": 30}, 5),
            ("x:roomy", {}, 7),
            ("x:roomy", {"num_predict": 30}, 30),
            ("x", {}, 9),
        ]
        for name, options, expected in cases:
            with _one(sent) as bodies:
                await gw.client.post(path, json={**extra, "model": name, "stream": False, "options": options})
            assert [p for p, _ in sent[-len(bodies) :]] == [upstream] * len(bodies) and bodies, (name, sent)
            assert _lengths(bodies[0]) == {field: expected}, (path, name, options, bodies[0])
