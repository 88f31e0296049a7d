"""The Ollama API of `forge serve`, driven by the official ``ollama`` client and by Copilot's calls.

A real service runs two tiny GGUFs on the real llama-server (random weights: protocols and
fields are checked, not words): ``chat`` has a tool-aware template (so ``tools`` is a capability),
``plain`` serves embeddings. ``server.ollama_port = 0`` opens the second listener Ollama clients
look for (11434 in real use; any free port here).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import ollama
import pytest

from tests.support.service import (
    FORGE,
    Service,
    chat_and_plain_models,
    model_section,
    running_service,
    write_config,
)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("ollama")
    config = write_config(
        d / "forge.toml",
        """
[server]
ollama_port = 0
"""
        + chat_and_plain_models(d),
    )
    with running_service(config, d / "state", llama_server_bin) as s:
        yield s


def _ollama_url(svc: Service) -> str:
    info = json.loads((svc.state_dir / "service.json").read_text())
    port = info["ollama_port"]
    assert isinstance(port, int) and port > 0
    return f"http://127.0.0.1:{port}"


def test_ollama_client_list_show_ps(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(ollama.Client(host=_ollama_url(svc)))
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"chat", "plain"}
    assert listed["chat"].details is not None and listed["chat"].details.format == "gguf"
    assert listed["chat"].size and listed["chat"].size > 0

    shown = client.show("chat:latest")  # Ollama-style tag: the same model
    assert shown.capabilities is not None and {"completion", "tools", "insert"} <= set(shown.capabilities)
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 2048
    assert shown.template and "tools" in shown.template

    running = {m.model: m for m in client.ps().models}
    assert set(running) == {"chat", "plain"}
    assert running["chat"].context_length == 2048 and running["chat"].expires_at is not None


def test_ollama_client_chat_generate_embed(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(ollama.Client(host=svc.url))  # the main port serves the same API
    reply = client.chat(
        model="chat",
        messages=[{"role": "user", "content": "Hello"}],
        options={"num_predict": 4, "temperature": 0.5, "top_k": 20, "seed": 1},
    )
    assert reply.done and reply.done_reason == "length" and reply.message.content
    assert reply.eval_count == 4 and reply.prompt_eval_count and reply.prompt_eval_count > 0

    parts = list(
        client.chat(
            model="chat",
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
            options={"num_predict": 3},
        )
    )
    assert [p.done for p in parts][-1] is True and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) and parts[-1].eval_count == 3

    gen = client.generate(model="chat", prompt="Once upon", options={"num_predict": 3})
    assert gen.done and gen.response and gen.eval_count == 3
    streamed = list(client.generate(model="chat", prompt="Once", stream=True, options={"num_predict": 3}))
    assert streamed[-1].done and streamed[-1].done_reason == "length"
    fim = client.generate(model="chat", prompt="the", suffix="water", options={"num_predict": 3})
    assert fim.done and fim.response

    emb = client.embed(model="plain", input=["a", "b"])
    assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 64
    old = client.embeddings(model="plain", prompt="a")
    assert len(old.embedding) == 64


def test_ollama_tools_and_errors(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(ollama.Client(host=svc.url))
    tool = {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}},
    }
    reply = client.chat(
        model="chat", messages=[{"role": "user", "content": "x"}], tools=[tool], options={"num_predict": 3}
    )
    assert reply.done
    with pytest.raises(ollama.ResponseError) as no_tools:  # its template renders no tools
        client.chat(model="plain", messages=[{"role": "user", "content": "x"}], tools=[tool])
    assert no_tools.value.status_code == 400 and "'plain' cannot call tools" in no_tools.value.error
    with pytest.raises(ollama.ResponseError) as nf:
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert nf.value.status_code == 404 and "nope" in nf.value.error
    with pytest.raises(ollama.ResponseError) as ctx:
        client.chat(model="chat", messages=[{"role": "user", "content": "x"}], options={"num_ctx": 100000})
    assert ctx.value.status_code == 400 and "num_ctx" in ctx.value.error and "ctx_size" in ctx.value.error
    for call in (
        lambda: client.copy("chat", "other"),
        lambda: client.delete("chat"),
        lambda: client.push("chat"),
    ):
        with pytest.raises(ollama.ResponseError) as unsupported:
            call()
        assert unsupported.value.status_code == 501 and "forge" in unsupported.value.error


def test_copilot_call_sequence_probe(svc: Service) -> None:
    """What VS Code Copilot's Ollama provider calls, in order, with each field it relies on
    (peers-2026-11.md §4a): a numeric version, the model list, capabilities with "tools" and
    ``model_info.<arch>.context_length``, then OpenAI chat on the same port."""
    with httpx.Client(base_url=_ollama_url(svc), timeout=60) as c:
        version = c.get("/api/version").json()["version"]
        assert re.fullmatch(r"\d+\.\d+\.\d+", version) and tuple(map(int, version.split("."))) >= (0, 6, 4)
        names = [m["name"] for m in c.get("/api/tags").json()["models"]]
        assert "chat" in names
        show = c.post("/api/show", json={"model": "chat"}).json()
        assert "tools" in show["capabilities"]
        arch = show["model_info"]["general.architecture"]
        assert isinstance(show["model_info"][f"{arch}.context_length"], int)
        body = {
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": True,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        }
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            text = "".join(r.iter_text())
    assert "data: [DONE]" in text


def test_load_and_unload_idiom(tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path) -> None:
    """Ollama clients (Open WebUI's "eject") load with an empty prompt, unload with keep_alive 0.
    Its own service: the module's keeps its children for the other tests."""
    config = write_config(
        tmp_path / "forge.toml", f'[models.plain]\npath = "{tiny_gguf}"\ngpu = "cpu"\nctx_size = 512\n'
    )
    with (
        running_service(config, tmp_path / "state", llama_server_bin) as svc,
        httpx.Client(base_url=svc.url, timeout=60) as c,
    ):
        r = c.post("/api/generate", json={"model": "plain"})
        assert r.json()["done_reason"] == "load"
        assert svc.model("plain")["state"] == "ready"
        r = c.post("/api/generate", json={"model": "plain", "keep_alive": 0})
        assert r.json()["done_reason"] == "unload"
        assert svc.model("plain")["state"] in ("stopped", "unloaded")
        r = c.post("/api/generate", json={"model": "plain"})
        assert r.json()["done_reason"] == "load"
        assert svc.model("plain")["state"] == "ready"


def test_pull_goes_through_forges_hub_pull(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path, closing: ExitStack
) -> None:
    """No hub is reachable from the test machine: offline mode gives the hub pull's own clear error
    (as Ollama's error line), and a bad reference is a 400 before anything starts."""
    config = write_config(
        tmp_path / "forge.toml", f'[models.plain]\npath = "{tiny_gguf}"\ngpu = "cpu"\nctx_size = 512\n'
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    with running_service(config, tmp_path / "state", llama_server_bin, extra_env=env) as svc:
        client = closing.enter_context(ollama.Client(host=svc.url))
        with pytest.raises(ollama.ResponseError) as offline:
            client.pull("hf.co/nobody/nothing-GGUF:Q4_K_M")
        assert "offline" in offline.value.error and "forge pull" in offline.value.error
        with httpx.Client(base_url=svc.url, timeout=30) as c:
            r = c.post("/api/pull", json={"model": "not a reference"})
            assert r.status_code == 400 and "reference" in r.json()["error"]
            with c.stream("POST", "/api/pull", json={"model": "nobody/nothing-GGUF:Q4_K_M"}) as s:
                rows = [json.loads(line) for line in s.iter_lines() if line]
        assert rows[0] == {"status": "pulling manifest"} and "error" in rows[-1]


def test_the_banner_shows_the_ollama_listener(svc: Service) -> None:
    """With ``ollama_port = 0`` the start-up banner is where a user finds the port (issue 19, 13)."""
    url = _ollama_url(svc)
    assert f"Ollama API also on {url} (server.ollama_port)" in svc.stderr_text()
    r = httpx.get(f"{url}/api/version", timeout=10)
    assert r.status_code == 200 and r.json()["version"]


def test_an_ollama_port_in_use_names_that_key(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """The error names ``server.ollama_port``, the key to change (it said ``server.port``), and
    nothing is left behind: no service.json, no ledger (no child was started)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "forge.toml",
            f"[server]\nollama_port = {port}\n" + model_section("tiny", tiny_gguf, preload=True),
        )
        env = dict(
            os.environ, FORGE_STATE_DIR=str(tmp_path / "state"), FORGE_LLAMA_SERVER=str(llama_server_bin)
        )
        r = subprocess.run(
            [*FORGE, "serve", "--config", str(config), "--port", "0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip()
    assert f"cannot listen on 127.0.0.1:{port}" in line and "server.ollama_port" in line, line
    assert "server.port " not in line and "Traceback" not in line, line
    assert not (tmp_path / "state" / "service.json").exists()
    assert not (tmp_path / "state" / "children.json").exists()
