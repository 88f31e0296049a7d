"""Ollama's stream translator as the forwarder pushes it the child's chunks (``Translator.feed``):
an SSE event split anywhere between chunks, an error event that ends the answer, llama-server's
native stream ending at its ``stop``. The chunks are written here (a FAKE byte stream: a real
child cannot be made to split its events at chosen bytes); tests/gateway/test_ollama.py streams
through the real llama-server."""

from __future__ import annotations

import json
import time
from typing import Any

from rocmforge_supervisor.service.ollama._api import _OllamaAnswer
from rocmforge_supervisor.service.ollama._convert import Target


def _sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n" for e in events
    )


def _delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def _lines(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.splitlines()]


def _answer(kind: str = "chat") -> _OllamaAnswer:
    path = "/completion" if kind == "native" else "/v1/chat/completions"
    return _OllamaAnswer("m", Target(path, {}, kind=kind), time.perf_counter(), generate=kind == "native")


def test_events_split_at_every_byte_come_out_whole_and_in_order() -> None:
    stream = _sse(_delta("Hel"), _delta("lo"), _delta("", "stop"), "[DONE]")
    answer = _answer()
    out = b"".join(answer.feed(stream[i : i + 1]) for i in range(len(stream)))
    # [DONE] ends the answer: its last line goes out then, not when the child's body ends (the
    # forwarder reads no more and does not call end()).
    assert answer.over
    lines = _lines(out)
    assert [line["message"]["content"] for line in lines] == ["Hel", "lo", ""]
    assert [line["done"] for line in lines] == [False, False, True]
    assert lines[-1]["done_reason"] == "stop"


def test_a_stream_that_ends_without_done_gets_its_last_line_from_end() -> None:
    answer = _answer()
    out = answer.feed(_sse(_delta("Hel"), _delta("lo", "stop")))
    assert not answer.over
    lines = _lines(out + answer.end())
    assert [line["done"] for line in lines] == [False, False, True]
    assert lines[-1]["done_reason"] == "stop"


def test_a_chunk_that_completes_no_event_gives_nothing() -> None:
    answer = _answer()
    assert answer.feed(b'data: {"choices": [') == b""
    assert (
        _lines(answer.feed(b'{"index": 0, "delta": {"content": "x"}}]}\n\n'))[0]["message"]["content"] == "x"
    )


def test_an_error_event_is_the_last_line_and_ends_the_answer() -> None:
    answer = _answer()
    out = answer.feed(_sse(_delta("a"), {"error": {"message": "context full", "code": 500}}, _delta("never")))
    assert answer.over  # the forwarder reads no more and does not call end()
    first, last = _lines(out)  # nothing after the error: "never" is not sent
    assert first["message"]["content"] == "a"
    assert last == {"error": "context full"}


def test_the_native_stream_ends_at_its_stop() -> None:
    answer = _answer("native")
    out = answer.feed(_sse({"content": "a", "stop": False}))
    assert not answer.over and _lines(out)[0]["response"] == "a"
    out = answer.feed(_sse({"content": "", "stop": True, "timings": {}}, {"content": "late"}))
    assert answer.over
    (last,) = _lines(out)
    assert last["done"] is True
    assert answer.end() == b""
