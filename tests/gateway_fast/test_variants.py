"""Variants (``[models.X.variants.Y]``) and LoRA adapters (``[models.X.adapters.NAME]``) served as
``X:Y`` by X's one child, against the FAKE llama-server (the body rewrite itself is checked on
plain dicts in tests/service/test_names.py, and on the real server in tests/gateway/test_variants_real.py):
every dialect finds the name, every listing shows it with its parent, a key may be scoped to one,
and the activity log and metrics record the name asked with the model that served it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_fast.conftest import Serve
from tests.gateway_fast.dialects import DIALECTS, Dialect, chat
from tests.support.gateway import poll
from tests.support.lora import write_lora
from tests.support.supervised import fake_config

pytestmark = pytest.mark.anyio

VARIANTS = {
    "json": {"defaults": {"temperature": 0.2}, "force": {"max_tokens": 16}, "system": "Answer in JSON."},
    "tuned-json": {"adapter": "tuned"},
}


def _models(tmp_path: Path, tiny_gguf: Path, **extra: Any) -> dict[str, dict[str, Any]]:
    lora = write_lora(tmp_path / "tuned.gguf", tiny_gguf, targets=("attn_q",))
    return {
        "x": {"preload": True, "variants": VARIANTS, "adapters": {"tuned": {"path": str(lora)}}, **extra},
        "y": {},
    }


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_dialect_serves_a_variant_and_an_adapter_from_the_one_child(
    serve: Serve, tmp_path: Path, tiny_gguf: Path, dialect: Dialect
) -> None:
    async with serve(_models(tmp_path, tiny_gguf)) as gw:
        x = gw.model("x")
        plan = x.plan
        assert plan is not None
        args = plan.spec.extra_args
        assert args[args.index("--lora-scaled") + 1] == f"{tmp_path / 'tuned.gguf'}:0"
        assert "--lora-init-without-apply" in args
        pid = x.server.pid if x.server else None
        for name in ("x:json", "x:tuned", "x:tuned-json", "x:json:latest"):
            path, body = chat(dialect, name, stream=False)
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, (name, r.text)
        assert x.server is not None and x.server.pid == pid  # no second load, no restart
        assert not gw.model("y").running  # and no other child
        assert x.requests_total == 4

        path, body = chat(dialect, "x:nope", stream=False)
        r = await gw.client.post(path, json=body)
        assert r.status_code == 404, r.text
        assert "x:nope" in r.text


async def test_listings_show_variants_and_adapters_with_their_parent(
    serve: Serve, tmp_path: Path, tiny_gguf: Path
) -> None:
    async with serve(_models(tmp_path, tiny_gguf)) as gw:
        v1 = (await gw.client.get("/v1/models")).json()["data"]
        assert [(m["id"], m.get("parent")) for m in v1] == [
            ("x", None),
            ("x:json", "x"),
            ("x:tuned-json", "x"),
            ("x:tuned", "x"),
            ("y", None),
        ]
        one = (await gw.client.get("/v1/models/x:json")).json()
        assert (one["id"], one["parent"]) == ("x:json", "x")
        tags = [m["name"] for m in (await gw.client.get("/api/tags")).json()["models"]]
        assert tags == ["x", "x:json", "x:tuned-json", "x:tuned", "y"]
        show = (await gw.client.post("/api/show", json={"model": "x:json"})).json()
        assert show["system"] == "Answer in JSON."
        assert show["parameters"].splitlines() == ["temperature 0.2", "max_tokens 16"]
        plain = (await gw.client.post("/api/show", json={"model": "x"})).json()
        assert plain["parameters"] == "" and "system" not in plain
        control = (await gw.client.get("/api/models")).json()["models"]
        row = next(m for m in control if m["name"] == "x")
        assert row["variants"] == ["x:json", "x:tuned-json"] and row["adapters"] == ["x:tuned"]


async def test_a_key_scoped_to_a_variant_gets_it_and_not_its_model(
    serve: Serve, tmp_path: Path, tiny_gguf: Path
) -> None:
    keys = [
        {"name": "agent", "key": "agent-secret", "models": ["x:json"]},
        {"name": "team", "key": "team-secret", "models": ["x"]},
    ]
    async with serve(_models(tmp_path, tiny_gguf), server={"keys": keys}) as gw:
        agent = {"Authorization": "Bearer agent-secret"}
        team = {"Authorization": "Bearer team-secret"}
        path, body = chat("openai", "x:json", stream=False)
        assert (await gw.client.post(path, json=body, headers=agent)).status_code == 200
        r = await gw.client.post(path, json={**body, "model": "x"}, headers=agent)
        assert r.status_code == 403 and "'x'" in r.text, r.text
        r = await gw.client.post(path, json={**body, "model": "x:tuned"}, headers=agent)
        assert r.status_code == 403, r.text
        assert [m["id"] for m in (await gw.client.get("/v1/models", headers=agent)).json()["data"]] == [
            "x:json"
        ]
        tags = (await gw.client.get("/api/tags", headers=agent)).json()["models"]
        assert [m["name"] for m in tags] == ["x:json"]
        control = (await gw.client.get("/api/models", headers=agent)).json()["models"]
        assert [m["name"] for m in control] == ["x"]  # the model serving it, for the page

        # a key allowed X may use X:* (the same weights; X's requests may send the same fields)
        for name in ("x", "x:json", "x:tuned"):
            r = await gw.client.post(path, json={**body, "model": name}, headers=team)
            assert r.status_code == 200, (name, r.text)
        listed = [m["id"] for m in (await gw.client.get("/v1/models", headers=team)).json()["data"]]
        assert listed == ["x", "x:json", "x:tuned-json", "x:tuned"]


async def test_activity_and_metrics_record_the_asked_name_and_its_model(
    serve: Serve, tmp_path: Path, tiny_gguf: Path
) -> None:
    async with serve(_models(tmp_path, tiny_gguf)) as gw:
        for dialect in DIALECTS:
            path, body = chat(dialect, "x:json", stream=True)
            assert (await gw.client.post(path, json=body)).status_code == 200
        store = gw.state.recorder.store
        assert store is not None
        await poll(lambda: len(store.rows(limit=10)) >= 3, what="3 activity rows")
        rows = (await gw.client.get("/api/activity", params={"limit": 10})).json()["activity"]
        assert {r["model"] for r in rows} == {"x:json"}
        text = (await gw.client.get("/metrics")).text
        served = {
            tuple(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "forge_served_name_requests_total"
        }
        assert served == {(("model", "x"), ("name", "x:json"), ("status", "200")): 3.0}
        requests = [
            s
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "forge_requests_total"
        ]
        assert {s.labels["model"] for s in requests} == {"x"}  # the queue's, the child's metrics: X's
        lora = [
            s.labels
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "forge_model_lora_requests_info"
        ]
        assert [(x["model"], x["running_lora_adapters"], x["max_lora"]) for x in lora] == [
            ("x", "tuned", "1")
        ]


async def test_a_reload_that_changes_only_variants_keeps_the_child(
    serve: Serve, tmp_path: Path, tiny_gguf: Path
) -> None:
    async with serve(_models(tmp_path, tiny_gguf)) as gw:
        x = gw.model("x")
        pid = x.server.pid if x.server else None
        changed = _models(tmp_path, tiny_gguf)
        changed["x"]["variants"] = {"terse": {"force": {"max_tokens": 2}}}
        summary = await gw.sup.reload(fake_config(tmp_path, tiny_gguf, changed))
        assert summary["unchanged"] == ["x", "y"] and summary["changed"] == []
        assert x.server is not None and x.server.pid == pid
        ids = [m["id"] for m in (await gw.client.get("/v1/models")).json()["data"]]
        assert ids == ["x", "x:terse", "x:tuned", "y"]
        path, body = chat("openai", "x:terse", stream=False)
        assert (await gw.client.post(path, json=body)).status_code == 200
        assert (await gw.client.post(path, json={**body, "model": "x:json"})).status_code == 404
