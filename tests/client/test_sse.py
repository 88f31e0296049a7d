"""The SSE decoding layer, on streams recorded from the real llama-server (scripts/record_streams.py).

The recorded streams are cut at random points and at every byte; the events must not depend on
where the cuts fall, nor on the line-ending style. A model serializer generates further streams
(multi-line data, comments, event/id/retry fields, BOM, mixed endings) with a known decoding.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocmforge_supervisor._errors import (
    ContextExceeded,
    ForgeError,
    RequestError,
    RequestRejected,
    ServerError,
    ServerUnavailable,
    StreamError,
)
from rocmforge_supervisor.client._sse import (
    SSEDecoder,
    SSEEvent,
    aiter_chunks,
    error_from_body,
    iter_chunks,
)

STREAMS = Path(__file__).resolve().parent.parent / "fixtures" / "streams"
REAL = ["chat_include_usage.sse", "completions.sse", "native_completion.sse", "tiny_completions.sse"]
REAL_ERROR = "tiny_chat_midstream_error.sse"  # the tiny GGUF built with invalid_utf8=True
ALL = [*REAL, REAL_ERROR, "fake_midstream_error.sse"]


def _raw(name: str) -> bytes:
    return (STREAMS / name).read_bytes()


def decode(parts: list[bytes]) -> tuple[list[SSEEvent], bool]:
    dec = SSEDecoder()
    events: list[SSEEvent] = []
    for part in parts:
        events += dec.feed(part)
    assert dec.close() == []
    return events, dec.ended_mid_event


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def with_endings(data: bytes, ending: bytes) -> bytes:
    # JSON escapes CR and LF inside strings, so every LF in a recorded stream is a line ending.
    return data.replace(b"\n", ending)


# -- the recorded streams -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_recorded_stream_decodes_to_one_event_per_data_line(name: str) -> None:
    raw = _raw(name)
    events, mid = decode([raw])
    assert not mid
    n_data_lines = raw.count(b"\ndata: ") + raw.startswith(b"data: ")
    assert n_data_lines > 0
    assert len(events) == n_data_lines
    assert all(e.event == "message" and e.id is None and e.retry is None for e in events)
    for e in events:
        assert e.data == "[DONE]" or isinstance(json.loads(e.data), dict)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_split_gives_the_same_events(name: str, data: st.DataObject) -> None:
    ending = data.draw(st.sampled_from([b"\n", b"\r\n", b"\r"]), label="ending")
    raw = with_endings(_raw(name), ending)
    points = data.draw(st.lists(st.integers(0, len(raw)), max_size=40), label="cuts")
    assert decode(cut(raw, points)) == decode([_raw(name)])


@pytest.mark.parametrize("name", ALL)
def test_single_bytes_give_the_same_events(name: str) -> None:
    raw = _raw(name)
    whole = decode([raw])
    for ending in (b"\n", b"\r\n", b"\r"):
        variant = with_endings(raw, ending)
        assert decode([variant[i : i + 1] for i in range(len(variant))]) == whole


def test_recorded_stream_holds_multibyte_utf8() -> None:
    # Splitting inside a character is only tested if the recordings have such characters.
    raw = _raw("chat_include_usage.sse") + _raw("completions.sse")
    assert any(b >= 0x80 for b in raw)


# -- a model serializer: random streams with a known decoding -------------------------------------


def _chars(exclude: str) -> st.SearchStrategy[str]:
    return st.characters(exclude_characters=exclude, exclude_categories=["Cs"])  # Cs: surrogates


_text = st.text(_chars("\r\n"), max_size=12)
_block = st.fixed_dictionaries(
    {
        "data": st.lists(_text, max_size=3),
        "event": st.none() | st.text(_chars("\r\n"), min_size=1, max_size=6),
        "id": st.none() | st.text(_chars("\r\n\0"), max_size=6),
        "retry": st.none() | st.integers(0, 10**6),
        "comment": st.booleans(),
    }
)


def _serialize(
    blocks: list[dict[str, object]], endings: list[bytes], bom: bool
) -> tuple[bytes, list[SSEEvent]]:
    lines: list[str] = []
    expected: list[SSEEvent] = []
    last_id: str | None = None
    for b in blocks:
        if b["comment"]:
            lines.append(": keep-alive")
        if b["event"] is not None:
            lines.append(f"event: {b['event']}")
        if b["id"] is not None:
            lines.append(f"id:{b['id']}" if not str(b["id"]).startswith(" ") else f"id: {b['id']}")
            last_id = str(b["id"])
        if b["retry"] is not None:
            lines.append(f"retry: {b['retry']}")
        data = [str(d) for d in b["data"]]  # type: ignore[attr-defined]
        lines += [f"data: {d}" if d.startswith(" ") or i % 2 else f"data:{d}" for i, d in enumerate(data)]
        lines.append("")
        if data:
            expected.append(
                SSEEvent(
                    event=str(b["event"]) if b["event"] else "message",
                    data="\n".join(data),
                    id=last_id,
                    retry=b["retry"],  # type: ignore[arg-type]
                )
            )
    out = bytearray(b"\xef\xbb\xbf" if bom else b"")
    prev = b"\n"
    for i, line in enumerate(lines):
        ending = endings[i % len(endings)]
        if prev == b"\r" and not line and ending == b"\n":
            ending = b"\r"  # CR then an empty line ended by LF would read as one CRLF
        out += line.encode() + ending
        prev = ending
    return bytes(out), expected


@settings(max_examples=300, deadline=None)
@given(
    blocks=st.lists(_block, max_size=8),
    endings=st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=1, max_size=5),
    bom=st.booleans(),
    data=st.data(),
)
def test_generated_streams_decode_as_serialized(
    blocks: list[dict[str, object]], endings: list[bytes], bom: bool, data: st.DataObject
) -> None:
    raw, expected = _serialize(blocks, endings, bom)
    points = data.draw(st.lists(st.integers(0, len(raw)), max_size=20), label="cuts")
    assert decode(cut(raw, points)) == (expected, False)


# -- spec cases ------------------------------------------------------------------------------------


def test_multiline_data_is_joined_with_lf() -> None:
    assert decode([b"data: one\ndata:two\ndata\ndata:  four\n\n"])[0] == [SSEEvent(data="one\ntwo\n\n four")]


def test_comments_are_ignored() -> None:
    assert decode([b":\n\n: ping\n\ndata: x\n:mid\n\n:\n\n"]) == ([SSEEvent(data="x")], False)


def test_event_id_retry_fields() -> None:
    events, _ = decode([b"event: a\nid: 1\nretry: 250\ndata: x\n\ndata: y\n\nid\nretry: 1x\ndata: z\n\n"])
    assert events == [
        SSEEvent(event="a", data="x", id="1", retry=250),
        SSEEvent(data="y", id="1"),  # the last event ID persists; event type and retry do not
        SSEEvent(data="z", id=""),  # "id" with no value clears it; a non-digit retry is ignored
    ]


def test_id_with_nul_is_ignored_and_unknown_fields_too() -> None:
    events, _ = decode([b"id: 5\n\nid: a\x00b\nfoo: bar\ndata: x\n\n"])
    assert events == [SSEEvent(data="x", id="5")]


def test_retry_must_be_ascii_digits() -> None:
    raw = "retry:  12\ndata: a\n\nretry: \u0661\u0662\ndata: b\n\nretry: +3\ndata: c\n\nretry:7\ndata: d\n\n"
    assert [e.retry for e in decode([raw.encode()])[0]] == [None, None, None, 7]


def test_block_without_data_is_not_dispatched() -> None:
    assert decode([b"event: ping\n\nretry: 10\n\nid: 3\n\n"]) == ([], False)


def test_cr_at_chunk_end_and_lf_at_next_start_are_one_line_ending() -> None:
    assert decode([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])[0] == [SSEEvent(data="a\nb")]
    # ...whereas CR then CR is two endings: a blank line, so the event is dispatched.
    assert decode([b"data: a\r", b"\r", b"data: b\r\r"])[0] == [SSEEvent(data="a"), SSEEvent(data="b")]


def test_event_ending_in_cr_is_dispatched_without_waiting_for_more() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: a\r\r") == [SSEEvent(data="a")]
    assert dec.feed(b"\ndata: b\n\n") == [SSEEvent(data="b")]  # that LF belonged to the CR


@pytest.mark.parametrize("text", ["é", "€", "😀", "\u2028", "\u0085"])
def test_multibyte_character_split_anywhere(text: str) -> None:
    raw = f"data: a{text}b\n\n".encode()
    for i in range(len(raw) + 1):
        for j in range(i, len(raw) + 1):
            assert decode([raw[:i], raw[i:j], raw[j:]])[0] == [SSEEvent(data=f"a{text}b")]


def test_line_separator_characters_do_not_end_lines() -> None:
    # llama-server's JSON writer emits U+2028/U+0085 raw; str.splitlines would cut the line there.
    payload = json.dumps({"content": "x\u2028y\u0085z\x0c"}, ensure_ascii=False)
    assert decode([f"data: {payload}\n\n".encode()])[0] == [SSEEvent(data=payload)]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert decode([b"data: a\xffb\n\n"])[0] == [SSEEvent(data="a\ufffdb")]


def test_bom_stripped_once_even_when_split() -> None:
    bom = b"\xef\xbb\xbf"
    assert decode([bom[:1], bom[1:2], bom[2:] + b"data: x\n\n"])[0] == [SSEEvent(data="x")]
    # A second BOM is part of the field name, which is then unknown: that line is ignored.
    assert decode([bom + bom + b"data: x\n\ndata: y\n\n"])[0] == [SSEEvent(data="y")]
    # Bytes that only look like the start of a BOM are kept.
    assert decode([b"\xef", b"\xbb", b"!\n", b"data: z\n\n"])[0] == [SSEEvent(data="z")]


def test_close_drops_an_unterminated_event_and_says_so() -> None:
    for tail in (b"data: cut", b"data: done\n", b"event: x\n", b"\xef"):
        events, mid = decode([b"data: a\n\n", tail])
        assert events == [SSEEvent(data="a")]
        assert mid, tail
    assert decode([b"data: a\n\n: trailing comment\n"]) == ([SSEEvent(data="a")], False)
    assert decode([]) == ([], False)


def test_feed_after_close_is_an_error() -> None:
    dec = SSEDecoder()
    dec.close()
    with pytest.raises(ValueError, match="after close"):
        dec.feed(b"data: x\n\n")


# -- JSON chunks -----------------------------------------------------------------------------------


def _parts(raw: bytes, size: int = 7) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def test_chat_stream_chunks() -> None:
    raw = _raw("chat_include_usage.sse")
    chunks = list(iter_chunks(_parts(raw)))
    assert len(chunks) == raw.count(b"data: ") - 1  # all but [DONE]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()


@pytest.mark.parametrize("name", ["completions.sse", "tiny_completions.sse"])
def test_completions_stream_chunks(name: str) -> None:
    chunks = list(iter_chunks(_parts(_raw(name))))
    assert chunks[-1]["usage"]["completion_tokens"] == len(chunks) - 1
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["object"] == "text_completion" for c in chunks)


def test_native_completion_needs_require_done_false() -> None:
    raw = _raw("native_completion.sse")
    chunks = list(iter_chunks(_parts(raw), require_done=False))
    assert chunks[-1]["stop"] is True
    with pytest.raises(StreamError, match=r"without data: \[DONE\]"):
        list(iter_chunks(_parts(raw)))


def test_stops_at_done_without_reading_further() -> None:
    source = iter([b'data: {"a":1}\n\ndata: [DONE]\n\n', b"not even sse", b"data: garbage\n\n"])
    assert list(iter_chunks(source)) == [{"a": 1}]
    assert next(source) == b"not even sse"


def test_missing_done_is_a_stream_error() -> None:
    raw = _raw("chat_include_usage.sse")
    without_done = raw[: raw.rindex(b"data: [DONE]")]
    seen: list[dict[str, object]] = []
    with pytest.raises(StreamError, match="without data"):
        seen.extend(iter_chunks(_parts(without_done)))
    assert len(seen) == raw.count(b"data: ") - 1


def test_stream_cut_mid_event_is_a_stream_error() -> None:
    raw = _raw("completions.sse")
    with pytest.raises(StreamError, match="middle of an event"):
        list(iter_chunks([raw[: len(raw) // 2]]))
    with pytest.raises(StreamError, match="middle of an event"):
        list(iter_chunks([raw[: len(raw) // 2]], require_done=False))


@pytest.mark.parametrize("name", [REAL_ERROR, "fake_midstream_error.sse"])
def test_midstream_error_raises_after_the_chunks_before_it(name: str) -> None:
    raw = _raw(name)
    seen: list[dict[str, object]] = []
    with pytest.raises(ServerError) as info:
        seen.extend(iter_chunks(_parts(raw, 100)))
    assert len(seen) == raw.count(b"data: ") - 1
    err = info.value
    assert type(err) is ServerError
    assert err.status_code == 500 and err.error_type == "server_error"
    assert json.loads(raw[raw.rindex(b"data: ") + 6 :])["error"]["message"] in str(err) and err.hint


def test_midstream_context_error_is_typed() -> None:
    body = {"error": {"code": 400, "message": "too long", "type": "exceed_context_size_error",
                      "n_prompt_tokens": 70, "n_ctx": 64}}  # fmt: skip
    with pytest.raises(ContextExceeded) as info:
        list(iter_chunks([f"data: {json.dumps(body)}\n\n".encode()]))
    assert (info.value.n_prompt_tokens, info.value.n_ctx, info.value.status_code) == (70, 64, 400)


@pytest.mark.parametrize("payload", [b"hello", b"{broken", b"[1, 2]", b"42", b""])
def test_non_json_or_non_object_payload_is_a_stream_error(payload: bytes) -> None:
    with pytest.raises(StreamError, match="not"):
        list(iter_chunks([b'data: {"ok":true}\n\ndata: ' + payload + b"\n\ndata: [DONE]\n\n"]))


def test_aiter_chunks_matches_iter_chunks() -> None:
    raw = _raw("chat_include_usage.sse")

    async def source(data: bytes) -> AsyncIterator[bytes]:
        for part in _parts(data, 13):
            yield part

    async def collect(data: bytes, **kw: bool) -> list[dict[str, object]]:
        return [c async for c in aiter_chunks(source(data), **kw)]

    assert anyio.run(collect, raw) == list(iter_chunks([raw]))
    with pytest.raises(StreamError):
        anyio.run(collect, raw[: raw.rindex(b"data: [DONE]")])
    with pytest.raises(ServerError):
        anyio.run(collect, _raw("fake_midstream_error.sse"))
    native = anyio.run(lambda: collect(_raw("native_completion.sse"), require_done=False))
    assert native[-1]["stop"] is True


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_iter_chunks_independent_of_splits(data: st.DataObject) -> None:
    raw = _raw("completions.sse")
    points = data.draw(st.lists(st.integers(0, len(raw)), max_size=30))
    assert list(iter_chunks(cut(raw, points))) == list(iter_chunks([raw]))


# -- error bodies ----------------------------------------------------------------------------------


def test_recorded_exceed_context_body() -> None:
    body = _raw("error_400_exceed_context.json")
    err = error_from_body(400, body)
    assert isinstance(err, ContextExceeded)
    assert err.status_code == 400 and err.n_ctx == 256  # the recording used -c 256
    assert err.n_prompt_tokens is not None and err.n_prompt_tokens > 256
    assert json.loads(body)["error"]["message"] in str(err)


def _body(code: int | None, etype: str, message: str) -> str:
    err: dict[str, object] = {"message": message, "type": etype}
    if code is not None:
        err["code"] = code
    return json.dumps({"error": err})


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (401, _body(401, "authentication_error", "Invalid API Key"), RequestRejected),
        (400, _body(400, "invalid_request_error", "'messages' is required"), RequestRejected),
        (404, _body(404, "not_found_error", "File Not Found"), RequestRejected),
        (403, _body(None, "feature_disabled", "this feature is disabled"), RequestRejected),
        (503, _body(503, "unavailable_error", "Loading model"), ServerUnavailable),
        (500, _body(500, "server_error", "Compute error."), ServerError),
        (501, _body(501, "not_supported_error", "no slots endpoint"), ServerError),
        (500, "Internal Server Error", ServerError),
        (503, "Service Unavailable", ServerUnavailable),
        (413, b"", RequestRejected),
        (502, b"<html>bad gateway</html>", ServerError),
        (400, '{"detail": "not llama-server shaped"}', RequestRejected),
    ],
)
def test_error_from_body(status: int, body: str | bytes, cls: type[RequestError]) -> None:
    err = error_from_body(status, body)
    assert type(err) is cls
    assert isinstance(err, ForgeError) and err.hint
    assert err.status_code == status
    assert "\n" not in str(err)
    text = body.decode() if isinstance(body, bytes) else body
    message = json.loads(text)["error"]["message"] if text.startswith('{"error"') else None
    if message:
        assert message in str(err)


def test_error_from_body_auth_hint_names_the_key() -> None:
    err = error_from_body(401, _body(401, "authentication_error", "Invalid API Key"))
    assert err.hint is not None and "API key" in err.hint
    assert err.error_type == "authentication_error"
