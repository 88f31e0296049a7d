"""The residency rules end to end: a real ``forge serve`` with real llama-server children on the
embedded models. Three models in a budget of two (a group's ``max_loaded``): the pinned one keeps
its child through 20 requests that alternate the other two; the warm default comes back, without
a request, after the model that pushed it out is unloaded."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.service import model_section, running_service, wait_for, write_config


def _ask(url: str, model: str) -> None:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200, r.text


def test_the_pinned_model_keeps_its_child_while_the_others_swap(
    tmp_path: Path, llama_server_bin: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    models = (
        model_section("keeper", smollm2_path, pinned=True, preload=True, parallel=1)
        + model_section("one", gemma_path, parallel=1)
        + model_section("two", smollm2_path, parallel=1, ctx_size=512)
        + '[groups.budget]\nmembers = ["keeper", "one", "two"]\nmax_loaded = 2\n'
    )
    config = write_config(tmp_path / "forge.toml", models)
    with running_service(config, tmp_path / "state", llama_server_bin) as svc:
        pid = svc.model("keeper")["pid"]
        assert pid and svc.model("keeper")["residency"]["pinned"] is True
        for i in range(20):
            _ask(svc.url, "one" if i % 2 == 0 else "two")
            rows = svc.models()
            assert rows["keeper"]["pid"] == pid and rows["keeper"]["state"] == "ready"
            assert sum(r["state"] == "ready" for r in rows.values()) <= 2
        _ask(svc.url, "keeper")
        assert svc.model("keeper")["pid"] == pid and svc.model("keeper")["restarts"] == 0


def test_the_warm_default_comes_back_after_the_big_one_is_unloaded(
    tmp_path: Path, llama_server_bin: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    models = (
        model_section("small", smollm2_path, default=True, parallel=1)
        + model_section("big", gemma_path, parallel=1)
        + '[groups.gpu]\nmembers = ["small", "big"]\nmax_loaded = 1\n'
    )
    config = write_config(tmp_path / "forge.toml", models)
    with running_service(config, tmp_path / "state", llama_server_bin) as svc:
        first = wait_for(lambda: svc.model("small").get("pid"), timeout=60, what="the warm default")
        _ask(svc.url, "big")
        assert svc.model("small")["state"] == "stopped"
        with svc.client() as c:
            assert c.post("/api/models/big/unload", timeout=60).status_code == 200
        again = wait_for(
            lambda: svc.model("small")["state"] == "ready" and svc.model("small")["pid"],
            timeout=60,
            what="the warm default back",
        )
        assert again != first and svc.model("small")["requests_total"] == 0  # no request loaded it
