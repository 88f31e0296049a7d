"""Priority classes through the whole request path, in-process against the FAKE llama-server:
a request's class comes from its key's ``priority`` or a lowering ``X-Priority`` header, and the
model's admission queue hands a freed slot to the highest class, round robin between keys. The
test holds the model's one slot itself (through its admission queue), queues HTTP requests in a
known order, frees the slot and reads the order in which the answers came."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.gateway_fast.conftest import Serve
from tests.support.gateway import Gateway, poll

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "a", "key": "sk-a"},
    {"name": "b", "key": "sk-b"},
    {"name": "c", "key": "sk-c", "priority": "background"},
    {"name": "night", "key": "sk-night", "priority": "batch"},
]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _headers(key: str, priority: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer sk-{key}"}
    if priority is not None:
        h["X-Priority"] = priority
    return h


async def test_a_freed_slot_goes_to_the_highest_class_then_round_robin_between_keys(serve: Serve) -> None:
    async with serve({"m": {"preload": True, "max_concurrency": 1}}, server={"keys": KEYS}) as gw:
        m = gw.model("m")
        await poll(lambda: m.state.value == "ready", what="m ready")
        await m.admission.take("interactive", "holder")  # the one slot, held by the test
        order: list[str] = []
        sent = [
            ("c", None, "c-background"),  # its key's class
            ("a", "batch", "a-batch-1"),  # lowered by the header
            ("a", "batch", "a-batch-2"),
            ("night", None, "night-batch"),
            ("a", None, "a-interactive-1"),
            ("a", None, "a-interactive-2"),
            ("b", "interactive", "b-interactive"),
        ]
        async with anyio.create_task_group() as tg:
            for n, (key, prio, tag) in enumerate(sent, start=1):
                tg.start_soon(_send, gw, key, prio, tag, order)
                await poll(lambda n=n: m.waiting == n, what=f"{tag} queued")  # type: ignore[misc]
            metrics = (await gw.client.get("/metrics", headers=_headers("a"))).text
            assert 'forge_model_waiting_class{class="batch",model="m"} 3.0' in metrics
            assert 'forge_model_waiting_class{class="interactive",model="m"} 3.0' in metrics
            assert 'forge_model_waiting_class{class="background",model="m"} 1.0' in metrics
            status = (await gw.client.get("/api/models", headers=_headers("a"))).json()["models"][0]
            assert status["queue"]["waiting"] == {"interactive": 3, "batch": 3, "background": 1}
            assert status["queue"]["waiting_by_key"] == {"a": 4, "b": 1, "c": 1, "night": 1}
            m.admission.give("interactive", "holder")
    assert order == [
        "a-interactive-1",
        "b-interactive",
        "a-interactive-2",
        "a-batch-1",
        "night-batch",
        "a-batch-2",
        "c-background",
    ]


async def _send(gw: Gateway, key: str, prio: str | None, tag: str, order: list[str]) -> None:
    r = await gw.client.post("/v1/chat/completions", json=BODY, headers=_headers(key, prio), timeout=30)
    assert r.status_code == 200, r.text
    order.append(tag)


@pytest.mark.parametrize(
    ("key", "header", "status", "says"),
    [
        ("night", "interactive", 403, "'night' may not raise its requests to 'interactive'"),
        ("c", "batch", 403, "its priority is 'background'"),
        ("a", "urgent", 400, "'urgent' is not a priority class"),
    ],
)
async def test_the_header_is_honoured_only_downward(
    serve: Serve, key: str, header: str, status: int, says: str
) -> None:
    async with serve({"m": {"preload": True}}, server={"keys": KEYS}) as gw:
        r = await gw.client.post("/v1/chat/completions", json=BODY, headers=_headers(key, header))
        assert r.status_code == status, r.text
        error: dict[str, Any] = r.json()["error"]
        assert says in error["message"]
        ok = await gw.client.post("/v1/chat/completions", json=BODY, headers=_headers(key, "background"))
        assert ok.status_code == 200, ok.text


async def test_the_activity_log_records_the_class(serve: Serve) -> None:
    async with serve({"m": {"preload": True}}, server={"keys": KEYS}) as gw:
        for key, prio in (("a", None), ("a", "batch"), ("night", None)):
            r = await gw.client.post("/v1/chat/completions", json=BODY, headers=_headers(key, prio))
            assert r.status_code == 200, r.text
        # The Ollama dialect goes through the same forwarder: the same class rule.
        ollama = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        r = await gw.client.post("/api/chat", json=ollama, headers=_headers("night", "background"))
        assert r.status_code == 200, r.text
        store = gw.state.recorder.store
        assert store is not None

        def rows() -> list[dict[str, Any]]:
            return store.rows(limit=10)

        found = await poll(lambda: len(rows()) == 4 and rows(), what="four activity rows")
        assert isinstance(found, list)
        assert [(r["key"], r["priority"]) for r in reversed(found)] == [
            ("a", "interactive"),
            ("a", "batch"),
            ("night", "batch"),
            ("night", "background"),
        ]
        assert all(r["queue_wait"] is not None for r in found)


async def test_an_admin_key_may_raise_its_class(serve: Serve) -> None:
    keys = [*KEYS, {"name": "ops", "key": "sk-ops", "admin": True, "priority": "background"}]
    async with serve({"m": {"preload": True}}, server={"keys": keys}) as gw:
        r = await gw.client.post("/v1/chat/completions", json=BODY, headers=_headers("ops", "interactive"))
        assert r.status_code == 200, r.text
