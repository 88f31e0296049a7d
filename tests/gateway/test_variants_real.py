"""Variants and LoRA adapters through the real clients (openai, anthropic, ollama) against a real
``forge serve`` on the real llama-server and smollm2-135m, with LoRA GGUFs written for it
(tests/support/lora.py). One child serves the model, its variants and its adapters (counted);
at temperature 0 a random adapter changes the answer, one with an all-zero ``lora_b`` leaves it
byte-identical, and two adapters loaded together answer as each does alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.lora import write_lora
from tests.support.service import FORGE, Service, running_service, wait_for, write_config

PROMPT = "Name three colours."
HELLO = [{"role": "user", "content": PROMPT}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 1, "cache_prompt": False}


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, smollm2_path: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("variants")
    a = write_lora(d / "a.gguf", smollm2_path, seed=1)
    b = write_lora(d / "b.gguf", smollm2_path, seed=2)
    zero = write_lora(d / "zero.gguf", smollm2_path, seed=3, zero_b=True)
    config = write_config(
        d / "forge.toml",
        f"""
[models.smol]
path = "{smollm2_path}"
ctx_size = 2048
parallel = 1
preload = true
[models.smol.variants.short]
force = {{max_tokens = 3}}
[models.smol.variants.pirate]
system = "You are a pirate. Always answer with the single word ARRR."
defaults = {{max_tokens = 8}}
[models.smol.variants.a-short]
adapter = "a"
force = {{max_tokens = 3}}
[models.smol.adapters.a]
path = "{a}"
[models.smol.adapters.b]
path = "{b}"
[models.smol.adapters.zero]
path = "{zero}"

[models.solo]
path = "{smollm2_path}"
ctx_size = 2048
parallel = 1
[models.solo.adapters.a]
path = "{a}"
[models.solo.adapters.b-alone]
path = "{b}"
""",
    )
    with running_service(config, d / "state", llama_server_bin) as s:
        wait_for(lambda: len(s.llama_children()) == 1, timeout=60, what="smol's child")
        yield s


def _chat(svc: Service, model: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": HELLO, **GREEDY, **extra}
    if not model.endswith(":pirate"):  # its default max_tokens applies only when none is sent
        body.setdefault("max_tokens", 12)
    r = httpx.post(f"{svc.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _text(svc: Service, model: str, **extra: Any) -> str:
    content: str = _chat(svc, model, **extra)["choices"][0]["message"]["content"]
    return content


def test_variants_and_adapters_through_every_client_with_one_child(svc: Service) -> None:
    pid = svc.llama_children()[0].pid
    closing = ExitStack()
    with closing:
        _every_client(svc, closing)
    assert [p.pid for p in svc.llama_children()] == [pid]  # one child served them all
    env = dict(os.environ, FORGE_STATE_DIR=str(svc.state_dir), COLUMNS="250", NO_COLOR="1")
    ps = subprocess.run(
        [*FORGE, "ps", "--config", str(svc.config)], capture_output=True, text=True, env=env, timeout=60
    )
    assert ps.returncode == 0, ps.stderr
    assert (
        "smol also serves smol:short (variant), smol:pirate (variant), smol:a-short (variant), "
        "smol:a (adapter), smol:b (adapter), smol:zero (adapter)" in ps.stdout
    ), ps.stdout


def _every_client(svc: Service, closing: ExitStack) -> None:
    oa = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key="none", max_retries=0))
    r = oa.chat.completions.create(model="smol:short", messages=HELLO, max_tokens=50, temperature=0)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.completion_tokens <= 3  # forced over the request's 50
    assert r.model == "smol"  # llama-server's answer names the model whose child served it
    r = oa.chat.completions.create(model="smol:a", messages=HELLO, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].message.content is not None

    # Greedy, as every request here: sampled at llama-server's default temperature, the random
    # adapter's few tokens were once text its chat-output parser refused (a 500 from the child).
    an = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key="none", max_retries=0))
    m = an.messages.create(model="smol:short", max_tokens=50, messages=HELLO, extra_body=GREEDY)  # type: ignore[arg-type]
    assert m.usage.output_tokens <= 3
    m = an.messages.create(model="smol:a-short", max_tokens=50, messages=HELLO, extra_body=GREEDY)  # type: ignore[arg-type]
    assert m.usage.output_tokens <= 3

    ol = closing.enter_context(ollama.Client(host=svc.url))
    c = ol.chat(model="smol:short", messages=HELLO, options={"num_predict": 50, "temperature": 0})
    assert c.eval_count is not None and c.eval_count <= 3
    g = ol.generate(model="smol:zero", prompt=PROMPT, options={"num_predict": 4, "temperature": 0})
    assert g.response
    show = ol.show("smol:pirate")
    assert show.parameters == "max_tokens 8"
    assert show.modelfile is not None and 'SYSTEM """You are a pirate.' in show.modelfile
    names = [t.model for t in ol.list().models]
    assert {"smol", "smol:short", "smol:pirate", "smol:a", "smol:b", "smol:zero"} <= set(names)


def test_a_variants_system_prompt_reaches_the_model(svc: Service) -> None:
    system = {"role": "system", "content": "You are a pirate. Always answer with the single word ARRR."}
    pirate = _chat(svc, "smol:pirate")
    by_hand = _chat(svc, "smol", messages=[system, *HELLO], max_tokens=8)
    assert pirate["usage"] == by_hand["usage"]  # the same prompt, and its default max_tokens
    assert pirate["choices"][0]["message"] == by_hand["choices"][0]["message"]
    assert pirate["usage"]["prompt_tokens"] != _chat(svc, "smol")["usage"]["prompt_tokens"]
    own = [{"role": "system", "content": "Be brief."}, *HELLO]  # the request's own system prompt wins
    assert (
        _chat(svc, "smol:pirate", messages=own)["usage"]
        == _chat(svc, "smol", messages=own, max_tokens=8)["usage"]
    )


def test_adapters_change_the_answer_a_zero_one_does_not_and_each_answers_alike_with_others(
    svc: Service,
) -> None:
    base = _text(svc, "smol")
    assert base == _text(svc, "smol")  # greedy is repeatable
    tuned = _text(svc, "smol:a")
    assert tuned != base, tuned
    assert _text(svc, "smol:zero") == base  # byte-identical: B = 0 adds nothing
    assert _text(svc, "smol:b") not in (base, tuned)
    # A request that brings its own lora to the base model keeps working (adapter 0 is "a").
    assert _text(svc, "smol", lora=[{"id": 0, "scale": 1.0}]) == tuned
    assert _text(svc, "smol") == base  # and the next plain request is the base again

    # solo has "a" alone, and "b" alone under another name: the same answers as among three.
    assert _text(svc, "solo:a") == tuned
    assert _text(svc, "solo:b-alone") == _text(svc, "smol:b")
    assert _text(svc, "solo") == base
    r = httpx.post(f"{svc.url}/api/models/solo/unload", json={}, timeout=60)  # this test's child only
    assert r.status_code == 200, r.text
    wait_for(lambda: len(svc.llama_children()) == 1, timeout=30, what="solo's child gone")
