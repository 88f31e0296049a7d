"""Issue 37 item 10 through a real `forge serve`, the real llama-server and SmolLM2: with the
default config (`ctx_size = 4096`, `parallel = 4`) one request may use the whole context (a unified
KV cache), `kv_unified = false` keeps the per-slot split (1024 each), and `/v1/models`'
`context_length`, `forge ps` and `forge inspect NAME` say the same number of tokens."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.service import FORGE, Service, model_section, running_service, wait_for, write_config

#: examples/forge.toml's model settings: what `make run` serves.
DEFAULT = {"ctx_size": 4096, "parallel": 4}


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, llama_server_bin: Path
) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("kvu")
    cfg = write_config(
        tmp / "forge.toml",
        model_section("shared", smollm2_path, preload=True, **DEFAULT)
        + model_section("split", smollm2_path, preload=True, kv_unified=False, **DEFAULT)
        + model_section("later", smollm2_path, **DEFAULT),  # never started: the config's numbers
    )
    with running_service(cfg, tmp / "state", llama_server_bin) as s:
        wait_for(
            lambda: all(s.model(n)["state"] == "ready" for n in ("shared", "split")),
            timeout=120,
            what="ready",
        )
        yield s


def _forge(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), COLUMNS="250", NO_COLOR="1")
    env.pop("FORGE_API_KEY", None)
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=120)


def _long_prompt() -> str:
    """About 1,500 tokens of SmolLM2's tokenizer (checked against the answer's usage)."""
    return " ".join(f"Item {i} of the list is the number {i * 7}." for i in range(98))


def _ask(svc: Service, model: str) -> tuple[int, dict[str, object]]:
    with svc.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": _long_prompt() + " Which item came first?"}],
            },
        )
    return r.status_code, r.json()


def test_one_request_may_use_the_whole_context_by_default(svc: Service) -> None:
    status, body = _ask(svc, "shared")
    assert status == 200, body
    usage = body["usage"]
    assert isinstance(usage, dict)
    assert 1300 < usage["prompt_tokens"] < 1800, usage  # ~1,500: over a quarter of 4096
    child = psutil.Process(svc.model("shared")["pid"]).cmdline()
    assert "--kv-unified" in child and child[child.index("--parallel") + 1] == "4"


def test_the_per_slot_split_is_kept_as_an_option(svc: Service) -> None:
    status, body = _ask(svc, "split")
    assert status == 400, body
    error = body["error"]
    assert isinstance(error, dict)
    assert "per slot: ctx_size 4096 / parallel 4 = 1024" in error["message"], error
    assert "kv_unified" in error["message"], error  # the hint names the way to the whole context
    assert "--kv-unified" not in psutil.Process(svc.model("split")["pid"]).cmdline()


def test_models_ps_and_inspect_agree_on_what_one_request_can_use(svc: Service) -> None:
    """/v1/models reads the running child's /props (its n_ctx per slot); ps and inspect the plan
    and the config. They said 1024 / nothing / 8,192 before (inspect took the trained context)."""
    expected = {"shared": 4096, "split": 1024, "later": 4096}
    with svc.client() as c:
        listed = {m["id"]: m.get("context_length") for m in c.get("/v1/models").json()["data"]}
    assert {n: listed[n] for n in expected} == expected
    ps = _forge(svc, "ps", "--json")
    assert ps.returncode == 0, ps.stderr
    rows = {r["name"]: r["context"] for r in json.loads(ps.stdout)["models"]}
    assert {n: rows[n]["per_request"] for n in expected} == expected
    assert rows["shared"]["kv_unified"] is True and rows["split"]["kv_unified"] is False
    table = _forge(svc, "ps").stdout
    assert "ctx per request" in table and "4096 (4 slots share it)" in table and "1024 (each of 4" in table
    for name, tokens in expected.items():
        r = _forge(svc, "inspect", name, "--config", str(svc.config), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["estimate"]["ctx_per_request"] == tokens, name
    text = _forge(svc, "inspect", "shared", "--config", str(svc.config))
    assert "one request: up to 4,096 tokens" in text.stdout and "4 slots sharing one KV cache" in text.stdout
    assert "as [models.shared] of the config serves it" in text.stderr
