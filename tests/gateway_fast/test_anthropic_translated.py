"""``/v1/messages`` to a command model whose server speaks only OpenAI chat, at the gateway: the
ingress checks run once in Anthropic's terms (the key's models, a variant's rules, the length)
before the request is translated, and the child's errors come back in Anthropic's shape, whole or
mid-stream. The command is the FAKE llama-server with ``routes = ["/v1/chat/completions"]``.
(The anthropic SDK against `forge serve`: tests/gateway/test_anthropic_on_openai_command.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import chat, error_of, stream_error

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "scoped", "key": "scoped-secret", "models": ["oai"]},
    {"name": "root", "key": "root", "admin": True},
]


def _command(fake_bin: Path, *flags: str, **keys: Any) -> dict[str, Any]:
    cmd = [str(fake_bin), "--host", "${HOST}", "--port", "${PORT}", *flags]
    return {"backend": "command", "cmd": cmd, "routes": ["/v1/chat/completions"], "gpu": "cpu", **keys}


def _events(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]


async def test_checks_run_before_the_translation(serve: Serve, fake_bin: Path) -> None:
    variants = {"terse": {"force": {"max_tokens": 2}, "system": "Be terse."}}
    models = {"oai": _command(fake_bin, variants=variants), "other": _command(fake_bin)}
    async with serve(models, server={"keys": KEYS}) as gw:
        scoped = {"x-api-key": "scoped-secret"}
        path, body = chat("anthropic", "other", stream=False)
        r = await gw.client.post(path, json=body, headers=scoped)
        assert r.status_code == 403, r.text
        error_of("anthropic", r.json())

        body = {"model": "oai", "messages": [{"role": "user", "content": "Hi"}]}
        r = await gw.client.post(path, json=body, headers=scoped)  # no max_tokens: Anthropic's 400
        assert r.status_code == 400 and "max_tokens" in error_of("anthropic", r.json())[0], r.text

        body = {"model": "oai:terse", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]}
        r = await gw.client.post(path, json=body, headers=scoped)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["type"] == "message" and answer["model"] == "oai:terse"
        assert answer["content"] == [{"type": "text", "text": "tok tok tok"}]
        assert answer["usage"] == {"input_tokens": 2, "output_tokens": 3}
        assert not gw.model("other").running

        # Images: a command's server decides what it takes; the URL rules hold as on every route.
        image = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        }
        content = [image, {"type": "text", "text": "What is it?"}]
        body = {"model": "oai", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
        r = await gw.client.post(path, json=body, headers=scoped)
        assert r.status_code == 200, r.text
        image["source"] = {"type": "url", "url": "http://169.254.169.254/latest"}
        r = await gw.client.post(path, json=body, headers=scoped)
        assert r.status_code == 400 and "remote image" in error_of("anthropic", r.json())[0], r.text


async def test_a_childs_error_is_anthropics_whole_and_streamed(serve: Serve, fake_bin: Path) -> None:
    models = {
        "bad": _command(fake_bin, "--fake-error", "500"),
        "dies": _command(fake_bin, "--fake-die-mid-stream", "1"),
    }
    async with serve(models) as gw:
        path, body = chat("anthropic", "bad", stream=False)
        r = await gw.client.post(path, json=body)
        assert r.status_code >= 500
        assert "fake failure" in error_of("anthropic", r.json())[0]

        path, body = chat("anthropic", "dies", stream=True)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200
        assert [e["type"] for e in _events(r.content)][:1] == ["message_start"]
        assert stream_error("anthropic", r.content)
        assert "message_stop" not in [e["type"] for e in _events(r.content)]


async def test_a_streamed_answer_is_anthropics_event_sequence(serve: Serve, fake_bin: Path) -> None:
    async with serve({"oai": _command(fake_bin)}) as gw:
        path, body = chat("anthropic", "oai", stream=True)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        kinds = [e["type"] for e in _events(r.content)]
        assert kinds == [
            "message_start",
            "content_block_start",
            *["content_block_delta"] * 3,
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        assert _events(r.content)[-2]["usage"] == {"input_tokens": 2, "output_tokens": 3}
