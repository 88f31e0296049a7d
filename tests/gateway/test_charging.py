"""A key is charged what its requests read and produced, streamed or not, in every dialect — as
each official client sends them by default — and also when the client leaves mid-stream.

Through `forge serve` on the real llama-server: tiny GGUF models, and SmolLM2-135M for the clients
that leave (its real text comes at a pace a client can leave in the middle of, and starts with
a whole character, so Anthropic's ``message_start`` comes with the first token). Each case has its own key with
``tokens_per_day = 1``: its first request fits the day, and once the request has been recorded
(its activity row is there: the charge is made before the row is written), the next one is a 429.
The OpenAI SDK streams without ``stream_options.include_usage``: llama-server's last event then
carries only ``timings``, which is what the charge is read from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.service import (
    Service,
    chat_and_plain_models,
    model_section,
    running_service,
    wait_for,
    write_config,
)

ADMIN = "sk-admin-charging"
CASES = ("oa", "oa-left", "resp", "an", "an-left", "ol", "ol-gen", "ol-left", "native-left")
HELLO = [{"role": "user", "content": "Hello there"}]
#: Generation that outlasts any client here (it never stops on its own with it).
LONG = {"max_tokens": 900, "ignore_eos": True, "temperature": 0}


def _secret(case: str) -> str:
    return f"sk-{case}-charging"


@pytest.fixture(scope="module")
def svc(
    tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path, smollm2_path: Path
) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("charging")
    keys = "".join(
        f'[[server.keys]]\nname = "{c}"\nkey = "{_secret(c)}"\ntokens_per_day = 1\n' for c in CASES
    )
    models = chat_and_plain_models(d) + model_section(
        "smol", smollm2_path, ctx_size=2048, parallel=1, preload=True
    )
    config = write_config(d / "forge.toml", f'[server]\napi_key = "{ADMIN}"\n' + keys + models)
    with running_service(config, d / "state", llama_server_bin, api_key=ADMIN) as s:
        yield s


def _row(svc: Service, rid: str) -> dict[str, Any]:
    """The activity row of request ``rid``, once written (after the key was charged)."""

    def find() -> dict[str, Any] | None:
        r = httpx.get(
            f"{svc.url}/api/activity", params={"limit": 200}, headers=svc.headers, timeout=30
        ).json()
        return next((row for row in r["activity"] if row["request_id"] == rid), None)

    row: dict[str, Any] = wait_for(find, timeout=60, what=f"the activity row of {rid}")
    return row


def _admin_prompt_tokens(svc: Service, messages: list[dict[str, str]]) -> int:
    """The prompt's tokens as a non-streamed request's usage says them."""
    r = httpx.post(
        f"{svc.url}/v1/chat/completions",
        json={"model": "chat", "messages": messages, "max_tokens": 1},
        headers=svc.headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    n: int = r.json()["usage"]["prompt_tokens"]
    return n


def _over(svc: Service, case: str) -> httpx.Response:
    return httpx.post(
        f"{svc.url}/v1/chat/completions",
        json={"model": "chat", "messages": HELLO, "max_tokens": 1},
        headers={"Authorization": f"Bearer {_secret(case)}"},
        timeout=60,
    )


def test_an_openai_sdk_stream_without_include_usage_is_charged(svc: Service, closing: ExitStack) -> None:
    oa = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=_secret("oa"), max_retries=0))
    stream = oa.chat.completions.create(
        model="chat",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=5,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-ID": "charge-oa"},
    )
    assert all(chunk.usage is None for chunk in stream)  # the client never saw a usage
    row = _row(svc, "charge-oa")
    assert row["stream"] and row["status"] == 200 and not row["cancelled"]
    assert (row["prompt_tokens"], row["completion_tokens"]) == (_admin_prompt_tokens(svc, HELLO), 5)
    with pytest.raises(openai.RateLimitError) as over:
        oa.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)  # type: ignore[arg-type]
    assert "'oa'" in over.value.message and "tokens per day" in over.value.message

    with httpx.Client(headers=svc.headers, timeout=30) as c:  # and the model's token counters
        metrics = c.get(f"{svc.url}/metrics").text
    assert 'forge_key_tokens_total{key="oa",kind="completion",model="chat"} 5.0' in metrics
    assert "forge_completion_tokens_total{model=" in metrics


def test_a_responses_api_stream_is_charged(svc: Service, closing: ExitStack) -> None:
    oa = closing.enter_context(
        openai.OpenAI(base_url=f"{svc.url}/v1", api_key=_secret("resp"), max_retries=0)
    )
    # Events as they come (the SDK's ``responses.stream`` helper needs event indexes llama-server
    # does not send); the last one, ``response.completed``, holds the usage.
    events = list(
        oa.responses.create(
            model="chat",
            input="Hello there",
            max_output_tokens=4,
            stream=True,
            extra_headers={"X-Request-ID": "charge-resp"},
        )
    )
    final: Any = events[-1].response  # type: ignore[union-attr]
    row = _row(svc, "charge-resp")
    assert events[-1].type == "response.completed" and final.usage is not None
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        final.usage.input_tokens,
        final.usage.output_tokens,
    )
    assert _over(svc, "resp").status_code == 429


def test_an_anthropic_sdk_stream_is_charged_its_whole_prompt(svc: Service, closing: ExitStack) -> None:
    an = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=_secret("an"), max_retries=0))
    with an.messages.stream(
        model="chat",
        max_tokens=4,
        messages=HELLO,  # type: ignore[arg-type]
        extra_headers={"X-Request-ID": "charge-an"},
    ) as stream:
        final = stream.get_final_message()
    row = _row(svc, "charge-an")
    cached = final.usage.cache_read_input_tokens or 0  # Anthropic's input_tokens leave these out
    assert (row["prompt_tokens"], row["completion_tokens"]) == (
        final.usage.input_tokens + cached,
        final.usage.output_tokens,
    )
    assert row["prompt_tokens"] == _admin_prompt_tokens(svc, HELLO)
    with pytest.raises(anthropic.RateLimitError):
        an.messages.create(model="chat", max_tokens=1, messages=HELLO)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", ["ol", "ol-gen"])
def test_an_ollama_client_stream_is_charged(svc: Service, closing: ExitStack, case: str) -> None:
    rid = f"charge-{case}"
    headers = {"Authorization": f"Bearer {_secret(case)}", "X-Request-ID": rid}
    ol = closing.enter_context(ollama.Client(host=svc.url, headers=headers))
    options = {"num_predict": 4}
    if case == "ol":
        parts = list(ol.chat(model="chat", messages=HELLO, options=options, stream=True))
    else:
        parts = list(ol.generate(model="chat", prompt="Hello there", options=options, stream=True))
    last = parts[-1]
    assert last.done and last.eval_count
    row = _row(svc, rid)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (last.prompt_eval_count, last.eval_count)
    with pytest.raises(ollama.ResponseError) as over:
        ol.chat(model="chat", messages=HELLO, options={"num_predict": 1})
    assert over.value.status_code == 429


@pytest.mark.parametrize(
    ("case", "path", "body", "is_token"),
    [
        (
            "oa-left",
            "/v1/chat/completions",
            {"messages": HELLO, "stream": True, **LONG},
            lambda line: b'"delta":{"content"' in line,
        ),
        (
            "an-left",
            "/v1/messages",
            {"messages": HELLO, "stream": True, **LONG},
            lambda line: b'"type":"content_block_delta"' in line,
        ),
        (
            "ol-left",
            "/api/chat",
            {"messages": HELLO, "options": {"num_predict": 900, "temperature": 0}},
            lambda line: b'"done":false' in line,
        ),
        (
            "native-left",
            "/completion",
            {"prompt": "Hello there", "stream": True, "n_predict": 900, "ignore_eos": True, "temperature": 0},
            lambda line: b'"tokens_predicted"' in line,
        ),
    ],
)
def test_a_client_that_leaves_mid_stream_is_charged_what_was_produced(
    svc: Service, case: str, path: str, body: dict[str, Any], is_token: Any
) -> None:
    rid = f"charge-{case}"
    headers = {"Authorization": f"Bearer {_secret(case)}", "X-Request-ID": rid}
    seen = 0
    with (
        httpx.Client(base_url=svc.url, headers=headers, timeout=60) as c,
        c.stream("POST", path, json={"model": "smol", **body}) as s,
    ):
        assert s.status_code == 200
        for line in s.iter_lines():
            seen += is_token(line.encode())
            if seen >= 3:
                break  # three tokens came: the client leaves
    row = _row(svc, rid)
    assert row["cancelled"] and row["status"] == 200, row
    assert row["completion_tokens"] is not None and 3 <= row["completion_tokens"] < 900, row
    if case in ("an-left", "native-left"):  # their stream said the prompt before its first token
        assert row["prompt_tokens"], row
    over = _over(svc, case)
    assert over.status_code == 429, over.text
    assert f"'{case}'" in json.dumps(over.json())
