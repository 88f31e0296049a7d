"""A FAKE upstream model server: a test double for "another OpenAI- or Anthropic-compatible
server" that the product proxies to as a *peer*.

It is not a model and computes nothing: every answer is a deterministic echo
(``echo from MODEL: <last user text>``). It speaks just enough of the two public protocols for a
proxy and for the real ``openai`` and ``anthropic`` client libraries (tests/support_checks
checks both talk to it), on the standard library only: an ``http.server.ThreadingHTTPServer`` in a
daemon thread, bound to 127.0.0.1 on a port the OS picks.

::

    with FakePeer(api="openai", models=["m1", "m2"], key="peer-secret") as peer:
        peer.url         # "http://127.0.0.1:PORT"
        peer.requests    # [Recorded(method, path, headers, body, json), ...]
        peer.mode = "hang"   # "ok" | "hang" | "error500" | "drop", at any time

``api="openai"``: ``GET /v1/models``, ``POST /v1/chat/completions`` (a tool call when the request
has ``tools`` and the last user message says "weather"), ``POST /v1/completions``,
``POST /v1/embeddings`` (8 floats per input; ``encoding_format="base64"`` honoured), each streamed
(``data:`` chunks, the last with ``finish_reason`` and ``usage``, then ``data: [DONE]``) or whole.
``api="anthropic"``: ``GET /v1/models`` and ``POST /v1/messages`` (whole, or Anthropic's SSE
events with ``event:`` lines; a ``tool_use`` block under the same "weather" rule). Any other
route, and the other API's routes, answer 404; a model not in ``models`` answers 404; a request
without ``key`` (``Authorization: Bearer KEY`` for OpenAI; ``x-api-key: KEY`` or that same
Bearer for Anthropic, as its API and its Python SDK 2.x use) answers 401 — each in the API's own error shape.

Every request is recorded (:class:`Recorded`) before anything else happens, then ``mode`` applies:
``"hang"`` reads the request and never answers until the peer is closed, ``"error500"`` answers 500
with an error body, ``"drop"`` closes the connection without a byte. ``first_byte_delay`` (seconds)
is waited before the status line of any answer. Whole answers carry ``Content-Length`` (HTTP/1.1
keep-alive); streams carry ``Connection: close`` and are flushed event by event.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, cast, get_args
from urllib.parse import urlsplit

__all__ = ["Api", "FakePeer", "Mode", "Recorded"]

Api = Literal["openai", "anthropic"]
Mode = Literal["ok", "hang", "error500", "drop"]

#: Length of every embedding vector.
EMBEDDING_DIM = 8

#: The arguments of every tool call the fake makes.
TOOL_ARGUMENTS = {"city": "Paris"}


@dataclass(frozen=True)
class Recorded:
    """One request as the peer received it."""

    method: str
    #: The request target as sent (query string included).
    path: str
    #: Header names in lower case; a repeated header's values joined with ", ".
    headers: dict[str, str]
    body: bytes
    #: The body parsed as JSON, or None (no body, or not JSON).
    json: Any


class _HttpError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # not_found | auth | invalid | model_not_found | server
        self.message = message


def _text_of(content: Any) -> str:
    """A message's text: a string, or the ``text`` of its text parts (both APIs' shape)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _words(text: str) -> int:
    return max(1, len(text.split()))


def _pieces(text: str, at_least: int = 3) -> list[str]:
    """``text`` cut into ``at_least`` or more pieces that join back to it."""
    parts = re.findall(r"\S+\s*|\s+", text)
    while len(parts) < at_least:
        longest = max(range(len(parts)), key=lambda i: len(parts[i])) if parts else -1
        if longest < 0 or len(parts[longest]) < 2:
            parts.extend([""] * (at_least - len(parts)))
            break
        p = parts[longest]
        parts[longest : longest + 1] = [p[: len(p) // 2], p[len(p) // 2 :]]
    return parts


def _embedding(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round((b - 128) / 128, 6) for b in digest[:EMBEDDING_DIM]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() joins handler threads itself, with a deadline
    allow_reuse_address = True

    def __init__(self, peer: FakePeer) -> None:
        self.peer = peer
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the FQDN (a reverse DNS query): not needed here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        with self._lock:
            self._open.add(request)
            self._handlers.add(t)
        t.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._handlers.discard(threading.current_thread())

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer is not the test's failure

    def cut_connections(self) -> None:
        """Unblock every handler: reads see EOF, writes fail."""
        with self._lock:
            open_ = list(self._open)
        for s in open_:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def join_handlers(self, deadline: float) -> None:
        with self._lock:
            threads = list(self._handlers)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakePeer/1.0"
    sys_version = ""

    @property
    def peer(self) -> FakePeer:
        return cast(_Server, self.server).peer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    # --- reading -----------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers, then the blank line
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()  # the CRLF after each chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _record(self) -> Recorded:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        body = self._read_body()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        rec = Recorded(self.command, self.path, headers, body, parsed)
        self.peer._record(rec)
        return rec

    # --- the whole exchange ------------------------------------------------------------------

    def _handle(self) -> None:
        peer = self.peer
        try:
            rec = self._record()
        except (OSError, ValueError):
            self.close_connection = True
            return
        mode = peer.mode
        if mode == "hang":
            peer._stopped.wait()
            self.close_connection = True
            return
        if mode == "drop":
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if peer.first_byte_delay > 0 and peer._stopped.wait(peer.first_byte_delay):
            self.close_connection = True
            return
        try:
            if mode == "error500":
                raise _HttpError(500, "server", f"fake peer: internal server error (mode {mode!r})")
            self._check_key(rec)
            self._route(rec)
        except _HttpError as e:
            self._send_error_body(e)
        except OSError:
            self.close_connection = True

    def _check_key(self, rec: Recorded) -> None:
        key = self.peer.key
        if key is None:
            return
        if self.peer.api == "openai":
            auth = rec.headers.get("authorization", "")
            if auth != f"Bearer {key}":
                raise _HttpError(401, "auth", "Incorrect API key provided.")
        elif rec.headers.get("x-api-key") != key and rec.headers.get("authorization") != f"Bearer {key}":
            # Anthropic's API takes either; the anthropic SDK (2.x) sends its api_key as a Bearer.
            raise _HttpError(401, "auth", "invalid x-api-key")

    def _route(self, rec: Recorded) -> None:
        route = (rec.method, urlsplit(rec.path).path.rstrip("/"))
        api = self.peer.api
        if route == ("GET", "/v1/models"):
            self._send_json(200, self._models_list())
            return
        handlers = (
            {
                ("POST", "/v1/chat/completions"): self._chat,
                ("POST", "/v1/completions"): self._completions,
                ("POST", "/v1/embeddings"): self._embeddings,
            }
            if api == "openai"
            else {("POST", "/v1/messages"): self._messages}
        )
        handler = handlers.get(route)
        if handler is None:
            raise _HttpError(404, "not_found", f"fake peer ({api}): no route {rec.method} {rec.path}")
        body = rec.json
        if not isinstance(body, dict):
            raise _HttpError(400, "invalid", "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _HttpError(400, "invalid", "you must provide a model parameter")
        if model not in self.peer.models:
            raise _HttpError(
                404,
                "model_not_found",
                f"The model `{model}` does not exist or you do not have access to it.",
            )
        handler(body, model)

    # --- writing -----------------------------------------------------------------------------

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_error_body(self, e: _HttpError) -> None:
        if self.peer.api == "openai":
            kind, code = {
                "auth": ("invalid_request_error", "invalid_api_key"),
                "model_not_found": ("invalid_request_error", "model_not_found"),
                "not_found": ("invalid_request_error", "unknown_url"),
                "invalid": ("invalid_request_error", None),
                "server": ("server_error", None),
            }[e.kind]
            payload: dict[str, Any] = {"error": {"message": e.message, "type": kind, "code": code}}
        else:
            kind = {
                "auth": "authentication_error",
                "model_not_found": "not_found_error",
                "not_found": "not_found_error",
                "invalid": "invalid_request_error",
                "server": "api_error",
            }[e.kind]
            payload = {"type": "error", "error": {"type": kind, "message": e.message}}
        try:
            self._send_json(e.status, payload)
        except OSError:
            self.close_connection = True

    def _stream(self, events: Iterator[tuple[str | None, str]]) -> None:
        """An SSE answer: each ``(event name or None, data)`` written and flushed on its own."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            self.wfile.write(f"{head}data: {data}\n\n".encode())
            self.wfile.flush()

    # --- OpenAI ------------------------------------------------------------------------------

    def _models_list(self) -> dict[str, Any]:
        models = self.peer.models
        if self.peer.api == "openai":
            return {
                "object": "list",
                "data": [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in models],
            }
        return {
            "data": [
                {"id": m, "type": "model", "display_name": m, "created_at": "2025-01-01T00:00:00Z"}
                for m in models
            ],
            "has_more": False,
            "first_id": models[0] if models else None,
            "last_id": models[-1] if models else None,
        }

    def _chat(self, body: dict[str, Any], model: str) -> None:
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = _text_of(users[-1].get("content")) if users else ""
        prompt_tokens = _words(" ".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict)))
        tool = _tool_name(body.get("tools"), "openai", last)
        rid = f"chatcmpl-fake-{self.peer._next_id()}"
        created = int(time.time())
        if tool is not None:
            args = json.dumps(TOOL_ARGUMENTS)
            text, finish = "", "tool_calls"
            completion_tokens = _words(args)
        else:
            text, finish = f"echo from {model}: {last}", "stop"
            completion_tokens = _words(text)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text if tool is None else None}
            if tool is not None:
                message["tool_calls"] = [
                    {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": args}}
                ]
            self._send_json(
                200,
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                },
            )
            return

        def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> tuple[None, str]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            payload = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
                **extra,
            }
            return None, json.dumps(payload)

        def events() -> Iterator[tuple[str | None, str]]:
            if tool is not None:
                yield chunk(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": tool, "arguments": ""},
                            }
                        ],
                    }
                )
                for piece in _pieces(args):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            else:
                yield chunk({"role": "assistant", "content": ""})
                for piece in _pieces(text):
                    yield chunk({"content": piece})
            yield chunk({}, finish, usage=usage)
            yield None, "[DONE]"

        self._stream(events())

    def _completions(self, body: dict[str, Any], model: str) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = next((p for p in prompt if isinstance(p, str)), "")
        prompt = prompt if isinstance(prompt, str) else ""
        text = f"echo from {model}: {prompt}"
        rid = f"cmpl-fake-{self.peer._next_id()}"
        created = int(time.time())
        prompt_tokens, completion_tokens = _words(prompt), _words(text)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

        def completion(piece: str, finish: str | None, **extra: Any) -> dict[str, Any]:
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "text": piece, "finish_reason": finish, "logprobs": None}],
                **extra,
            }

        if not body.get("stream"):
            self._send_json(200, completion(text, "stop", usage=usage))
            return

        def events() -> Iterator[tuple[str | None, str]]:
            for piece in _pieces(text):
                yield None, json.dumps(completion(piece, None))
            yield None, json.dumps(completion("", "stop", usage=usage))
            yield None, "[DONE]"

        self._stream(events())

    def _embeddings(self, body: dict[str, Any], model: str) -> None:
        raw = body.get("input")
        inputs: list[Any] = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
        texts = [x if isinstance(x, str) else json.dumps(x) for x in inputs]
        b64 = body.get("encoding_format") == "base64"
        data = []
        for i, t in enumerate(texts):
            vector = _embedding(t)
            value: Any = (
                base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if b64 else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(_words(t) for t in texts)
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    # --- Anthropic ---------------------------------------------------------------------------

    def _messages(self, body: dict[str, Any], model: str) -> None:
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        last = _text_of(users[-1].get("content")) if users else ""
        input_tokens = _words(" ".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict)))
        tool = _tool_name(body.get("tools"), "anthropic", last)
        mid = f"msg_fake_{self.peer._next_id()}"
        text = f"echo from {model}: {last}"
        args = json.dumps(TOOL_ARGUMENTS)
        output_tokens = _words(args if tool is not None else text)
        stop_reason = "tool_use" if tool is not None else "end_turn"
        block: dict[str, Any] = (
            {"type": "tool_use", "id": "toolu_1", "name": tool, "input": dict(TOOL_ARGUMENTS)}
            if tool is not None
            else {"type": "text", "text": text}
        )
        message: dict[str, Any] = {
            "id": mid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
        if not body.get("stream"):
            self._send_json(200, message)
            return

        def event(name: str, **payload: Any) -> tuple[str | None, str]:
            return name, json.dumps({"type": name, **payload})

        def events() -> Iterator[tuple[str | None, str]]:
            start = {
                **message,
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            }
            yield event("message_start", message=start)
            if tool is not None:
                empty = {**block, "input": {}}
                yield event("content_block_start", index=0, content_block=empty)
                for piece in _pieces(args):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    yield event("content_block_delta", index=0, delta=delta)
            else:
                yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                for piece in _pieces(text):
                    yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
            yield event("content_block_stop", index=0)
            yield event(
                "message_delta",
                delta={"stop_reason": stop_reason, "stop_sequence": None},
                usage={"input_tokens": input_tokens, "output_tokens": output_tokens},
            )
            yield event("message_stop")

        self._stream(events())


def _tool_name(tools: Any, api: Api, last_user_text: str) -> str | None:
    """The first tool's name when the request has tools and the last user message says "weather"."""
    if not isinstance(tools, list) or not tools or not re.search(r"\bweather\b", last_user_text, re.I):
        return None
    first = tools[0]
    if not isinstance(first, dict):
        return None
    spec = first.get("function", first) if api == "openai" else first
    name = spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else None


class FakePeer:
    """A fake OpenAI- or Anthropic-compatible upstream server (see the module docstring).

    ``FakePeer(api="openai", models=("m1",), key=None, *, mode="ok", first_byte_delay=0.0)``;
    serves from :meth:`start` (or ``with``) until :meth:`close`.
    """

    def __init__(
        self,
        api: Api = "openai",
        models: Sequence[str] = ("m1",),
        key: str | None = None,
        *,
        mode: Mode = "ok",
        first_byte_delay: float = 0.0,
    ) -> None:
        if api not in get_args(Api):
            raise ValueError(f"api must be one of {get_args(Api)}, not {api!r}")
        self.api: Api = api
        self.models: list[str] = list(models)
        self.key: str | None = key
        #: Seconds to wait before the status line of every answer (a slow first byte).
        self.first_byte_delay: float = first_byte_delay
        #: Every request received, in order (appended from the handler threads).
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._mode: Mode = "ok"
        self.mode = mode
        self._ids = 0
        self._stopped = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash, no ``/v1``)."""
        if self._server is None:
            raise RuntimeError("FakePeer is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> Mode:
        with self._lock:
            return self._mode

    @mode.setter
    def mode(self, value: Mode) -> None:
        if value not in get_args(Mode):
            raise ValueError(f"mode must be one of {get_args(Mode)}, not {value!r}")
        with self._lock:
            self._mode = value

    def _record(self, rec: Recorded) -> None:
        with self._lock:
            self.requests.append(rec)

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def start(self) -> FakePeer:
        if self._server is not None:
            raise RuntimeError("FakePeer already started")
        self._stopped.clear()
        server = _Server(self)
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-peer", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 3.0) -> None:
        """Stop serving: hung and streaming handlers are released, the port is closed."""
        server, thread = self._server, self._thread
        if server is None:
            return
        deadline = time.monotonic() + timeout
        self._stopped.set()
        server.shutdown()
        server.cut_connections()
        server.server_close()
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
        server.join_handlers(deadline)
        self._server = self._thread = None

    def __enter__(self) -> FakePeer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
