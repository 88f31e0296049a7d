"""``rerank = true`` and ``tools``, against the FAKE llama-server (it answers ``/v1/rerank`` when
started with ``--reranking`` and reports ``chat_template_caps`` in ``/props`` on command; no small
reranker GGUF ships in a package, so the real reranking itself is not run here).

A reranker answers the rerank routes only: a chat or completion request to it, in any dialect, is
a 400 naming the key before it is queued, and a rerank request to a model that does not rerank is
too. ``tools = false`` takes ``tools`` out of every listing's capabilities and refuses tool
requests; left out, a running child's ``/props`` decides (the template it really renders)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmforge_supervisor.supervisor import ModelState
from tests.gateway_fast.conftest import Serve
from tests.support.gateway import Gateway, poll
from tests.support.tiny_gguf import TOOLS_TEMPLATE, write_tiny_gguf

pytestmark = pytest.mark.anyio

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


async def _caps(gw: Gateway, name: str) -> list[str]:
    data = (await gw.client.get("/v1/models")).json()["data"]
    (entry,) = [m for m in data if m["id"] == name]
    caps: list[str] = entry["capabilities"]
    return caps


async def test_a_reranker_answers_rerank_routes_and_refuses_chat_naming_the_key(serve: Serve) -> None:
    async with serve({"rr": {"rerank": True, "preload": True}, "chat": {"preload": True}}) as gw:
        plan = gw.model("rr").plan
        assert plan is not None and "--reranking" in plan.spec.extra_args
        ask = {"model": "rr", "query": "q", "documents": ["a", "b", "c"], "top_n": 2}
        for path in ("/v1/rerank", "/rerank", "/v1/reranking"):
            r = await gw.client.post(path, json=ask)
            assert r.status_code == 200, (path, r.text)
            assert [x["index"] for x in r.json()["results"]] == [0, 1, 2]
        tei = await gw.client.post("/rerank", json={"model": "rr", "query": "q", "texts": ["a"]})
        assert tei.status_code == 200, tei.text

        chat = {"model": "rr", "messages": [{"role": "user", "content": "hi"}]}
        r = await gw.client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "rerank = true" in message and "'rr'" in message and "/v1/rerank" in message
        r = await gw.client.post("/v1/chat/completions", json={**chat, "tools": [TOOL]})
        assert r.status_code == 400 and "is a reranker" in r.json()["error"]["message"], r.text
        r = await gw.client.post("/v1/messages", json={**chat, "max_tokens": 4})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert "rerank = true" in r.json()["error"]["message"]
        r = await gw.client.post("/api/chat", json={**chat, "stream": False})
        assert r.status_code == 400 and "rerank = true" in r.json()["error"], r.text

        r = await gw.client.post("/v1/rerank", json={**ask, "model": "chat"})
        assert r.status_code == 400, r.text
        assert "does not rerank" in r.json()["error"]["message"]
        assert "rerank = true" in r.json()["error"]["message"]

        assert await _caps(gw, "rr") == ["rerank"]
        assert "completion" in await _caps(gw, "chat")


async def test_tools_false_hides_the_capability_and_refuses_tool_requests(
    serve: Serve, tmp_path: Path
) -> None:
    tools_gguf = write_tiny_gguf(tmp_path / "tools.gguf", chat_template=TOOLS_TEMPLATE)
    models = {"off": {"path": tools_gguf, "tools": False}, "on": {"path": tools_gguf}}
    async with serve(models) as gw:
        assert "tools" not in await _caps(gw, "off")
        assert "tools" in await _caps(gw, "on")
        show = (await gw.client.post("/api/show", json={"model": "off"})).json()
        assert "tools" not in show["capabilities"] and "completion" in show["capabilities"]
        assert "tools" in (await gw.client.post("/api/show", json={"model": "on"})).json()["capabilities"]
        body = {"model": "off", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
        r = await gw.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert "tools = false" in r.json()["error"]["message"]


async def test_a_running_childs_template_decides_tools(serve: Serve, tmp_path: Path) -> None:
    """Before its load the GGUF's template says (the tiny model's has no tools; the tools one
    has); once ready, the child's ``/props`` ``chat_template_caps`` does (a user's
    ``--chat-template-file`` with tools, or one without)."""
    tools_gguf = write_tiny_gguf(tmp_path / "tools.gguf", chat_template=TOOLS_TEMPLATE)
    models = {
        "gains": {"args": ["--fake-tools-caps", "1"]},
        "loses": {"path": tools_gguf, "args": ["--fake-tools-caps", "0"]},
    }
    async with serve(models) as gw:
        assert "tools" not in await _caps(gw, "gains")
        assert "tools" in await _caps(gw, "loses")
        for name in models:
            assert (await gw.client.post(f"/api/models/{name}/load")).status_code < 300
        await poll(lambda: all(gw.model(n).state == ModelState.READY for n in models), what="both ready")
        assert "tools" in await _caps(gw, "gains")
        assert "tools" not in await _caps(gw, "loses")
        show = (await gw.client.post("/api/show", json={"model": "gains"})).json()
        assert "tools" in show["capabilities"]
