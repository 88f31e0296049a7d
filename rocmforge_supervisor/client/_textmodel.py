"""TextModel: streaming text generation over llama-server's OpenAI-style SSE endpoints.

``client/`` knows nothing about processes: the same class talks to a child we spawned or to any
running server (``TextModel.connect``). When a child of ours backs it, the loader passes a
:class:`Liveness` so that a broken stream can be told apart from a crashed child.

Requests go through ``client/_transport`` (retry on a stale keep-alive, httpx errors translated),
the same path the gateway uses.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import httpx

from .._errors import (
    ForgeError,
    InstanceError,
    InvalidArgument,
    ModelClosed,
    RequestError,
    ServerUnavailable,
    StreamError,
)
from ._sse import aiter_chunks, error_from_body, iter_chunks
from ._transport import Upstream, Verify, asend, async_pool, map_httpx_errors, send, sync_pool
from ._types import GenerateOptions, Message, Token, Usage

__all__ = ["Liveness", "TextModel"]


class Liveness(Protocol):
    """What the client may ask about the process behind it (nothing else)."""

    @property
    def pid(self) -> int | None: ...

    def crashed(self, wait: float) -> InstanceError | None:
        """The crash, if the server process has died (waiting up to ``wait`` s to notice)."""

    async def acrashed(self, wait: float) -> InstanceError | None: ...


MessageLike = Message | Mapping[str, str]


def _messages(messages: Sequence[MessageLike]) -> list[dict[str, str]]:
    out = []
    for m in messages:
        if isinstance(m, Message):
            out.append(m.to_json())
        else:
            out.append({"role": str(m["role"]), "content": str(m["content"])})
    return out


class _StreamState:
    """Sans-IO: turns decoded chunk dicts into Tokens and keeps usage/timings (shared sync/async)."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.usage: Usage | None = None
        self.timings: dict[str, Any] | None = None
        self.finish_reason: str | None = None

    def tokens(self, chunk: Mapping[str, Any]) -> list[Token]:
        if (u := chunk.get("usage")) is not None:
            self.usage = Usage.from_json(u)
        if (t := chunk.get("timings")) is not None:
            self.timings = dict(t)
        out: list[Token] = []
        for choice in chunk.get("choices") or ():
            finish = choice.get("finish_reason")
            if self.chat:
                delta = choice.get("delta") or {}
                if rc := delta.get("reasoning_content"):
                    out.append(Token(rc, reasoning=True))
                text = delta.get("content") or ""
            else:
                text = choice.get("text") or ""
            if finish is not None:
                self.finish_reason = finish
                out.append(Token(text, finish_reason=finish))
            elif text:
                out.append(Token(text))
        return out


class TextModel:
    """Generate and chat with one model, streaming tokens; sync and async.

    Iterators raise a typed :class:`~rocmforge_supervisor.ForgeError` when a stream fails
    (``ModelCrashed``, ``ContextExceeded``, ``RequestRejected`` …); ``err()`` returns the error that
    ended the last stream, or None when it ended well (go-rocm's ``Err()``).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        liveness: Liveness | None = None,
        on_close: Callable[[], None] | None = None,
        on_aclose: Callable[[], Awaitable[None]] | None = None,
        timeout: float | None = 600.0,
        verify: Verify = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._verify = verify
        self.model = model
        self._api_key = api_key
        self._liveness = liveness
        self._on_close = on_close
        self._on_aclose = on_aclose
        self._timeout = httpx.Timeout(timeout, connect=5.0)
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None
        self._lock = threading.Lock()
        self._err: ForgeError | None = None
        self._closed = False
        self.last_usage: Usage | None = None
        self.last_timings: dict[str, Any] | None = None
        self.last_finish_reason: str | None = None

    @classmethod
    def connect(
        cls, base_url: str, *, model: str | None = None, api_key: str | None = None, verify: Verify = True
    ) -> TextModel:
        """The same API over an already running server (a forge service or any llama-server).
        ``verify``: for ``https://``, a PEM file to trust besides the public CAs (a self-signed
        ``tls_cert``), or an ``ssl.SSLContext``."""
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"base_url must start with http:// or https://, got {base_url!r}",
                hint='pass the server\'s URL, e.g. "http://127.0.0.1:8080"',
            )
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        return cls(url, model=model, api_key=api_key, verify=verify)

    # -- properties -----------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The child's pid when this model runs in a child we spawned, else None."""
        return self._liveness.pid if self._liveness is not None else None

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    def err(self) -> ForgeError | None:
        return self._err

    # -- requests --------------------------------------------------------------------------------

    def _upstream(self) -> Upstream:
        return Upstream(self.base_url, self._api_key, is_alive=lambda: not self._is_dead())

    def _headers(self, upstream: Upstream) -> dict[str, str]:
        return upstream.headers({"Accept": "text/event-stream", "Content-Type": "application/json"})

    def _body(self, chat: bool, payload: Any, opts: GenerateOptions) -> dict[str, Any]:
        body = opts.to_body()
        body["stream"] = True
        if self.model:
            body["model"] = self.model
        if chat:
            body["messages"] = _messages(payload)
            body["stream_options"] = {"include_usage": True}
        else:
            body["prompt"] = payload
        return body

    @staticmethod
    def _opts(options: GenerateOptions | None, kw: dict[str, Any]) -> GenerateOptions:
        if options is not None and kw:
            raise TypeError("pass either options= or keyword options, not both")
        return options if options is not None else GenerateOptions(**kw)

    def _begin(self) -> _StreamState:
        if self._closed:
            raise ModelClosed("this TextModel is closed", hint="load or connect a new one")
        self._err = None
        return _StreamState(chat=False)

    def _finish(self, state: _StreamState) -> None:
        self.last_usage = state.usage
        self.last_timings = state.timings
        self.last_finish_reason = state.finish_reason

    # -- sync ------------------------------------------------------------------------------------

    def generate(self, prompt: str, options: GenerateOptions | None = None, **kw: Any) -> Iterator[Token]:
        """Stream a completion of ``prompt`` (``POST /v1/completions``)."""
        return self._stream("/v1/completions", False, prompt, self._opts(options, kw))

    def chat(
        self, messages: Sequence[MessageLike], options: GenerateOptions | None = None, **kw: Any
    ) -> Iterator[Token]:
        """Stream the assistant's reply (``POST /v1/chat/completions``)."""
        return self._stream("/v1/chat/completions", True, messages, self._opts(options, kw))

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = sync_pool(self._timeout, verify=self._verify)
            return self._client

    def _stream(self, path: str, chat: bool, payload: Any, opts: GenerateOptions) -> Iterator[Token]:
        state = self._begin()
        state.chat = chat
        content = json.dumps(self._body(chat, payload, opts)).encode()
        client, upstream = self._sync_client(), self._upstream()
        try:
            response = send(client, upstream, "POST", path, content=content, headers=self._headers(upstream))
            try:
                with map_httpx_errors(upstream, streaming=True):
                    if response.status_code != 200:
                        raise error_from_body(response.status_code, response.read())
                    for chunk in iter_chunks(response.iter_bytes()):
                        yield from state.tokens(chunk)
            finally:
                response.close()  # closing the connection makes llama-server stop generating
        except ForgeError as exc:
            self._err = self._crash_or(exc)
            raise self._err from exc
        finally:
            self._finish(state)

    def _is_dead(self) -> bool:
        return self._liveness is not None and self._liveness.crashed(0.0) is not None

    def _may_be_crash(self, exc: ForgeError) -> bool:
        """A broken stream or an unreachable server may mean the child died; a refusal does not."""
        if isinstance(exc, InstanceError) or self._liveness is None:
            return False
        return not isinstance(exc, RequestError) or isinstance(exc, (StreamError, ServerUnavailable))

    def _crash_or(self, exc: ForgeError) -> ForgeError:
        if not self._may_be_crash(exc) or self._liveness is None:
            return exc
        crash = self._liveness.crashed(1.0)
        return crash if crash is not None else exc

    def close(self) -> None:
        """Idempotent: closes the HTTP pool, then (if we own it) stops the child."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            self._client.close()
        self._aclient = None  # an async pool can only be closed on its loop; its sockets go with it
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> TextModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- async -----------------------------------------------------------------------------------

    def agenerate(
        self, prompt: str, options: GenerateOptions | None = None, **kw: Any
    ) -> AsyncIterator[Token]:
        return self._astream("/v1/completions", False, prompt, self._opts(options, kw))

    def achat(
        self, messages: Sequence[MessageLike], options: GenerateOptions | None = None, **kw: Any
    ) -> AsyncIterator[Token]:
        return self._astream("/v1/chat/completions", True, messages, self._opts(options, kw))

    def _async_client(self) -> httpx.AsyncClient:
        if self._aclient is None:
            self._aclient = async_pool(self._timeout, verify=self._verify)
        return self._aclient

    async def _astream(
        self, path: str, chat: bool, payload: Any, opts: GenerateOptions
    ) -> AsyncIterator[Token]:
        state = self._begin()
        state.chat = chat
        content = json.dumps(self._body(chat, payload, opts)).encode()
        client, upstream = self._async_client(), self._upstream()
        try:
            response = await asend(
                client, upstream, "POST", path, content=content, headers=self._headers(upstream)
            )
            try:
                with map_httpx_errors(upstream, streaming=True):
                    if response.status_code != 200:
                        raise error_from_body(response.status_code, await response.aread())
                    async for chunk in aiter_chunks(response.aiter_bytes()):
                        for tok in state.tokens(chunk):
                            yield tok
            finally:
                await response.aclose()
        except ForgeError as exc:
            self._err = await self._acrash_or(exc)
            raise self._err from exc
        finally:
            self._finish(state)

    async def _acrash_or(self, exc: ForgeError) -> ForgeError:
        if not self._may_be_crash(exc) or self._liveness is None:
            return exc
        crash = await self._liveness.acrashed(1.0)
        return crash if crash is not None else exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._aclient is not None:
            await self._aclient.aclose()
        if self._client is not None:
            self._client.close()
        if self._on_aclose is not None:
            await self._on_aclose()
        elif self._on_close is not None:
            self._on_close()

    async def __aenter__(self) -> TextModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
