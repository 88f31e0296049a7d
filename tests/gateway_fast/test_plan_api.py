"""``GET /api/plan`` of a running service (the FAKE llama-server): the loaded model's row is what
its load decided (the ``auto`` context its child was started with), the others are placed beside
it as a load now would, and a scoped key sees its models only, with no other name anywhere."""

from __future__ import annotations

import pytest

from tests.gateway_fast.conftest import Serve
from tests.support.tiny_gguf import TINY_N_CTX

pytestmark = pytest.mark.anyio

KEYS = [
    {"name": "alice", "key": "alice-secret", "models": ["chat"]},
    {"name": "root", "key": "root-secret", "admin": True},
]
ALICE = {"Authorization": "Bearer alice-secret"}
ROOT = {"Authorization": "Bearer root-secret"}


async def test_the_plan_of_a_running_service(serve: Serve) -> None:
    models = {
        "chat": {"preload": True, "ctx_size": "auto", "parallel": 2},
        "hidden-7b": {"ctx_size": 1024},
    }
    groups = {"pair": {"members": ["chat", "hidden-7b"], "max_loaded": 1}}
    async with serve(models, server={"keys": KEYS}, groups=groups) as gw:
        plan = gw.model("chat").plan
        assert plan is not None and plan.decision.context is not None
        chosen = plan.decision.context
        assert chosen.per_request == TINY_N_CTX  # the trained context (ctx_min 2048 is not below it)
        assert plan.spec.ctx_size == chosen.ctx_size

        r = await gw.client.get("/api/plan", headers=ROOT)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["start_from"] == "running" and body["loaded"] == ["chat"]
        rows = {m["name"]: m for m in body["models"]}
        assert rows["chat"]["state"] == "loaded"
        assert rows["chat"]["context"]["ctx_size"] == chosen.ctx_size
        assert rows["chat"]["ctx_per_request"] == TINY_N_CTX
        assert rows["chat"]["estimate"]["kv_bytes"] > 0
        hidden = rows["hidden-7b"]
        assert hidden["state"] == "on request" and hidden["evict"] == ["chat"]
        assert hidden["ctx_size"] == 1024
        assert [t["models"] for t in body["cannot_load_together"]] == [["chat", "hidden-7b"]]
        assert [d["key"] for d in body["devices"]] == ["cpu"]

        # /api/models says the same context, and that auto chose it
        status = (await gw.client.get("/api/models", headers=ROOT)).json()["models"]
        context = next(m for m in status if m["name"] == "chat")["context"]
        assert context["per_request"] == TINY_N_CTX and context["auto"]["limit"] == "trained"

        scoped = await gw.client.get("/api/plan", headers=ALICE)
        assert scoped.status_code == 200, scoped.text
        assert [m["name"] for m in scoped.json()["models"]] == ["chat"]
        assert "hidden-7b" not in scoped.text

        assert (await gw.client.get("/api/plan")).status_code == 401
