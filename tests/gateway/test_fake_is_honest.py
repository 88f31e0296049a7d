"""The fake llama-server against the real one, through the same in-process gateway: the stream
shapes the fast tests rely on (each dialect's events and end marker, a client that leaves
mid-stream) must be the real server's. Where they differ, the fake is what gets fixed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_fast.dialects import DIALECTS, Dialect, chat
from tests.support.gateway import poll, serving
from tests.support.supervised import fake_config

pytestmark = pytest.mark.anyio


def _shape(dialect: Dialect, data: bytes) -> list[str]:
    """A stream's events as kinds, runs of the same kind folded, and how it says it finished:
    what a client's parser sees."""
    kinds: list[str] = []
    if dialect == "ollama":
        for line in data.splitlines():
            obj = json.loads(line)
            kinds.append(f"done: {obj['done_reason']}" if obj["done"] else "chunk")
    else:
        for event in data.strip().split(b"\n\n"):
            head, _, payload = event.rpartition(b"data: ")
            if payload == b"[DONE]":
                kinds.append("[DONE]")
                continue
            obj = json.loads(payload)
            if dialect == "anthropic":
                stop = obj.get("delta", {}).get("stop_reason")
                kinds.append(head.strip().removeprefix(b"event: ").decode() + (f": {stop}" if stop else ""))
            else:
                finish = obj["choices"][0]["finish_reason"]
                kinds.append(f"finish: {finish}" if finish else "chunk")
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_fake_streams_each_dialect_as_the_real_server_does(
    dialect: Dialect, tmp_path: Path, tiny_gguf: Path, fake_bin: Path, llama_server_bin: Path
) -> None:
    shapes = {}
    for name, binary in (("fake", fake_bin), ("real", llama_server_bin)):
        model = {"preload": True, "ctx_size": 512, "parallel": 1, "max_tokens": 3}
        config = fake_config(tmp_path / name, tiny_gguf, {"m": model}, server={"sse_keepalive": 0})
        async with serving(config, binary) as gw:
            path, body = chat(dialect, "m", stream=True)
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, (name, r.text)
            shapes[name] = (r.headers["content-type"].split(";")[0], _shape(dialect, r.content))
            whole = await gw.client.post(path, json={**body, "stream": False})
            assert whole.status_code == 200, (name, whole.text)
            shapes[name] += (_answer(dialect, whole.json()),)
    assert shapes["fake"] == shapes["real"]


def _answer(dialect: Dialect, body: dict[str, Any]) -> tuple[object, ...]:
    """A whole answer's keys a client reads: the finish reason and the usage's names."""
    if dialect == "ollama":
        return body["done_reason"], "prompt_eval_count" in body, "eval_count" in body
    if dialect == "anthropic":
        return body["stop_reason"], sorted(body["usage"]), body["content"][0]["type"]
    return body["choices"][0]["finish_reason"], sorted(body["usage"])


async def test_the_real_server_also_frees_the_slot_of_a_client_that_leaves(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """What the fast cancellation tests assume of the child: a closed stream ends its request
    (the real one cancels its task), and the gateway's slot comes back."""
    model = {"preload": True, "ctx_size": 512, "parallel": 1, "max_concurrency": 1, "queue": 0}
    config = fake_config(tmp_path, tiny_gguf, {"m": model})
    async with serving(config, llama_server_bin) as gw:
        path, body = chat("openai", "m", stream=True)
        async with gw.client.stream("POST", path, json={**body, "max_tokens": 400}) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_raw():
                if b'"content"' in chunk:
                    break
        await poll(lambda: gw.model("m").in_flight == 0, what="the slot back")
        again = await gw.client.post(path, json={**body, "stream": False, "max_tokens": 2})
        assert again.status_code == 200, again.text
