"""The forwarder: one request from a slot at its model to its answer, the same for every
dialect — the slot (``supervisor.acquire``: a local child, or a peer), the send (the relay's own
HTTP/1.1 client for a stream, httpx otherwise; a peer's body, key and timeouts), the watchdog's
one retry, the model's ``fallback``, the relay of a stream (its end marker checked, a cut stream
ended with an error event in the dialect), the metrics and the activity record's answer. What
comes before — a request's name, key, checks and rewrite in its dialect's terms — is the
ingress's (``_forward``); this module never reads a client's request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import httpx

from ..._errors import (
    ForgeError,
    InvalidRequest,
    ModelFailed,
    ModelLoading,
    PlacementError,
    QueueFull,
    ServerUnavailable,
    StreamError,
)
from ...client import Upstream, asend, with_model
from ...config import ModelConfig
from ...supervisor import ConversationTurn, EventKind, backend_of
from ..core._dialect import Translator
from ..core._drafting import DRAFT_MARK
from ..core._recording import (
    admission,
    may_use,
    note_answer,
    note_error,
    note_slot,
    note_status,
)
from ..core._routes import ForwardRoute, route_of
from ..core._state import GatewayState
from ..core._upstream_http import StreamResponse, supports
from ..core._usage import StreamMeter, Used, ends_stream, used_in
from ..edge._errors_http import UpstreamModel, sse_error_chunk, status_for, upstream_error
from ._relay import CLIENT_GONE, Opened
from ._rerank import refuse_wrong_kind

__all__ = ["Forwarder", "check_fits", "open_upstream"]

log = logging.getLogger("rocmforge.gateway")

_PASS_HEADERS = ("content-type",)

#: The longest a streamed turn's save may hold its slot after the answer (a slow disk).
_TURN_SAVE_TIMEOUT = 30.0


def _upstream_model(st: GatewayState, name: str) -> UpstreamModel:
    """The model's slot geometry as its child was started (for the context error's arithmetic)."""
    try:
        view = st.supervisor.view(name)
    except ForgeError:
        return UpstreamModel(name)
    return UpstreamModel(name, view.ctx_size, view.parallel, view.kv_unified)


#: The (model, upstream path) pairs found to fit, each with the configuration it was checked
#: against. Whether a model serves a route (its backend's routes, a reranker's kind) depends on
#: its configuration only, which a reload replaces as a whole: checked once per configuration,
#: not on every request. Bounded by the configured models times the forwarded routes.
_FITS: dict[tuple[str, str], ModelConfig] = {}


def check_fits(name: str, config: ModelConfig, path: str) -> None:
    """A 400 when model ``name`` does not serve ``path`` (its backend's routes, its kind)."""
    if _FITS.get((name, path)) is config:
        return
    backend = backend_of(config)
    if not backend.serves(config, path):
        shown = sorted(r for r in backend.routes_of(config) or () if r.startswith("/v1/"))
        raise InvalidRequest(
            f"model {name!r} is {backend.what}: it answers only {', '.join(shown)}",
            param="model",
            hint="name a model of GET /v1/models that serves this route",
        )
    refuse_wrong_kind(name, config, path)
    _FITS[(name, path)] = config


@asynccontextmanager
async def _slot(
    st: GatewayState,
    name: str,
    path: str,
    loaded: Callable[[], None] | None,
    sending: Callable[[], None] | None,
) -> AsyncIterator[Upstream]:
    """A slot at model ``name`` (waiting for its load up to ``load_wait``), released on exit."""
    check_fits(name, st.supervisor.config_of(name), path.partition("?")[0])
    load_wait = st.supervisor.load_wait(name)
    priority, key = admission()  # the request's class and key name (``edge._middleware``)
    async with st.supervisor.acquire(
        name, load_wait=load_wait, loaded=loaded, priority=priority, key=key
    ) as upstream:
        note_slot()  # the activity record's queue wait, for every dialect
        if sending is not None:
            sending()
        yield upstream


def _request_headers(upstream: Upstream, content_type: str, rid: str | None) -> dict[str, str]:
    headers = {"Content-Type": content_type}
    if rid:
        headers["X-Request-ID"] = rid
    return upstream.headers(headers)


@asynccontextmanager
async def open_upstream(
    st: GatewayState,
    name: str,
    method: str,
    path: str,
    body: bytes,
    rid: str | None,
    *,
    content_type: str = "application/json",
    loaded: Callable[[], None] | None = None,
    sending: Callable[[], None] | None = None,
    prepare: Callable[[], Awaitable[bytes]] | None = None,
    stream: bool = False,
) -> AsyncIterator[httpx.Response | StreamResponse]:
    """A slot at model ``name`` (waiting for its load up to ``load_wait``) and its child's
    streaming response to one request; both released on exit. ``loaded`` is called once the
    model is ready (the wait for a slot begins), ``sending`` once the slot is ours, just before
    the request goes to the child. ``stream``: a streamed request, sent through the relay's own
    client (``_upstream_http``, measured faster per chunk) where it can carry it."""
    async with _slot(st, name, path, loaded, sending) as upstream:
        if prepare is not None:  # the conversation tier: a restore, the body's ``id_slot``
            body = await prepare()
        headers = _request_headers(upstream, content_type, rid)
        response: httpx.Response | StreamResponse
        if upstream.peer is not None:
            response = await _to_peer(st, upstream, method, path, body, headers)
        elif stream and supports(upstream, path):
            response = await st.streams.send(upstream, method, path, content=body, headers=headers)
        else:
            response = await asend(st.upstream, upstream, method, path, content=body, headers=headers)
        try:
            yield response
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()


#: A model's refusals that hand a request to its ``fallback``: it can take no request now.
_FALLS_BACK = (ModelFailed, PlacementError, QueueFull, ServerUnavailable, ModelLoading)


async def _to_peer(
    st: GatewayState, upstream: Upstream, method: str, path: str, body: bytes, headers: dict[str, str]
) -> httpx.Response:
    """A request to a peer: the body names the peer's own model id (its ``set``/``strip`` applied),
    the peer's key replaces the client's (which never leaves forge), redirects are not followed (a
    peer's key goes to its own host only). A peer that cannot be reached, times out or answers 5xx
    is cooled down (``PeerSet.failed``); between two chunks of its stream it has ``idle`` seconds."""
    assert upstream.peer is not None
    if headers.get("Content-Type", "").startswith("application/json"):
        body = upstream.peer_body(body)
    peers = st.supervisor.peers
    try:
        response = await asend(st.upstream, upstream, method, path, content=body, headers=headers)
    except ServerUnavailable as exc:
        peers.failed(upstream.peer, exc.message)
        raise
    if response.status_code >= 500:
        peers.failed(upstream.peer, f"it answered {response.status_code}")
    else:
        peers.answered(upstream.peer)
    # httpcore reads the request's read timeout when the body is first read: from here on it is
    # the gap allowed between two chunks (the headers had ``first_byte``).
    timeouts = response.request.extensions.get("timeout")
    if isinstance(timeouts, dict) and upstream.timeouts is not None:
        timeouts["read"] = upstream.timeouts[2]
    return response


class Forwarder:
    """One forwarded request: open the upstream, relay it, count it. Its :meth:`open` is the
    :data:`~._relay.Opener` of the request's :class:`RelayResponse`, which renders its errors."""

    def __init__(
        self,
        st: GatewayState,
        route: ForwardRoute,
        name: str,
        rid: str | None,
        received: float,
        request: tuple[str, bytes, str],
        *,
        retry: bool = False,
        stream: bool = False,
        translator: Translator | None = None,
    ) -> None:
        self.st = st
        self.route = route  # the client's route: the metrics' endpoint, the errors' dialect
        self.name = name
        self.rid = rid
        self.received = received
        self.path, self.body, self.content_type = request
        #: What the child is asked (its path without the query): the stream's kind and end marker.
        self.upstream_path = self.path.partition("?")[0]
        self.retry = retry
        self.stream = stream
        #: A dialect that is not llama-server's own (Ollama): its answers translated.
        self.translator = translator
        #: "502" once the child broke the stream (the relay sends the client an error event).
        self._stream_status = "200"
        self._stream_done = False  # the stream ended as the child ends one (not cut, no error)
        #: The child's stream as far as its chunks have gone out (the tail when the relay last
        #: came back for more: ``send`` of the chunk before had returned).
        self._delivered = b""
        #: The name the client asked for (a variant or adapter ``X:Y``; counted with its model).
        self.asked = name
        #: When the answer's first chunk came (``time.perf_counter()``): its record's time to
        #: first token, noted with the rest when the answer ends (:meth:`_count`).
        self._first_byte: float | None = None

    def _stalls(self) -> int | None:
        """The model's watchdog resets so far (a change means the watchdog reset its child): read
        off the model itself, not a whole :meth:`~Supervisor.view` (its status, its placement)."""
        try:
            return self.st.supervisor.get(self.name).stalls
        except ForgeError:
            return None

    async def open(self, loaded: Callable[[], None]) -> Opened:
        """The upstream's answer, ready to relay; a :class:`ForgeError` (counted here) for the
        response to render. A non-streamed request whose child the progress watchdog reset after
        the request was sent to it (nothing reached the client) is retried once on the
        replacement (waiting for the restart within ``load_wait``); a second failure is a 503
        with Retry-After. A child that died of its own (a crash, the OOM killer, an RPC worker
        gone) is not replayed: the request itself may be what killed it; that is a 503 at once.
        A stream is never replayed: it ends with an error event in its dialect."""
        try:
            return await self._open_falling_back(loaded)
        except anyio.get_cancelled_exc_class():
            # The client left before the answer came (the relay cancels the request at once: the
            # upstream connection closes, llama-server stops the task, the slot is freed).
            self._count(str(CLIENT_GONE), b"", None)
            raise
        except ForgeError as exc:
            m = self.st.metrics
            m.errors.labels(self.name, type(exc).__name__).inc()
            m.requests.labels(self.name, self.route.path, "error").inc()
            # The activity row's status and error kind, also when a kept-alive stream can say it
            # only in an event (the response renders it; error_response notes the kind too).
            note_status(status_for(exc)[0])
            note_error(type(exc).__name__)
            raise

    async def _open_falling_back(self, loaded: Callable[[], None]) -> Opened:
        """The model's answer, or its ``fallback``'s: a model that cannot take the request (failed,
        refused by a residency rule, its queue full, its child or peer gone) hands it to the next
        entry before anything was sent to the client. Entries the request's key may not use, and
        peers cooling down, are skipped; the last refusal is the answer when none takes it."""
        try:
            fallback = list(self.st.supervisor.config_of(self.name).fallback)
        except ForgeError:
            fallback = []
        while True:
            try:
                return await self._open_retrying(loaded)
            except _FALLS_BACK as exc:
                target = self._next_fallback(fallback)
                if target is None:
                    raise
                log.warning(
                    "request %s: %s; falling back to %s",
                    self.rid,
                    exc.message,
                    target,
                    extra={"model": self.name, "request_id": self.rid},
                )
                self.st.metrics.errors.labels(self.name, "fallback").inc()
                self.st.supervisor.events.publish(
                    self.name, EventKind.FALLBACK, to=target, reason=exc.message
                )
                self.name = target
                if self.content_type.startswith("application/json"):
                    self.body = with_model(self.body, target)

    def _next_fallback(self, fallback: list[str]) -> str | None:
        """The next entry of ``fallback`` this request may go to (taken off the list): one the
        request's key may use, that can take a request now, and whose server answers the route
        the request is in the terms of (an Anthropic request passed through to a llama-server
        goes to no OpenAI-only peer)."""
        sup = self.st.supervisor
        while fallback:
            target = fallback.pop(0)
            if not (may_use(target) and sup.takes(target)):
                continue
            try:
                check_fits(target, sup.config_of(target), self.upstream_path)
            except ForgeError:
                continue
            return target
        return None

    async def _open_retrying(self, loaded: Callable[[], None]) -> Opened:
        stalls: list[int | None] = []  # the watchdog's count when the request went to the child
        # Read only for a request that may be retried (a stream never is).
        sending = (lambda: stalls.append(self._stalls())) if self.retry else None
        first = await self._open(loaded, sending=sending)
        if isinstance(first, Opened):
            return first
        if not self.retry:
            raise self._failed_twice(first)
        await self.st.supervisor.child_gone(self.name, timeout=5.0)
        before = stalls[-1] if stalls else None
        if before is None or self._stalls() == before:
            raise ServerUnavailable(
                f"model {self.name!r} went away while answering: {first.message}",
                hint="its child is being restarted (see `forge ps`): retry in a moment",
            )
        log.warning(
            "request %s: %s (the watchdog reset it); retrying once on its replacement",
            self.rid,
            first,
            extra={"model": self.name, "request_id": self.rid},
        )
        second = await self._open(loaded)
        if isinstance(second, Opened):
            return second
        raise self._failed_twice(second)

    def _failed_twice(self, exc: ServerUnavailable) -> ServerUnavailable:
        return ServerUnavailable(
            f"model {self.name!r} failed twice while answering: {exc.message}",
            hint="it is being restarted: retry in a moment",
        )

    async def _open(
        self, loaded: Callable[[], None], *, sending: Callable[[], None] | None = None
    ) -> Opened | ServerUnavailable:
        """The answer; a ServerUnavailable returned (not raised): the child went away before
        answering, which the caller may retry. Every other error is raised."""
        stack = AsyncExitStack()
        request = (self.st, self.name, self.route.method, self.path, self.body, self.rid)
        turn = self._conversation()
        if turn is not None:
            stack.callback(turn.release)
        opening = open_upstream(
            *request,
            content_type=self.content_type,
            loaded=loaded,
            sending=sending,
            prepare=turn.prepare if turn is not None else None,
            stream=self.stream and sending is None,
        )
        try:
            upstream: httpx.Response | StreamResponse = await stack.enter_async_context(opening)
        except ServerUnavailable as exc:  # no answer at all: the child went away
            await stack.aclose()
            return exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            raise
        acquired = time.perf_counter()  # the child answered: a slot was ours
        m = self.st.metrics
        m.queue_wait.labels(self.name).observe(acquired - self.received)
        stack.callback(lambda: m.generation.labels(self.name).observe(time.perf_counter() - acquired))
        headers = {k: v for k, v in upstream.headers.items() if k.lower() in _PASS_HEADERS}
        stream = upstream.status_code == 200 and upstream.headers.get("content-type", "").startswith(
            "text/event-stream"
        )
        if not stream:
            try:
                content = await upstream.aread()
                status = upstream.status_code
                if turn is not None and status == 200:  # saved while the slot is still ours
                    # The answer is whole: saved even if its client leaves meanwhile, as a stream's.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_TURN_SAVE_TIMEOUT):
                        await turn.finish(content)
            except httpx.HTTPError as exc:  # nothing was sent to the client yet
                self.st.metrics.errors.labels(self.name, "stream_broken").inc()
                return ServerUnavailable(f"model {self.name!r} failed mid-response: {exc}")
            finally:
                with anyio.CancelScope(shield=True):
                    await stack.aclose()
            if status >= 400:  # llama-server's own error: mapped in the one place
                raise upstream_error(_upstream_model(self.st, self.name), status, content)
            if status == 200:
                self._count("200", content, used_in(content))
            else:
                self._count(str(status), b"", None)
            if self.translator is not None and status == 200:
                return Opened(
                    200, {"content-type": self.translator.whole_type}, self.translator.whole(content)
                )
            return Opened(status, headers, content)
        meter = StreamMeter(self.upstream_path)
        if self.translator is not None:
            headers = {"content-type": self.translator.stream_type}
        kept: list[bytes] | None = [] if turn is not None else None  # the tier reads the answer
        route = route_of(self.upstream_path)
        marker = route.end_marker if route is not None else None
        relay = self._relay(upstream, meter, kept, marker)

        def ended() -> bool:
            """The client has its whole answer: the stream's end event was in what went out."""
            return marker is not None and ends_stream(self._delivered)

        async def close() -> None:
            await relay.aclose()
            # Counted here, not in the relay's finally: a client that left before the first
            # chunk never started it. A stream cut by the client is charged what it produced.
            self._count(self._stream_status, meter.tail, meter.used())
            if turn is not None and kept is not None and (self._stream_done or ended()):
                # The client has the whole answer; the slot is saved while it is still ours.
                with anyio.CancelScope(shield=True), anyio.move_on_after(_TURN_SAVE_TIMEOUT):
                    await turn.finish_stream(b"".join(kept))
            await stack.aclose()

        return Opened(200, headers, chunks=relay, close=close, ended=ended)

    def _conversation(self) -> ConversationTurn | None:
        """The conversation tier's part in a chat turn of a ``keep_conversations``
        model. Any other request to such a model may take any slot: the tier's book of what the
        slots hold is then void."""
        try:
            model = self.st.supervisor.get(self.name)
        except ForgeError:
            return None
        if not model.config.keep_conversations:
            return None
        turn = None
        if self.upstream_path == "/v1/chat/completions":  # OpenAI's, or Ollama's translated to it
            turn = ConversationTurn.of(model, admission()[1], self.body)
        if turn is None and model.contexts is not None:
            model.contexts.book.unknown()
        return turn

    async def _relay(
        self,
        upstream: httpx.Response | StreamResponse,
        meter: StreamMeter,
        kept: list[bytes] | None,
        marker: bytes | None,
    ) -> AsyncGenerator[bytes, None]:
        """The stream as it goes out; ``marker``: the route's end marker, which a whole stream has."""
        first = True
        try:
            translator = self.translator
            if translator is None:  # the hot path: the child's bytes as they come
                async for chunk in upstream.aiter_raw():
                    if first:
                        self._first_chunk()
                        first = False
                    meter.feed(chunk)
                    if kept is not None:
                        kept.append(chunk)
                    yield chunk
                    self._delivered = meter.tail
            else:
                async for piece in _translated(upstream.aiter_raw(), translator, meter, kept):
                    if first:
                        self._first_chunk()
                        first = False
                    yield piece
                    self._delivered = meter.tail
            if marker is not None and marker not in meter.tail and b'"error"' not in meter.tail:
                raise StreamError(f"the stream ended without {marker.decode()}")
            self._stream_done = marker is not None and marker in meter.tail
        except (StreamError, httpx.HTTPError) as exc:
            self._stream_status = "502"
            note_status(502, "stream_broken")
            self.st.metrics.errors.labels(self.name, "stream_broken").inc()
            broken = StreamError(
                f"model {self.name!r} stopped mid-stream ({exc.__cause__ or exc})",
                hint="it is being restarted",
            )
            log.warning(
                "request %s: %s", self.rid, broken, extra={"model": self.name, "request_id": self.rid}
            )
            yield sse_error_chunk(broken, self.route.dialect)

    def _first_chunk(self) -> None:
        self._first_byte = now = time.perf_counter()
        self.st.metrics.ttft.labels(self.name).observe(now - self.received)

    def _count(self, status: str, tail: bytes, used: Used | None) -> None:
        """The request's metrics; an answer's tokens go into its record (``_usage``'s reading,
        the same for every route), which charges the key when the request ends. A stream the
        child broke is not charged."""
        m = self.st.metrics
        m.duration.labels(self.name).observe(time.perf_counter() - self.received)
        m.requests.labels(self.name, self.route.path, status).inc()
        if self.asked != self.name:
            m.served_names.labels(self.asked, self.name, status).inc()
        if status != "200":
            note_answer(first_byte=self._first_byte)
            return
        if DRAFT_MARK in tail:  # only an answer that drafted is read for it
            m.drafts.count(self.name, tail)
        note_answer(first_byte=self._first_byte, used=used, tail=tail)


async def _translated(
    chunks: AsyncIterator[bytes], translator: Translator, meter: StreamMeter, kept: list[bytes] | None
) -> AsyncIterator[bytes]:
    """The child's chunks in the dialect's shape, each read by the meter (the request's tokens)
    and kept for the conversation tier before it is translated. The translator is pushed each
    chunk (``Translator.feed``), so it never pulls on anything of the forwarder's."""
    async for chunk in chunks:
        meter.feed(chunk)
        if kept is not None:
            kept.append(chunk)
        piece = translator.feed(chunk)
        if piece:
            yield piece
        if translator.over:
            return
    piece = translator.end()
    if piece:
        yield piece
