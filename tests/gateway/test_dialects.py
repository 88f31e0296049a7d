"""Every llama-server model route through `forge serve`, spoken by the real client libraries.

One real service (module-scoped, both models preloaded so no test leaves a child behind) runs two
tiny GGUFs on the real llama-server: ``chat`` has a tool-aware ChatML template and fill-in-the-
middle tokens (jinja on, so tools are accepted); ``plain`` has neither, and runs with
``--embeddings --pooling mean`` for the embedding routes. Their weights are random: the tests check
protocols, shapes and errors, not the words.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.service import Service, chat_and_plain_models, running_service, write_config

KEY = "sk-test-dialects"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, llama_server_bin: Path) -> Iterator[Service]:
    d = tmp_path_factory.mktemp("dialects")
    config = write_config(
        d / "forge.toml",
        f"""
[server]
api_key = "{KEY}"
"""
        + chat_and_plain_models(d),
    )
    with running_service(config, d / "state", llama_server_bin, api_key=KEY) as s:
        yield s


def _http(svc: Service) -> httpx.Client:
    return httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


def test_anthropic_sdk_messages_stream_count_tokens_with_x_api_key(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(
        anthropic.Anthropic(base_url=svc.url, api_key=KEY, max_retries=0)
    )  # sends x-api-key
    # What Claude Code sends besides messages: a system prompt and metadata (lemonade#2662).
    msg = client.messages.create(
        model="chat",
        max_tokens=6,
        system="Answer briefly.",
        metadata={"user_id": "u-1"},
        messages=[{"role": "user", "content": "Hello"}],
    )
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 6
    assert msg.content[0].type == "text" and msg.content[0].text

    with client.messages.stream(
        model="chat", max_tokens=5, messages=[{"role": "user", "content": "Hello"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.stop_reason == "max_tokens"

    count = client.messages.count_tokens(model="chat", messages=[{"role": "user", "content": "Hello there"}])
    assert count.input_tokens > 0


def test_anthropic_errors_are_sdk_status_errors(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=KEY, max_retries=0))
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert nf.value.body["type"] == "error" and nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    bad = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key="wrong", max_retries=0))
    with pytest.raises(anthropic.AuthenticationError) as auth:
        bad.messages.create(model="chat", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # An error llama-server itself gives (a field it refuses) comes back as it is: a 400.
    with pytest.raises(anthropic.BadRequestError) as upstream:
        client.messages.create(
            model="chat",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"temperature": "hot"},
        )
    assert "temperature" in str(upstream.value)


def test_openai_sdk_responses_stream_and_not(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0))
    r = client.responses.create(model="chat", input="Hello", max_output_tokens=5)
    assert r.status == "completed" and r.output_text
    events = list(client.responses.create(model="chat", input="Hello", max_output_tokens=4, stream=True))
    types = [e.type for e in events]
    assert "response.output_text.delta" in types and types[-1] == "response.completed"
    with _http(svc) as c:
        n = c.post("/v1/responses/input_tokens", json={"model": "chat", "input": "Hello"}).json()
        m = c.post(
            "/v1/chat/completions/input_tokens",
            json={"model": "chat", "messages": [{"role": "user", "content": "Hello"}]},
        ).json()
    assert n["input_tokens"] > 0 and m["input_tokens"] > 0


def test_tokenize_detokenize_round_trip_and_apply_template(svc: Service) -> None:
    text = "the water is hot"
    with _http(svc) as c:
        tokens = c.post("/tokenize", json={"model": "plain", "content": text}).json()["tokens"]
        assert tokens and all(isinstance(t, int) for t in tokens)
        back = c.post("/detokenize", json={"model": "plain", "tokens": tokens}).json()["content"]
        prompt = c.post(
            "/apply-template", json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
        ).json()["prompt"]
    assert back.strip() == text
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_infill_on_a_fim_model_and_its_error_on_one_without(svc: Service) -> None:
    with _http(svc) as c:
        ok = c.post(
            "/infill", json={"model": "chat", "input_prefix": "the", "input_suffix": "water", "n_predict": 3}
        )
        assert ok.status_code == 200 and ok.json()["tokens_predicted"] == 3
        no = c.post("/infill", json={"model": "plain", "input_prefix": "a", "input_suffix": "b"})
    # llama-server says 501; a feature the model lacks is the client's to change: 400 (SDKs retry 5xx).
    assert no.status_code == 400
    assert "Infill is not supported by this model" in no.json()["error"]["message"]


def test_rerank_on_a_model_without_it_is_llama_servers_own_error(svc: Service) -> None:
    with _http(svc) as c:
        for path in ("/v1/rerank", "/v1/reranking", "/rerank"):
            r = c.post(path, json={"model": "chat", "query": "a", "documents": ["b", "c"]})
            assert r.status_code == 400, r.text  # llama-server's 501, as a 4xx with the fix in it
            assert "--reranking" in r.json()["error"]["message"]


def test_embedding_routes(svc: Service) -> None:
    with _http(svc) as c:
        oai = c.post("/v1/embeddings", json={"model": "plain", "input": ["a", "b"]}).json()
        native = c.post("/embedding", json={"model": "plain", "content": "a"})
        other = c.post("/embeddings", json={"model": "plain", "content": "a"})
    assert len(oai["data"]) == 2 and len(oai["data"][0]["embedding"]) == 64
    assert native.status_code == 200 and other.status_code == 200


def test_props_and_slots_take_the_model_from_the_query(svc: Service) -> None:
    with _http(svc) as c:
        props = c.get("/props", params={"model": "chat"})
        slots = c.get("/slots", params={"model": "chat"})
        missing = c.get("/props")
        unknown = c.get("/slots", params={"model": "nope"})
    n_ctx = props.json()["default_generation_settings"]["n_ctx"]
    assert props.status_code == 200 and n_ctx == 2048  # a request may use all of it: the 2 slots share it
    assert isinstance(slots.json(), list) and len(slots.json()) == 2
    assert missing.status_code == 400 and "?model=" in missing.json()["error"]["message"]
    assert unknown.status_code == 404


def test_transcriptions_take_the_model_from_the_multipart_form(svc: Service) -> None:
    with _http(svc) as c:
        r = c.post("/v1/audio/transcriptions", data={"model": "chat"}, files={"file": ("a.wav", b"RIFF0000")})
        none = c.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF0000")})
    # Routed to the model's child, which has no audio support and says so (not a gateway crash).
    assert r.status_code == 400 and "audio" in r.json()["error"]["message"]  # 501 upstream: a 4xx here
    assert none.status_code == 400 and "model" in none.json()["error"]["message"]


def test_v1_models_keeps_the_openai_shape_and_adds_context_and_capabilities(
    svc: Service, closing: ExitStack
) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0))
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"chat", "plain"}
    chat = models["chat"].model_dump()
    assert chat["object"] == "model" and chat["owned_by"] == "rocmforge"
    assert chat["context_length"] == 2048  # per request: ctx_size 2048, its 2 slots sharing one cache
    assert set(chat["capabilities"]) == {"completion", "tools", "insert"}
    assert "embedding" in models["plain"].model_dump()["capabilities"]


def test_chat_with_tools_streams_on_a_tool_template(svc: Service, closing: ExitStack) -> None:
    client = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0))
    chunks = list(
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[TOOL],  # type: ignore[list-item]
            max_tokens=4,
            stream=True,
        )
    )
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason is not None


def test_tools_to_a_model_whose_template_has_none_are_a_400_in_each_dialect(
    svc: Service, closing: ExitStack
) -> None:
    """`plain`'s template never renders tools: llama-server would drop them and answer without
    (what Claude Code met on the default model). The SDKs get a 400 they raise and do not retry,
    naming the model and what to use; without tools, or with tool_choice none, it answers."""
    oai = closing.enter_context(openai.OpenAI(base_url=f"{svc.url}/v1", api_key=KEY, max_retries=0))
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(model="plain", messages=msgs, tools=[TOOL], max_tokens=4)  # type: ignore[list-item]
    err = bad.value.body
    assert isinstance(err, dict) and "'plain' cannot call tools" in err["message"], err
    assert "without tools" in err["message"] and "Qwen" in err["message"]
    assert err["type"] == "invalid_request_error"
    r = oai.chat.completions.create(
        model="plain",
        messages=msgs,
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice="none",
        max_tokens=2,
    )
    assert r.choices[0].message is not None

    ant = closing.enter_context(anthropic.Anthropic(base_url=svc.url, api_key=KEY, max_retries=0))
    tool = {"name": "get_weather", "description": "d", "input_schema": TOOL["function"]["parameters"]}  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as abad:
        ant.messages.create(model="plain", max_tokens=4, messages=msgs, tools=[tool])  # type: ignore[list-item]
    body = abad.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert (
        body["error"]["type"] == "invalid_request_error" and "cannot call tools" in body["error"]["message"]
    )
    # The model with a tool template takes the same Anthropic request.
    msg = ant.messages.create(model="chat", max_tokens=4, messages=msgs, tools=[tool])  # type: ignore[list-item]
    assert msg.type == "message"


def test_unknown_route_and_body_errors_are_clear(svc: Service) -> None:
    with _http(svc) as c:
        no_model = c.post("/v1/messages", json={"max_tokens": 5, "messages": []})
        bad_json = c.post("/tokenize", content=b"{nope", headers={"content-type": "application/json"})
    assert no_model.status_code == 400 and no_model.json()["type"] == "error"  # Anthropic's shape
    assert bad_json.status_code == 400 and "JSON" in json.dumps(bad_json.json())
