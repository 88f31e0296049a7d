"""What a key that is not an admin may do through a model request: use its models, and change
nothing but its own request. Ollama's ``keep_alive`` sets a model's TTL for every tenant (and
``0`` unloads it), so only an admin key's applies; llama-server's own state-changing routes are
not forwarded at all. A request refused for what its key may do costs it no budget, and a
rate-limited request's activity row names the model it asked for. Against the FAKE llama-server.
"""

from __future__ import annotations

from typing import Any

import pytest

from rocmforge_supervisor.supervisor import ModelState
from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import HELLO
from tests.support.gateway import Gateway, poll

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "alice", "key": "alice-secret", "models": ["m"]},
    {"name": "root", "key": "root-secret", "admin": True},
]
ALICE = {"Authorization": "Bearer alice-secret"}
ROOT = {"Authorization": "Bearer root-secret"}


def _chat(model: str = "m", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": HELLO, "stream": False, **extra}


async def test_keep_alive_zero_from_a_key_that_is_not_an_admin_is_a_403_and_the_model_stays(
    serve: Serve,
) -> None:
    async with serve({"m": {"preload": True}}, server={"keys": KEYS}) as gw:
        for path, body in (
            ("/api/generate", {"model": "m", "keep_alive": 0}),  # Ollama's idiom for "unload"
            ("/api/chat", {"model": "m", "messages": [], "keep_alive": 0}),
            ("/api/chat", _chat(keep_alive=0)),  # with a prompt: served, then unloaded
            ("/api/generate", {"model": "m", "prompt": "Hi", "stream": False, "keep_alive": "0s"}),
            ("/api/embed", {"model": "m", "input": "Hi", "keep_alive": 0}),
        ):
            r = await gw.client.post(path, json=body, headers=ALICE)
            assert r.status_code == 403, (path, body, r.text)
            error = r.json()["error"]  # Ollama's shape: a string
            assert isinstance(error, str) and "'alice'" in error and "admin key" in error, error
            assert "keep_alive" in error and "alice-secret" not in error
        assert gw.model("m").state == ModelState.READY and gw.model("m").ttl_hint is None

        # An admin key's keep_alive: 0 unloads, as Ollama does.
        r = await gw.client.post("/api/generate", json={"model": "m", "keep_alive": 0}, headers=ROOT)
        assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
        assert gw.model("m").state != ModelState.READY


async def test_a_ttl_hint_from_a_key_that_is_not_an_admin_is_ignored_and_its_request_served(
    serve: Serve,
) -> None:
    async with serve({"m": {"preload": True}}, server={"keys": KEYS}) as gw:
        for keep_alive in ("1h", -1, 5):
            r = await gw.client.post("/api/chat", json=_chat(keep_alive=keep_alive), headers=ALICE)
            assert r.status_code == 200 and r.json()["done"], r.text
            assert gw.model("m").ttl_hint is None, keep_alive
        # An admin key's hint applies (and a later request of another key does not clear it).
        r = await gw.client.post("/api/chat", json=_chat(keep_alive="1h"), headers=ROOT)
        assert r.status_code == 200 and gw.model("m").ttl_hint == 3600
        r = await gw.client.post("/api/chat", json=_chat(), headers=ALICE)
        assert r.status_code == 200 and gw.model("m").ttl_hint == 3600


async def test_llama_servers_state_changing_routes_are_not_forwarded_for_any_key(serve: Serve) -> None:
    """``POST /props``, slot save/restore/erase, LoRA hot-swap, the router's load/unload and the
    reasoning control would change a child for every tenant: the gateway has no such route."""
    async with serve({"m": {"preload": True}}, server={"keys": KEYS}) as gw:
        for path in (
            "/props?model=m",
            "/slots?model=m",
            "/slots/0?action=erase&model=m",
            "/lora-adapters?model=m",
            "/models/load",
            "/models/unload",
            "/v1/chat/completions/control",
        ):
            for headers in (ALICE, ROOT):
                r = await gw.client.post(path, json={"model": "m", "id_slot": 0}, headers=headers)
                assert r.status_code in (404, 405), (path, r.status_code, r.text)
                assert "no route" in r.text or "not allowed" in r.text, r.text
        assert gw.model("m").state == ModelState.READY


async def test_a_403_does_not_count_against_requests_per_minute(serve: Serve) -> None:
    keys = [{**KEYS[0], "requests_per_minute": 1}, KEYS[1]]
    async with serve({"m": {"preload": True}, "n": {}}, server={"keys": keys}) as gw:
        for _ in range(3):  # a model it may not use: 403, and the minute stays unused
            r = await gw.client.post("/v1/chat/completions", json=_chat("n"), headers=ALICE)
            assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
            r = await gw.client.post("/api/chat", json=_chat(keep_alive=0), headers=ALICE)
            assert r.status_code == 403
        r = await gw.client.post("/v1/chat/completions", json=_chat(), headers=ALICE)
        assert r.status_code == 200, r.text
        over = await gw.client.post("/v1/chat/completions", json=_chat(), headers=ALICE)
        assert over.status_code == 429 and "1 requests per minute" in over.json()["error"]["message"]
        rows = await _rows(gw, 3 * 2 + 2)
        assert [(r["status"], r["model"]) for r in rows[:2]] == [(429, "m"), (200, "m")]
        assert {r["model"] for r in rows if r["status"] == 403} == {"n", "m"}


async def _rows(gw: Gateway, count: int) -> list[dict[str, Any]]:
    """The activity log's newest rows once it holds ``count`` (its writer is a thread)."""

    store = gw.state.recorder.store
    assert store is not None
    await poll(lambda: len(store.rows(limit=100)) >= count, what=f"{count} activity rows")
    r = await gw.client.get("/api/activity", params={"limit": 100}, headers=ROOT)
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["activity"]
    return rows
