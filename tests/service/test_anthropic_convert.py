"""Anthropic Messages ⇄ OpenAI chat (``service/proxy/_anthropic``): the request, the whole answer,
and the stream translator fed OpenAI streams split at every byte (a FAKE stream with tool calls in
pieces, and a recorded llama-server stream)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rocmforge_supervisor._errors import InvalidRequest
from rocmforge_supervisor.service.proxy._anthropic import AnthropicAnswer, chat_body

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"


# -- the request ---------------------------------------------------------------------------------


def test_text_and_system_and_sampling() -> None:
    body = chat_body(
        {
            "model": "m",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "Again"}, {"type": "text", "text": "!"}]},
            ],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u"},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "min_p": 0.1,  # a field the module does not know passes through (a variant's, llama's)
        }
    )  # fmt: skip
    assert body == {
        "model": "m",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "Be brief.\nBe kind."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again!"},
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
        "min_p": 0.1,
    }


def test_stream_asks_for_usage() -> None:
    body = chat_body({"model": "m", "max_tokens": 8, "stream": True, "system": "S", "messages": []})
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "S"}]


def test_images_become_image_url_parts() -> None:
    body = chat_body(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"},
                        },
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                        {"type": "text", "text": "What is this?"},
                    ],
                }
            ],
        }
    )
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ]


def _claude_code_turns() -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 512,
        "system": "You are a coding agent.",
        "tools": [
            {
                "name": "Read",
                "description": "Read a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
            {"name": "Bash", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
        ],
        "tool_choice": {"type": "auto"},
        "messages": [
            {"role": "user", "content": "Read a.txt and list the dir"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"cmd": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no such dir"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "Go on"},
                ],
            },
        ],
    }


def test_tool_use_and_tool_result_turns() -> None:
    body = chat_body(_claude_code_turns())
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                "description": "Read a file",
            },
        },
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        },
    ]
    assert body["tool_choice"] == "auto"
    assert body["messages"][1:] == [
        {"role": "user", "content": "Read a.txt and list the dir"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"path": "a.txt"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"cmd": "ls"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "hello"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such dir"},
        {"role": "user", "content": "Go on"},
    ]


def test_a_turn_of_tool_results_only_sends_no_empty_user_message() -> None:
    turns = _claude_code_turns()
    turns["messages"][2]["content"] = turns["messages"][2]["content"][:1]
    assert chat_body(turns)["messages"][-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": "hello"}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Read"}, {"type": "function", "function": {"name": "Read"}}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    assert chat_body({**_claude_code_turns(), "tool_choice": choice})["tool_choice"] == expected


def test_no_parallel_calls() -> None:
    body = chat_body(
        {**_claude_code_turns(), "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    )
    assert body["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    "payload",
    [
        {"messages": [{"role": "system", "content": "x"}]},
        {"messages": [{"role": "user", "content": 3}]},
        {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        {"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"messages": [], "tools": [{"name": "t", "input_schema": {}}], "tool_choice": {"type": "maybe"}},
    ],
)
def test_a_malformed_request_is_a_400_naming_the_field(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as err:
        chat_body({"model": "m", **payload})
    assert err.value.param


# -- the whole answer ----------------------------------------------------------------------------


def _whole(answer: dict[str, Any], stops: list[str] | None = None) -> dict[str, Any]:
    out = json.loads(AnthropicAnswer("asked", stops).whole(json.dumps(answer).encode()))
    assert isinstance(out, dict)
    return out


def test_a_whole_text_answer() -> None:
    out = _whole(
        {
            "id": "chatcmpl-abc",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi!"}}
            ],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        }
    )
    assert out == {
        "id": "msg_abc",
        "type": "message",
        "role": "assistant",
        "model": "asked",
        "content": [{"type": "text", "text": "Hi!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 8, "output_tokens": 3, "cache_read_input_tokens": 4},
    }


def test_a_whole_tool_call_answer() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a"}'}}
    out = _whole(
        {
            "choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2},
        }
    )
    assert out["content"] == [{"type": "tool_use", "id": "call_1", "name": "Read", "input": {"path": "a"}}]
    assert out["stop_reason"] == "tool_use"
    assert out["usage"] == {"input_tokens": 5, "output_tokens": 2}


@pytest.mark.parametrize(
    ("choice", "reason", "sequence"),
    [
        ({"finish_reason": "length"}, "max_tokens", None),
        ({"finish_reason": "stop"}, "end_turn", None),
        ({"finish_reason": "stop", "stop_reason": "END"}, "stop_sequence", "END"),  # vLLM says which
        ({"finish_reason": "content_filter"}, "refusal", None),
    ],
)
def test_stop_reasons(choice: dict[str, Any], reason: str, sequence: str | None) -> None:
    out = _whole({"choices": [{**choice, "message": {"content": "x"}}]}, stops=["END"])
    assert (out["stop_reason"], out["stop_sequence"]) == (reason, sequence)


def test_usage_from_llama_timings_without_usage() -> None:
    out = _whole(
        {
            "choices": [{"message": {"content": "x"}}],
            "timings": {"cache_n": 2, "prompt_n": 5, "predicted_n": 7},
        }
    )
    assert out["usage"] == {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": 2}


# -- the stream ----------------------------------------------------------------------------------


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def _delta(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-s", "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}


def _translate(stream: bytes, *, split: int | None = None) -> bytes:
    """The translator's output for ``stream`` fed whole (``split`` None) or in pieces of ``split`` bytes."""
    t = AnthropicAnswer("asked")
    out = b""
    step = split or len(stream)
    for i in range(0, len(stream), step):
        out += t.feed(stream[i : i + step])
        if t.over:
            return out
    return out + t.end()


def _events(out: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in out.decode().split("\n\n"):
        if not block:
            continue
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        body = json.loads(data[len("data: ") :])
        assert body["type"] == kind[len("event: ") :]
        events.append((body["type"], body))
    return events


def _message(out: bytes) -> dict[str, Any]:
    """The message the events build, as an Anthropic client assembles it (checking the order)."""
    events = _events(out)
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    message: dict[str, Any] = events[0][1]["message"]
    open_block: int | None = None
    partial: dict[int, str] = {}
    for kind, body in events[1:-1]:
        if kind == "content_block_start":
            assert open_block is None and body["index"] == len(message["content"])
            message["content"].append(dict(body["content_block"]))
            open_block = body["index"]
        elif kind == "content_block_delta":
            block, delta = message["content"][body["index"]], body["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert delta["type"] == "input_json_delta"
                partial[body["index"]] = partial.get(body["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop":
            assert body["index"] == open_block
            open_block = None
        else:
            assert kind == "message_delta" and open_block is None
            message.update(body["delta"])
            message["usage"].update(body["usage"])
    for index, text in partial.items():
        message["content"][index]["input"] = json.loads(text)
    return message


def _fake_stream() -> bytes:
    """A FAKE OpenAI stream: reasoning, text, two tool calls with arguments in pieces, usage last."""
    return _sse(
        _delta({"role": "assistant", "content": None}),
        _delta({"reasoning_content": "Let me"}),
        _delta({"reasoning_content": " look."}),
        _delta({"content": "Reading "}),
        _delta({"content": "é files."}),
        _delta({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "Read", "arguments": ""}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}),
        _delta({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.txt"}'}}]}),
        _delta({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd"'}}]}),
        _delta({"tool_calls": [{"index": 1, "function": {"arguments": ': "ls"}'}}]}),
        _delta({}, "tool_calls"),
        {"id": "chatcmpl-s", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9}},
    )  # fmt: skip


EXPECTED = {
    "id": "msg_s",
    "type": "message",
    "role": "assistant",
    "model": "asked",
    "content": [
        {"type": "thinking", "thinking": "Let me look.", "signature": ""},
        {"type": "text", "text": "Reading é files."},
        {"type": "tool_use", "id": "call_a", "name": "Read", "input": {"path": "a.txt"}},
        {"type": "tool_use", "id": "call_b", "name": "Bash", "input": {"cmd": "ls"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 30, "output_tokens": 9},
}


def test_a_stream_with_tool_calls_in_pieces() -> None:
    out = _translate(_fake_stream())
    assert _message(out) == EXPECTED
    deltas = [b["delta"] for k, b in _events(out) if k == "content_block_delta"]
    assert [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"] == [
        '{"pa',
        'th": "a.txt"}',
        '{"cmd"',
        ': "ls"}',
    ]
    start = _events(out)[0][1]["message"]
    assert start["usage"] == {"input_tokens": 0, "output_tokens": 0}  # the count comes at the end


def test_the_stream_split_at_every_byte_translates_the_same() -> None:
    stream = _fake_stream()
    whole = _translate(stream)
    for size in (1, 2, 3, 7, 64):
        assert _translate(stream, split=size) == whole, size


def test_a_recorded_llama_server_stream() -> None:
    stream = (STREAMS / "chat_include_usage.sse").read_bytes()
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in stream.decode().splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    out = _translate(stream, split=1)
    assert out == _translate(stream)
    message = _message(out)
    assert message["content"] == [{"type": "text", "text": text}]
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"] == {"input_tokens": 33, "output_tokens": 80}


def test_a_recorded_stream_without_usage_counts_from_timings() -> None:
    message = _message(_translate((STREAMS / "chat_no_usage.sse").read_bytes(), split=5))
    assert message["usage"]["output_tokens"] > 0 and message["usage"]["input_tokens"] > 0


def test_an_error_mid_stream_is_an_anthropic_error_event() -> None:
    out = _translate((STREAMS / "tiny_chat_midstream_error.sse").read_bytes(), split=1)
    events = _events(out)
    assert events[0][0] == "message_start"
    kind, body = events[-1]
    assert kind == "error" and body["error"]["type"] == "api_error"
    assert "peg-native" in body["error"]["message"]
    assert "message_stop" not in [k for k, _ in events]


def test_a_cut_stream_does_not_end_as_whole() -> None:
    stream = _fake_stream()
    out = _translate(stream[: stream.index(b"data: [DONE]")])
    assert "message_stop" not in [k for k, _ in _events(out)]
