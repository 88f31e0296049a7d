"""Ollama ⇄ llama-server translation (pure functions): every mapped field, and bad input as a 400."""

from __future__ import annotations

import time

import pytest

from rocmforge_supervisor._errors import UsageError
from rocmforge_supervisor.service.core._routes import dialect_for_path, resolve_name
from rocmforge_supervisor.service.ollama._convert import (
    ChatStream,
    chat_reply,
    chat_target,
    embed_target,
    generate_target,
    keep_alive_seconds,
)


def test_chat_options_format_tools_think_are_mapped() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    t = chat_target(
        {
            "messages": [{"role": "user", "content": "hi", "images": ["aGVsbG8="]}],
            "options": {
                "temperature": 0.1,
                "top_p": 0.9,
                "top_k": 5,
                "num_predict": 7,
                "stop": ["x"],
                "seed": 3,
                "repeat_penalty": 1.2,
                "num_ctx": 4096,
                "num_gpu": 99,  # a loader option: accepted, not sent
            },
            "format": {"type": "object", "properties": {"a": {"type": "string"}}},
            "tools": tools,
            "think": False,
            "keep_alive": "1m30s",
        },
        "m",
    )
    p = t.payload
    assert t.path == "/v1/chat/completions"
    assert (p["temperature"], p["top_p"], p["top_k"], p["max_tokens"], p["stop"], p["seed"]) == (
        0.1,
        0.9,
        5,
        7,
        ["x"],
        3,
    )
    assert p["repeat_penalty"] == 1.2 and "num_gpu" not in p and "num_ctx" not in p
    assert t.num_ctx == 4096 and t.keep_alive == 90.0
    assert p["response_format"]["type"] == "json_schema"
    assert p["tools"] == tools
    assert p["chat_template_kwargs"] == {"enable_thinking": False}
    assert p["stream"] is True  # Ollama streams unless told not to
    content = p["messages"][0]["content"]
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_generate_raw_suffix_and_plain() -> None:
    raw = generate_target({"prompt": "a", "raw": True, "stream": False, "options": {"num_predict": 3}}, "m")
    assert raw.path == "/completion" and raw.payload["n_predict"] == 3 and raw.payload["prompt"] == "a"
    fim = generate_target({"prompt": "def f(", "suffix": "return x", "format": "json"}, "m")
    assert fim.path == "/infill" and fim.payload["input_suffix"] == "return x"
    assert fim.payload["json_schema"] == {"type": "object"}
    plain = generate_target({"prompt": "hi", "system": "be brief"}, "m")
    assert plain.path == "/v1/chat/completions"
    assert [m["role"] for m in plain.payload["messages"]] == ["system", "user"]


@pytest.mark.parametrize(
    ("body", "word"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [], "options": {"num_predict": "x"}}, "num_predict"),
        ({"messages": [], "options": {"nonsense": 1}}, "nonsense"),
        ({"messages": [], "options": {"num_ctx": 0}}, "num_ctx"),
        ({"messages": [], "format": "yaml"}, "format"),
        ({"messages": [], "keep_alive": "soon"}, "keep_alive"),
        ({"messages": [], "think": 3}, "think"),
    ],
)
def test_bad_fields_are_400s_naming_the_field(body: dict[str, object], word: str) -> None:
    with pytest.raises(UsageError, match=word):
        chat_target(body, "m")


def test_keep_alive_durations() -> None:
    assert keep_alive_seconds("5m") == 300
    assert keep_alive_seconds("1h") == 3600
    assert keep_alive_seconds(0) == 0
    assert keep_alive_seconds(-1) == -1
    assert keep_alive_seconds("250ms") == 0.25
    assert keep_alive_seconds(None) is None


def test_embed_targets() -> None:
    assert embed_target({"input": "a"}, "m", legacy=False).payload["input"] == ["a"]
    assert embed_target({"prompt": "a"}, "m", legacy=True).kind == "embeddings"
    with pytest.raises(UsageError, match="input"):
        embed_target({"input": 3}, "m", legacy=False)


def test_chat_reply_and_stream_tool_calls_are_whole_objects() -> None:
    started = time.perf_counter()
    reply = chat_reply(
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "content": "",
                        "reasoning_content": "hmm",
                        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}],
                    },
                }
            ],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2},
            "timings": {"prompt_n": 1, "cache_n": 8, "prompt_ms": 2.0, "predicted_n": 2, "predicted_ms": 4.0},
        },
        "m",
        started,
        generate=False,
    )
    assert reply["message"]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert reply["message"]["thinking"] == "hmm"
    assert reply["prompt_eval_count"] == 9 and reply["eval_duration"] == 4_000_000
    assert reply["done"] is True and reply["done_reason"] == "stop"

    s = ChatStream("m", started)
    s.feed(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    }
                }
            ]
        }
    )
    s.feed({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}}]})
    lines = s.feed({"choices": [{"delta": {"content": "ok"}, "finish_reason": "length"}]})
    assert lines[0]["message"]["content"] == "ok" and lines[0]["done"] is False
    last = s.finish()
    assert last["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 2}}
    assert last["done_reason"] == "length"


def test_dialect_and_latest_suffix() -> None:
    assert dialect_for_path("/v1/messages") == "anthropic"
    assert dialect_for_path("/api/chat") == "ollama"
    assert dialect_for_path("/api/models") == "openai"  # the control API's own path
    assert dialect_for_path("/v1/chat/completions") == "openai"
    assert resolve_name("gemma:latest", {"gemma"}) == "gemma"
    assert resolve_name("gemma:2b", {"gemma"}) == "gemma:2b"
