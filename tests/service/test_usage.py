"""``_usage``: an answer's tokens, read the same way from every dialect's shape.

The streams are recorded from the real llama-server (the pinned build, SmolLM2-135M) under
tests/fixtures/streams: ``chat_no_usage.sse`` is a chat stream as the OpenAI SDK asks for it by
default (no ``stream_options``), ``anthropic_messages.sse`` a ``/v1/messages`` stream whose prompt
was mostly read from the cache, ``responses.sse`` a ``/v1/responses`` stream.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmforge_supervisor.service.core._usage import StreamMeter, Used, ends_stream, used_in

STREAMS = Path(__file__).parents[1] / "fixtures" / "streams"


def _events(name: str) -> list[bytes]:
    """The recorded stream, one SSE event per chunk (as llama-server writes them)."""
    raw = (STREAMS / name).read_bytes()
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]


def _metered(path: str, chunks: list[bytes]) -> Used:
    meter = StreamMeter(path)
    for chunk in chunks:
        meter.feed(chunk)
    return meter.used()


def _last(name: str, field: str) -> dict[str, int]:
    """``field`` of the last event of the recorded stream ``name`` that has one."""
    found: dict[str, int] = {}
    for event in _events(name):
        data = event.split(b"data: ", 1)[-1].strip()
        if data.startswith(b"{"):
            found = json.loads(data).get(field) or found
    assert found, f"no {field} in {name}"
    return found


def test_a_chat_stream_without_usage_is_counted_from_the_timings_of_its_last_event() -> None:
    assert b'"usage"' not in (STREAMS / "chat_no_usage.sse").read_bytes()
    t = _last("chat_no_usage.sse", "timings")
    used = _metered("/v1/chat/completions", _events("chat_no_usage.sse"))
    assert used == Used(t["prompt_n"] + t["cache_n"], t["predicted_n"], t["cache_n"])
    assert used.completion == 5 and used.prompt  # max_tokens 5


def test_a_chat_stream_with_usage_is_counted_from_its_usage() -> None:
    usage = _last("chat_include_usage.sse", "usage")
    used = _metered("/v1/chat/completions", _events("chat_include_usage.sse"))
    assert (used.prompt, used.completion) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_an_anthropic_stream_counts_its_whole_prompt_cached_part_included() -> None:
    events = _events("anthropic_messages.sse")
    used = _metered("/v1/messages", events)
    start = json.loads(events[0].split(b"data: ", 1)[1])["message"]["usage"]
    assert start["cache_read_input_tokens"] > 0  # the recording read most of its prompt from cache
    assert used == Used(
        start["input_tokens"] + start["cache_read_input_tokens"], 5, start["cache_read_input_tokens"]
    )


def test_a_responses_stream_counts_from_its_completed_event() -> None:
    used = _metered("/v1/responses", _events("responses.sse"))
    assert used.completion == 5 and used.prompt and used.prompt > 5


@pytest.mark.parametrize(
    ("path", "name", "cut", "produced"),
    [
        # role-only first event, then "1", ".", " Red": three tokens before the cut
        ("/v1/chat/completions", "chat_no_usage.sse", 4, 3),
        # message_start, content_block_start, then two text deltas
        ("/v1/messages", "anthropic_messages.sse", 4, 2),
        # created, in_progress, item added, part added, then two deltas
        ("/v1/responses", "responses.sse", 6, 2),
    ],
)
def test_a_stream_the_client_left_is_charged_what_it_produced(
    path: str, name: str, cut: int, produced: int
) -> None:
    used = _metered(path, _events(name)[:cut])
    assert used.completion == produced
    if path == "/v1/messages":  # its first event said the prompt
        start = json.loads(_events(name)[0].split(b"data: ", 1)[1])["message"]["usage"]
        assert used.prompt == start["input_tokens"] + start["cache_read_input_tokens"]


def test_a_native_stream_cut_short_says_its_counts_in_every_event() -> None:
    events = _events("native_completion.sse")
    used = _metered("/completion", events[:3])
    assert used == Used(6, 3)  # tokens_evaluated / tokens_predicted of the third event


def test_events_coalesced_into_one_chunk_count_each() -> None:
    events = _events("chat_no_usage.sse")[:4]
    assert _metered("/v1/chat/completions", [b"".join(events)]).completion == 3


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":9,"total_tokens":12,'
            b'"prompt_tokens_details":{"cached_tokens":4}},"timings":{"cache_n":4,"prompt_n":5,"predicted_n":3}}',
            Used(9, 3, 4),
        ),
        (  # llama-server's /v1/messages answer
            b'{"type":"message","content":[{"type":"text","text":"1. Red"}],"stop_reason":"max_tokens",'
            b'"usage":{"cache_read_input_tokens":33,"input_tokens":1,"output_tokens":3}}',
            Used(34, 3, 33),
        ),
        (  # the native /completion answer: no usage, its timings
            b'{"content":"x","tokens_predicted":3,"tokens_evaluated":3,'
            b'"timings":{"cache_n":0,"prompt_n":3,"prompt_ms":1.0,"predicted_n":3}}',
            Used(3, 3, 0),
        ),
        (b'{"object":"list","data":[],"usage":{"prompt_tokens":4,"total_tokens":4}}', Used(4, None, None)),
        (b'{"tokens":[1,2,3]}', None),
        # A reply whose text quotes "usage" is not mistaken for it (the text is JSON-escaped).
        (b'{"content":"the \\"usage\\": {} field","tokens_predicted":2,"tokens_evaluated":1}', Used(1, 2)),
    ],
)
def test_whole_answers(body: bytes, expected: Used | None) -> None:
    assert used_in(body) == expected


def test_an_anthropic_stream_in_one_chunk_or_split_mid_event_still_says_its_prompt() -> None:
    events = _events("anthropic_messages.sse")
    start = json.loads(events[0].split(b"data: ", 1)[1])["message"]["usage"]
    prompt = start["input_tokens"] + start["cache_read_input_tokens"]
    whole = b"".join(events)  # a fast stream: every event in one read, message_delta's usage last
    assert _metered("/v1/messages", [whole]) == Used(prompt, 5, start["cache_read_input_tokens"])
    cut = whole.index(b'"input_tokens"')  # message_start split in the middle of its usage
    assert _metered("/v1/messages", [whole[:cut], whole[cut:]]).prompt == prompt


#: (a stream's tail, whether its last whole event ends it), in every dialect's framing.
_TAILS: dict[str, tuple[bytes, bool]] = {
    "openai done": (b'data: {"choices":[{"delta":{}}]}\n\ndata: [DONE]\n\n', True),
    "openai done, crlf": (b'data: {"choices":[]}\r\n\r\ndata: [DONE]\r\n\r\n', True),
    "openai done, then a ping": (b"data: [DONE]\n\n: ping\n\n", True),
    "text that says [DONE]": (
        b'data: [DONE]\n\ndata: {"choices":[{"delta":{"content":"data: [DONE]"}}]}\n\n',
        False,
    ),
    "openai mid-stream": (b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n', False),
    "anthropic stop": (
        b'event: message_delta\ndata: {"type":"message_delta"}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n',
        True,
    ),
    "text that says message_stop": (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"\\"type\\":\\"message_stop\\""}}\n\n',
        False,
    ),
    "responses completed": (
        b'event: response.completed\ndata: {"type":"response.completed","response":{}}\n\n',
        True,
    ),
    "native stop": (b'data: {"content":"","stop":true}\n\n', True),
    "native token": (b'data: {"content":"stop","stop":false}\n\n', False),
    "an end event cut by the tail": (b'"output":[]}}\n\n', False),
    "nothing": (b"", False),
}


@pytest.mark.parametrize("case", list(_TAILS))
def test_a_stream_ends_only_at_its_end_event(case: str) -> None:
    tail, ends = _TAILS[case]
    assert ends_stream(tail) is ends


@pytest.mark.parametrize("name", sorted(p.name for p in STREAMS.glob("*.sse")))
def test_the_real_servers_streams_end_where_they_end(name: str) -> None:
    """Each recorded stream, as the meter's tail holds it: whole, it ends unless it broke with an
    error event; cut in half, it does not."""
    raw = (STREAMS / name).read_bytes()
    meter = StreamMeter("/v1/chat/completions")
    meter.feed(raw)
    assert ends_stream(meter.tail) is ("error" not in name)
    assert not ends_stream(raw[: len(raw) // 2])
