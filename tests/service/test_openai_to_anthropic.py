"""OpenAI chat ⇄ Anthropic Messages (``service/proxy/_openai_upstream``), for an upstream that speaks
only Anthropic's Messages API: the request, the whole answer, and the stream translator fed Anthropic
streams split at every byte.

Both sides are held to the real SDKs' types. Every translated request is validated against the
``anthropic`` package's request types (its keys, each block's, the tools', the tool choice's); every
FAKE Anthropic answer fed in is first validated by ``anthropic``'s own models (``Message``, the
stream's events), and its stream is the one whose ``anthropic`` client accumulation gives that same
message. Every translated answer is parsed by the ``openai`` package (``ChatCompletion``,
``ChatCompletionChunk``, the stream accumulator of its client), and the real ``openai`` client talks
to a fake gateway built from the two functions, over httpx's mock transport.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from anthropic import types as at
from anthropic.types import message_create_params
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk, completion_create_params
from pydantic import TypeAdapter

from rocmforge_supervisor._errors import ForgeError, InvalidRequest, ServerError, StreamError
from rocmforge_supervisor.service.proxy import _to_messages
from rocmforge_supervisor.service.proxy._openai_upstream import (
    DEFAULT_MAX_TOKENS,
    ChatAnswer,
    messages_body,
)

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"
CREATED = 1_700_000_000

# -- the anthropic SDK's view of a request -----------------------------------------------------------

#: The request fields the installed anthropic SDK declares, and the sampling fields the Messages API
#: takes that it no longer declares (its ``messages.create`` has no ``temperature``, ``top_p`` or
#: ``top_k`` any more; the API and the other translator still use them).
_REQUEST_KEYS = set(typing.get_type_hints(message_create_params.MessageCreateParamsNonStreaming)) | {
    "temperature",
    "top_p",
    "top_k",
}
_TURNS: dict[str, Any] = {
    "user": at.user_message_param.UserMessageParam,
    "assistant": at.assistant_message_param.AssistantMessageParam,
}
_BLOCKS: dict[str, Any] = {
    "text": at.TextBlockParam,
    "image": at.ImageBlockParam,
    "document": at.DocumentBlockParam,
    "tool_use": at.ToolUseBlockParam,
    "tool_result": at.ToolResultBlockParam,
}


def _typed(cls: Any, value: Any, where: str) -> None:
    """``value`` is a ``cls`` (a TypedDict of the SDK): its keys are ``cls``'s and pydantic takes it."""
    assert isinstance(value, dict), where
    assert set(value) <= set(typing.get_type_hints(cls)), (where, set(value))
    TypeAdapter(cls).validate_python(value)


def _check_anthropic_request(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` is a request the anthropic SDK's types accept, checked deep (pydantic validates a
    TypedDict's ``Iterable`` fields lazily: each one is walked here)."""
    assert set(body) <= _REQUEST_KEYS, set(body) - _REQUEST_KEYS
    assert {"model", "max_tokens", "messages"} <= set(body)
    TypeAdapter(message_create_params.MessageCreateParams).validate_python(body)
    roles = [m["role"] for m in body["messages"]]
    assert all(a != b for a, b in pairwise(roles)), roles  # they alternate
    for i, message in enumerate(body["messages"]):
        _typed(_TURNS[message["role"]], message, f"messages[{i}]")
        for j, block in enumerate(message["content"]):
            _typed(_BLOCKS[block["type"]], block, f"messages[{i}].content[{j}]")
            assert block["type"] != "text" or block["text"], "Anthropic refuses an empty text block"
            inner = block.get("content") if block["type"] == "tool_result" else None
            for k, part in enumerate(inner if isinstance(inner, list) else []):
                _typed(_BLOCKS[part["type"]], part, f"messages[{i}].content[{j}].content[{k}]")
        if message["role"] == "user":  # a turn's tool results first
            kinds = [b["type"] == "tool_result" for b in message["content"]]
            assert kinds == sorted(kinds, reverse=True)
    for i, tool in enumerate(body.get("tools") or []):
        _typed(at.ToolParam, tool, f"tools[{i}]")
    if "tool_choice" in body:
        TypeAdapter(at.ToolChoiceParam).validate_python(body["tool_choice"])
    if "metadata" in body:
        _typed(at.MetadataParam, body["metadata"], "metadata")
    return body


def _body(payload: dict[str, Any]) -> dict[str, Any]:
    return _check_anthropic_request(messages_body(payload))


# -- the request ---------------------------------------------------------------------------------


def test_text_system_and_sampling() -> None:
    body = _body(
        {
            "model": "claude-x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": [{"type": "text", "text": "Again"}, {"type": "text", "text": "!"}]},
            ],
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "top_logprobs": 3,
            "user": "u-1",
        }
    )  # fmt: skip
    assert body == {
        "model": "claude-x",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "system": "Be brief.\nBe kind.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "text", "text": "Again"}, {"type": "text", "text": "!"}]},
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "stream": True,
        "metadata": {"user_id": "u-1"},
    }


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, DEFAULT_MAX_TOKENS),
        ({"max_tokens": 64}, 64),
        ({"max_completion_tokens": 32}, 32),
        ({"max_completion_tokens": 32, "max_tokens": 64}, 32),  # the newer field wins
        ({"max_completion_tokens": None, "max_tokens": 64}, 64),
    ],
)
def test_max_tokens(fields: dict[str, Any], expected: int) -> None:
    body = _body({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields})
    assert body["max_tokens"] == expected


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("END", ["END"]), (["A", "B"], ["A", "B"]), (None, None), ([], None), ("", None)],
)
def test_stop(stop: Any, expected: list[str] | None) -> None:
    body = _body({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": stop})
    assert body.get("stop_sequences") == expected


def test_images() -> None:
    body = _body(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD", "detail": "low"}},
                        {"type": "image_url", "image_url": {"url": "data:image/jpg;base64,REVG"}},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                        {"type": "text", "text": "What are these?"},
                    ],
                }
            ],
        }
    )  # fmt: skip
    assert body["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "REVG"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "What are these?"},
    ]


def test_a_pdf_file_part_is_a_document() -> None:
    part = {
        "type": "file",
        "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
    }
    body = _body({"model": "m", "messages": [{"role": "user", "content": [part]}]})
    assert body["messages"][0]["content"] == [
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
            "title": "a.pdf",
        }
    ]


def _agent_turns() -> dict[str, Any]:
    """A FAKE agent's conversation: two tool calls, their results, and the user's next words."""
    return {
        "model": "m",
        "max_tokens": 512,
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Read a.txt and list the dir"},
            {
                "role": "assistant",
                "content": "Reading.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a.txt"}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "Bash", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "no such dir"}]},
            {"role": "user", "content": "Go on"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Read",
                    "description": "Read a file",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                    "strict": True,
                },
            },
            {"type": "function", "function": {"name": "Bash"}},
        ],
        "tool_choice": "auto",
    }  # fmt: skip


def test_tool_calls_and_tool_results() -> None:
    body = _body(_agent_turns())
    assert body["tools"] == [
        {
            "name": "Read",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            "description": "Read a file",
            "strict": True,
        },
        {"name": "Bash", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert body["tool_choice"] == {"type": "auto"}
    assert body["system"] == "You are a coding agent."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Read a.txt and list the dir"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "call_1", "name": "Read", "input": {"path": "a.txt"}},
                {"type": "tool_use", "id": "call_2", "name": "Bash", "input": {}},
            ],
        },
        {  # the tool messages and the user's words after them: one user turn, results first
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "hello"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": [{"type": "text", "text": "no such dir"}],
                },
                {"type": "text", "text": "Go on"},
            ],
        },
    ]


def test_a_tool_result_before_the_users_words_goes_first() -> None:
    turns = _agent_turns()
    turns["messages"][3:] = [
        {"role": "user", "content": "Here:"},
        {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
        {"role": "tool", "tool_call_id": "call_2", "content": ""},
    ]
    assert _body(turns)["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "hello"},
        {"type": "tool_result", "tool_use_id": "call_2"},
        {"type": "text", "text": "Here:"},
    ]


def test_consecutive_messages_of_one_role_are_merged_and_empty_ones_dropped() -> None:
    body = _body(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": ""},
                {"role": "user", "content": [{"type": "text", "text": "b"}]},
                {"role": "assistant", "content": "c"},
                {"role": "assistant", "content": None},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "d"}]},
            ],
        }
    )
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]},
    ]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ({"type": "function", "function": {"name": "Read"}}, None, {"type": "tool", "name": "Read"}),
        (None, None, None),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        ("auto", True, {"type": "auto"}),
        ("none", False, {"type": "none"}),
    ],
)
def test_tool_choice(choice: Any, parallel: bool | None, expected: dict[str, Any] | None) -> None:
    payload = {**_agent_turns(), "tool_choice": choice, "parallel_tool_calls": parallel}
    assert _body(payload).get("tool_choice") == expected


def test_tool_choice_without_tools() -> None:
    payload = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "none"}
    assert "tool_choice" not in _body(payload)
    with pytest.raises(InvalidRequest) as err:
        messages_body({**payload, "tool_choice": "required"})
    assert err.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("arguments", "what"),
    [
        ('{"path": "a.txt"', "is not valid JSON"),
        ('["a"]', "must be a JSON object"),
        ("3", "must be a JSON object"),
    ],
)
def test_unparsable_tool_call_arguments_are_a_400(arguments: str, what: str) -> None:
    turns = _agent_turns()
    turns["messages"][2]["tool_calls"][0]["function"]["arguments"] = arguments
    with pytest.raises(InvalidRequest) as err:
        messages_body(turns)
    assert err.value.param == "messages[2].tool_calls[0].function.arguments"
    assert what in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ForgeError)


@pytest.mark.parametrize(
    ("fields", "param", "said"),
    [
        ({"n": 2}, "n", "Anthropic returns one choice"),
        ({"response_format": {"type": "json_object"}}, "response_format", "JSON"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "JSON"),
        ({"modalities": ["text", "audio"]}, "modalities", "audio"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio"),
        ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
        ({"web_search_options": {}}, "web_search_options", "web search"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type", "'custom'"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "name"),
        ({"tool_choice": "maybe", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice", "must be"),
        ({"messages": [{"role": "system", "content": "only a system prompt"}]}, "messages", "user or assistant"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role", "deprecated"),
        ({"messages": [{"role": "critic", "content": "x"}]}, "messages[0].role", "unknown role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "must be"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "messages[0].content[0]", "audio"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,QQ=="}}]}]}, "messages[0].content[0].image_url.url", "image/bmp"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png,raw"}}]}]}, "messages[0].content[0].image_url.url", "base64"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://a/b.png"}}]}]}, "messages[0].content[0].image_url.url", "http"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}]}, "messages[0].content[0].file", "file_id"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_data": "data:text/csv;base64,QQ=="}}]}]}, "messages[0].content[0].file.file_data", "text/csv"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "string"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]}, "messages[0].tool_calls[0].id", "string"),
        ({"max_tokens": 0}, "max_tokens", "positive"),
        ({"stop": 3}, "stop", "string"),
    ],
)  # fmt: skip
def test_what_anthropic_cannot_take_is_a_400_naming_the_field(
    fields: dict[str, Any], param: str, said: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        messages_body({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields})
    assert err.value.param == param
    assert said in err.value.message and "\n" not in str(err.value)


def test_the_defaults_of_refused_fields_pass() -> None:
    body = _body(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "n": 1,
            "response_format": {"type": "text"},
            "modalities": ["text"],
        }
    )
    assert set(body) == {"model", "max_tokens", "messages"}


def test_dropped_fields_and_anthropics_own() -> None:
    dropped = {
        "stream_options": {"include_usage": True},
        "logprobs": False,
        "top_logprobs": 2,
        "seed": 7,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "logit_bias": {"50256": -100},
        "store": False,
        "metadata": {"k": "v"},
        "service_tier": "auto",
        "reasoning_effort": "low",
        "chat_template_kwargs": {"enable_thinking": False},  # a server's own: unknown, dropped
    }
    body = _body(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "top_k": 40,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            **dropped,
        }
    )
    assert body == {
        "model": "m",
        "max_tokens": DEFAULT_MAX_TOKENS,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
        "top_k": 40,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }


def test_every_field_of_openais_request_is_decided() -> None:
    """A field the openai SDK adds shows up here: translated, refused or dropped, on purpose."""
    fields = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsStreaming))
    decided = _to_messages._TRANSLATED | _to_messages._REFUSED | _to_messages._DROPPED
    assert fields - decided == set()
    assert not _to_messages._TRANSLATED & _to_messages._REFUSED
    assert not _to_messages._DROPPED & (_to_messages._TRANSLATED | _to_messages._REFUSED)


# -- the anthropic side's fakes -----------------------------------------------------------------------


def _message(**fields: Any) -> dict[str, Any]:
    """A FAKE Anthropic message, as the anthropic SDK's ``Message`` takes it."""
    message = {
        "id": "msg_01abc",
        "type": "message",
        "role": "assistant",
        "model": "claude-upstream",
        "content": [{"type": "text", "text": "Hi!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3},
        **fields,
    }
    at.Message.model_validate(message)
    return message


_EVENTS: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)


def _sse(*events: dict[str, Any]) -> bytes:
    """A FAKE Anthropic event stream, each event checked against the SDK's own event types."""
    out = []
    for event in events:
        if event["type"] == "error":
            at.ErrorResponse.model_validate(event)
        elif event["type"] != "ping":
            _EVENTS.validate_python(event)
        out.append(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    return b"".join(out)


def _start(usage: dict[str, int] | None = None) -> dict[str, Any]:
    message = _message(content=[], stop_reason=None, usage=usage or {"input_tokens": 25, "output_tokens": 1})
    return {"type": "message_start", "message": message}


def _block(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def _fake_stream() -> bytes:
    """A FAKE Anthropic stream: thinking, text, two tool calls with their input in pieces, pings."""
    return _sse(
        _start({"input_tokens": 25, "cache_read_input_tokens": 5, "output_tokens": 1}),
        _block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        _delta(0, {"type": "thinking_delta", "thinking": "Let me"}),
        _delta(0, {"type": "thinking_delta", "thinking": " look."}),
        _delta(0, {"type": "signature_delta", "signature": "c2ln"}),
        _stop(0),
        {"type": "ping"},
        _block(1, {"type": "text", "text": ""}),
        _delta(1, {"type": "text_delta", "text": "Reading "}),
        _delta(1, {"type": "text_delta", "text": "é files."}),
        _stop(1),
        _block(2, {"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {}}),
        _delta(2, {"type": "input_json_delta", "partial_json": ""}),
        _delta(2, {"type": "input_json_delta", "partial_json": '{"pa'}),
        _delta(2, {"type": "input_json_delta", "partial_json": 'th": "a.txt"}'}),
        _stop(2),
        _block(3, {"type": "tool_use", "id": "toolu_b", "name": "Bash", "input": {}}),
        _delta(3, {"type": "input_json_delta", "partial_json": '{"cmd": "ls"}'}),
        _stop(3),
        {"type": "ping"},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    )  # fmt: skip


def _accumulated_by_anthropic(stream: bytes) -> dict[str, Any]:
    """The message the anthropic client builds from ``stream``: the whole answer it stands for.
    (The anthropic SDK runs on ``httpx2``, its own fork of httpx: its mock transport.)"""
    headers = {"content-type": "text/event-stream"}
    transport = httpx2.MockTransport(lambda _: httpx2.Response(200, headers=headers, content=stream))
    client = anthropic.Anthropic(
        api_key="k",
        base_url="http://upstream.test",
        max_retries=0,
        http_client=httpx2.Client(transport=transport),
    )
    with client.messages.stream(
        model="claude-upstream", max_tokens=64, messages=[{"role": "user", "content": "x"}]
    ) as events:
        message = events.get_final_message()
    client.close()
    return message.model_dump(mode="json", exclude_none=True)


# -- the whole answer ----------------------------------------------------------------------------


def _whole(message: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(ChatAnswer("asked", created=CREATED).whole(json.dumps(message).encode()))
    ChatCompletion.model_validate(out)
    assert isinstance(out, dict)
    return out


def test_a_whole_text_answer() -> None:
    out = _whole(
        _message(
            content=[{"type": "text", "text": "Hi"}, {"type": "text", "text": " there!"}],
            usage={
                "input_tokens": 12,
                "output_tokens": 3,
                "cache_read_input_tokens": 4,
                "cache_creation_input_tokens": 2,
            },
        )
    )
    assert out == {
        "id": "chatcmpl-01abc",
        "object": "chat.completion",
        "created": CREATED,
        "model": "asked",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi there!", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 18,
            "completion_tokens": 3,
            "total_tokens": 21,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }


def test_a_whole_tool_call_answer() -> None:
    out = _whole(
        _message(
            content=[
                {"type": "thinking", "thinking": "A file.", "signature": "c2ln"},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "é.txt"}},
                {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {}},
            ],
            stop_reason="tool_use",
        )
    )
    message = out["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "reasoning_content": "A file.",
        "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Read", "arguments": '{"path": "é.txt"}'}},
            {"id": "toolu_2", "type": "function", "function": {"name": "Bash", "arguments": "{}"}},
        ],
    }  # fmt: skip
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    completion = ChatCompletion.model_validate(out)
    calls = completion.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls if c.type == "function"] == [
        {"path": "é.txt"},
        {},
    ]


@pytest.mark.parametrize(
    ("reason", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        (None, "stop"),
    ],
)
def test_stop_reasons(reason: str | None, finish: str) -> None:
    sequence = "END" if reason == "stop_sequence" else None
    out = _whole(_message(stop_reason=reason, stop_sequence=sequence))
    assert out["choices"][0]["finish_reason"] == finish


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
        b'{"type": "message", "content": "Hi"}',
        b'{"type": "message", "content": ["Hi"]}',
        b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}',  # an OpenAI answer
    ],
)
def test_an_answer_that_is_no_anthropic_message_is_a_forge_error(content: bytes) -> None:
    with pytest.raises(ServerError) as err:
        ChatAnswer("asked").whole(content)
    assert isinstance(err.value, ForgeError) and err.value.status_code == 502
    assert "\n" not in str(err.value)


# -- the stream ----------------------------------------------------------------------------------


def _translate(stream: bytes, *, split: int | None = None) -> bytes:
    """The translator's output for ``stream`` fed whole (``split`` None) or in pieces of ``split`` bytes."""
    t = ChatAnswer("asked", created=CREATED)
    out = b""
    step = split or len(stream)
    for i in range(0, len(stream), step):
        out += t.feed(stream[i : i + step])
        if t.over:
            return out
    return out + t.end()


def _datas(out: bytes) -> list[str]:
    blocks = [b for b in out.decode().split("\n\n") if b]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    return [b[len("data: ") :] for b in blocks]


def _chunks(out: bytes) -> list[dict[str, Any]]:
    """The chunks of a whole translated stream, each one an ``openai`` ``ChatCompletionChunk``."""
    datas = _datas(out)
    assert datas[-1] == "[DONE]" and "[DONE]" not in datas[:-1]
    chunks = [json.loads(d) for d in datas[:-1]]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"].startswith("chatcmpl-")
        assert (chunk["created"], chunk["model"]) == (CREATED, "asked")
    return chunks


def _accumulated(out: bytes) -> ChatCompletion:
    """What the ``openai`` client's stream accumulator makes of the chunks."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in _chunks(out):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    try:
        return state.get_final_completion()
    except openai.LengthFinishReasonError as cut:  # its parse step refuses an answer cut at the limit
        return cut.completion


def _said(message: Any) -> dict[str, Any]:
    """What an openai message says, whatever class the client built it as (a streamed one is
    "parsed", its tool calls indexed): the content, the reasoning, each call's id, name and input."""
    calls = [
        (c.id, c.function.name, json.loads(c.function.arguments))
        for c in message.tool_calls or []
        if c.type == "function"
    ]
    extra = message.model_extra or {}
    return {"content": message.content, "reasoning": extra.get("reasoning_content"), "calls": calls}


def test_a_stream_with_thinking_text_and_tool_calls_in_pieces() -> None:
    chunks = _chunks(_translate(_fake_stream()))
    assert {c["id"] for c in chunks} == {"chatcmpl-01abc"}
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Let me"},
        {"reasoning_content": " look."},
        {"content": "Reading "},
        {"content": "é files."},
        {"tool_calls": [{"index": 0, "id": "toolu_a", "type": "function", "function": {"name": "Read", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a.txt"}'}}]},
        {"tool_calls": [{"index": 1, "id": "toolu_b", "type": "function", "function": {"name": "Bash", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": '{"cmd": "ls"}'}}]},
        {},
    ]  # fmt: skip
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 10 + ["tool_calls"]
    assert [c.get("usage") for c in chunks[:-1]] == [None] * 10
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 9,
        "total_tokens": 39,
        "prompt_tokens_details": {"cached_tokens": 5},
    }


def test_the_stream_split_at_every_byte_translates_the_same() -> None:
    stream = _fake_stream()
    whole = _translate(stream)
    for size in (1, 2, 3, 7, 64):
        assert _translate(stream, split=size) == whole, size


def test_the_stream_and_the_whole_answer_translate_to_the_same_completion() -> None:
    """The anthropic client's own accumulation of the FAKE stream is the whole message it stands for;
    the openai client's accumulation of the translated stream is that message's translation."""
    stream = _fake_stream()
    message = _accumulated_by_anthropic(stream)
    assert message["content"][2] == {
        "type": "tool_use",
        "id": "toolu_a",
        "name": "Read",
        "input": {"path": "a.txt"},
    }
    whole = ChatCompletion.model_validate(_whole(message))
    streamed = _accumulated(_translate(stream, split=1))
    assert _said(streamed.choices[0].message) == _said(whole.choices[0].message)
    assert _said(whole.choices[0].message) == {
        "content": "Reading é files.",
        "reasoning": "Let me look.",
        "calls": [("toolu_a", "Read", {"path": "a.txt"}), ("toolu_b", "Bash", {"cmd": "ls"})],
    }
    assert streamed.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
    assert streamed.usage == whole.usage
    assert (streamed.id, streamed.model, streamed.created) == (whole.id, whole.model, whole.created)


def test_a_recorded_llama_server_anthropic_stream() -> None:
    stream = (STREAMS / "anthropic_messages.sse").read_bytes()
    text = "".join(
        json.loads(line[6:])["delta"]["text"]
        for line in stream.decode().splitlines()
        if line.startswith('data: {"type":"content_block_delta"')
    )
    out = _translate(stream, split=1)
    assert out == _translate(stream)
    completion = _accumulated(out)
    assert completion.id == "chatcmpl-qNvKXDXUQyE1MUac00u7RwAVobnrvSU1"  # an OpenAI id already: kept
    assert completion.choices[0].message.content == text
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (34, 5)
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 33


def test_message_stop_without_message_delta_still_finishes() -> None:
    stream = _sse(
        _start(),
        _block(0, {"type": "text", "text": "Hi"}),
        _stop(0),
        {"type": "message_stop"},
    )
    chunks = _chunks(_translate(stream))
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["prompt_tokens"] == 25


def test_an_error_event_is_an_openai_error_chunk_and_ends_the_stream() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    stream = _sse(
        _start(),
        _block(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "Hi"}),
        error,
    )
    stream += b'event: message_stop\ndata: {"type":"message_stop"}\n\n'  # after the error: not read
    for split in (None, 1):
        t = ChatAnswer("asked", created=CREATED)
        out = b"".join(
            t.feed(stream[i : i + (split or len(stream))])
            for i in range(0, len(stream), split or len(stream))
        )
        assert t.over
        datas = _datas(out)
        assert "[DONE]" not in datas
        for data in datas[:-1]:
            ChatCompletionChunk.model_validate_json(data)
        assert json.loads(datas[-1]) == {
            "error": {"message": "Overloaded", "type": "unavailable_error", "param": None, "code": 529}
        }  # fmt: skip


def test_a_cut_stream_does_not_end_as_whole() -> None:
    stream = _fake_stream()
    out = _translate(stream[: stream.index(b"event: message_delta")])
    assert "[DONE]" not in _datas(out)
    assert all(json.loads(d)["choices"][0]["finish_reason"] is None for d in _datas(out))


@pytest.mark.parametrize("garbage", [b"data: not json\n\n", b"data: [1]\n\n"])
def test_a_stream_that_is_no_anthropic_stream_is_a_stream_error(garbage: bytes) -> None:
    t = ChatAnswer("asked")
    t.feed(_sse(_start()))
    with pytest.raises(StreamError):
        t.feed(garbage)


def test_the_translator_is_a_dialect_translator() -> None:
    from rocmforge_supervisor.service.core._dialect import Translator

    t: Translator = ChatAnswer("asked")
    assert (t.stream_type, t.whole_type, t.over, t.end()) == (
        "text/event-stream",
        "application/json",
        False,
        b"",
    )


# -- the real openai client, through a gateway made of the two functions ------------------------------


def _gateway(stream: bytes, message: dict[str, Any], seen: list[dict[str, Any]]) -> openai.OpenAI:
    """An ``openai`` client whose server translates each request and answers ``message`` (or
    ``stream``, streamed) from a FAKE Anthropic upstream, translated back."""

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        body = _body(json.loads(request.content))
        seen.append(body)
        translator = ChatAnswer(json.loads(request.content)["model"], created=CREATED)
        if body.get("stream"):
            chunks = _chunks_of(translator, stream)
            return httpx.Response(200, headers={"content-type": translator.stream_type}, content=chunks)
        content = translator.whole(json.dumps(message).encode())
        return httpx.Response(200, headers={"content-type": translator.whole_type}, content=content)

    transport = httpx.MockTransport(answer)
    return openai.OpenAI(
        api_key="k",
        base_url="http://gateway.test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=transport),
    )


def _chunks_of(translator: ChatAnswer, stream: bytes) -> Iterator[bytes]:
    for i in range(0, len(stream), 5):
        piece = translator.feed(stream[i : i + 5])
        if piece:
            yield piece
        if translator.over:
            return
    yield translator.end()


def test_the_openai_client_through_the_translation() -> None:
    stream = _fake_stream()
    message = _accumulated_by_anthropic(stream)
    seen: list[dict[str, Any]] = []
    client = _gateway(stream, message, seen)
    request: dict[str, Any] = {
        "model": "claude-x",
        "max_completion_tokens": 100,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Read a.txt"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                ],
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "Read", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    whole = client.chat.completions.create(**request)
    assert whole.model == "claude-x" and whole.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in whole.choices[0].message.tool_calls or [] if c.type == "function"] == [
        "Read",
        "Bash",
    ]
    with client.chat.completions.stream(**request) as events:
        streamed = events.get_final_completion()
    assert _said(streamed.choices[0].message) == _said(whole.choices[0].message)
    assert whole.choices[0].message.content == "Reading é files."
    assert streamed.usage == whole.usage
    assert seen[0]["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert seen[0]["max_tokens"] == 100 and seen[0]["system"] == "Be brief."
    assert seen[1] == {**seen[0], "stream": True}
    client.close()


def test_the_openai_client_raises_the_streams_error() -> None:
    error = {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down"}}
    stream = _sse(
        _start(),
        _block(0, {"type": "text", "text": ""}),
        _delta(0, {"type": "text_delta", "text": "Hi"}),
        error,
    )
    client = _gateway(stream, _message(), [])
    got: list[str] = []
    with pytest.raises(openai.APIError) as err:
        for chunk in client.chat.completions.create(
            model="claude-x", messages=[{"role": "user", "content": "x"}], stream=True
        ):
            got.append(chunk.choices[0].delta.content or "")
    assert got == ["", "Hi"]
    assert err.value.message == "Slow down"
    assert isinstance(err.value.body, dict) and err.value.body["type"] == "rate_limit_error"
    client.close()
