"""The activity record of the request being handled: opened and written by the middleware,
filled in on the way by whichever route serves it.

One place writes: :meth:`Recorder.finish`, called by the request middleware when the response
has ended, failed or been cut off by the client — for every dialect, since every request passes
there. The routes only *note* what they alone know (the model, the queue wait, the first token,
the usage of the answer) through the module functions below, which find the request's
:class:`Draft` in a context variable and do nothing outside a recorded request.

The record goes to the activity store's queue (``ActivityStore.submit``): no disk on the loop.
"""

from __future__ import annotations

import contextvars
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.types import Message, Receive, Send

from ..._errors import ForgeError
from ...activity import ActivityStore, Record
from ._usage import Used

if TYPE_CHECKING:
    from ...access import Key, KeyRing, Limiter, PriorityClass
    from ...config import ForgeConfig
    from ._metrics import Metrics

__all__ = [
    "Draft",
    "Recorder",
    "Wire",
    "admission",
    "admit_model",
    "current",
    "note_answer",
    "note_answered",
    "note_error",
    "note_model",
    "note_priority",
    "note_slot",
    "note_status",
    "open_store",
    "request_key",
    "with_id",
]

_FINISH = re.compile(rb'"(?:finish_reason|stop_reason|done_reason)"\s*:\s*"([A-Za-z_]+)"')


@dataclass
class Draft:
    """A request's record while it runs, and what only the middleware sees (bytes on the wire)."""

    record: Record
    t0: float
    key: Key | None = None
    capture: bool = False
    request_body: bytearray = field(default_factory=bytearray)
    response_body: bytearray = field(default_factory=bytearray)
    status_override: int | None = None
    #: The answer's end (its stream's end marker) reached the client before it left: not a cancel.
    answered: bool = False
    done: bool = False
    #: The key's limits, counted once the request's model is known and allowed (``admit_model``).
    limiter: Limiter | None = None
    admitted: bool = False
    #: Its admission class (the key's, or what ``X-Priority`` asked): set by the middleware.
    priority: PriorityClass = "interactive"


current: contextvars.ContextVar[Draft | None] = contextvars.ContextVar("forge_activity", default=None)


def request_key(scope: Any) -> Key | None:
    """The key the request authenticated with (None: the service has no keys)."""
    key: Key | None = scope.get("state", {}).get("key")
    return key


def _draft() -> Draft | None:
    d = current.get()
    return d if d is not None and not d.done else None


def note_model(name: str, *, stream: bool | None = None) -> None:
    """The model the request names, once resolved (and whether it streams)."""
    d = _draft()
    if d is not None:
        d.record.model = name
        if stream is not None:
            d.record.stream = stream


def note_slot() -> None:
    """A slot at the model's child is the request's now: the queue wait ends."""
    d = _draft()
    if d is not None:
        d.record.queue_wait = time.perf_counter() - d.t0


def note_answer(*, first_byte: float | None = None, used: Used | None = None, tail: bytes = b"") -> None:
    """What the answer came to, noted once when it ends (not chunk by chunk while it streams):
    when its first byte came (``time.perf_counter()``), the tokens it used (``_usage``: the same
    reading for every route and dialect: what :meth:`Recorder.finish` charges to the key, counts in
    the metrics and logs) and why generation stopped (the last ``finish_reason``/``stop_reason``
    in ``tail``)."""
    d = _draft()
    if d is None:
        return
    if first_byte is not None and d.record.ttft is None:
        d.record.ttft = first_byte - d.t0
    if used is not None:
        d.record.prompt_tokens = used.prompt
        d.record.completion_tokens = used.completion
        d.record.cached_tokens = used.cached
    found = _FINISH.findall(tail) if tail else None
    if found:
        d.record.finish_reason = found[-1].decode()


def note_status(status: int, error: str | None = None) -> None:
    """A failure the HTTP status does not show (a stream that broke after its 200)."""
    d = _draft()
    if d is not None:
        d.status_override = status
        if error:
            d.record.error = error


def note_answered() -> None:
    """The client left after its answer's last event: a client library closes its connection as
    soon as it has read the end marker (the OpenAI SDK after ``[DONE]``), before the stream's own
    end, so that close is not a cancel."""
    d = _draft()
    if d is not None:
        d.answered = True


def note_error(kind: str) -> None:
    """The kind of error the request was answered with (the error class, or llama-server's)."""
    d = _draft()
    if d is not None and d.record.error is None:
        d.record.error = kind


class Wire:
    """The ``send`` and ``receive`` a request's app is given: the request id on the response's
    head and, for a model request (``draft``), its status, the bytes captured and whether the last
    byte went out, for :meth:`Recorder.finish`. Here, below the routes, not as closures of the
    middleware: the relay calls :meth:`send` for every chunk, and a call back up into the edge
    would be the walk re-entering it (scripts/audit/request_walk.py)."""

    __slots__ = ("_send", "completed", "draft", "recorder", "rid_header", "source", "status")

    def __init__(
        self,
        send: Send,
        receive: Receive,
        rid_header: tuple[bytes, bytes],
        recorder: Recorder | None = None,
        draft: Draft | None = None,
    ) -> None:
        self._send = send
        #: Where :meth:`receive` reads from (the middleware's checks may put a replay in front).
        self.source = receive
        self.rid_header = rid_header
        self.recorder = recorder
        self.draft = draft
        self.status = 0
        self.completed = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            message["headers"] = with_id(message.get("headers", []), self.rid_header)
        elif kind == "http.response.body" and self.draft is not None and self.draft.capture:
            assert self.recorder is not None
            self.recorder.keep_response(self.draft, message.get("body", b""))
        await self._send(message)
        if kind == "http.response.body" and not message.get("more_body", False):
            self.completed = True  # the last byte went out

    async def receive(self) -> Message:
        """The request's body, kept as it is read (only while it is captured)."""
        message = await self.source()
        if message["type"] == "http.request" and self.draft is not None and self.recorder is not None:
            self.recorder.keep_request(self.draft, message.get("body", b""))
        return message


def with_id(headers: list[tuple[bytes, bytes]], rid_header: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """The response's headers with the request id once: a response that already says it (an
    error rendered with it, a relayed answer) keeps its own; read once per response, not per chunk."""
    if any(k.lower() == b"x-request-id" for k, _ in headers):
        return list(headers)
    return [*headers, rid_header]


class Recorder:
    """The gateway's side of the activity log: drafts, capture, and the one write."""

    def __init__(
        self,
        store: ActivityStore | None,
        keys: KeyRing,
        limiter: Limiter,
        metrics: Metrics,
        *,
        capture: bool,
        capture_models: dict[str, bool],
        capture_max_bytes: int,
    ) -> None:
        self.store = store
        self.keys = keys
        self.limiter = limiter
        self.metrics = metrics
        self.capture = capture
        self.capture_models = capture_models
        self.capture_max_bytes = capture_max_bytes
        #: Whether any request may be captured: only then do the middleware's wrappers copy bytes.
        self.may_capture = capture or any(capture_models.values())
        self._config: ForgeConfig | None = None

    def follow(self, config: ForgeConfig) -> None:
        """Keys and capture as ``config`` says, when it is not the one they came from (a reload
        replaced it): a key added, removed or re-scoped counts from the next request on."""
        if config is self._config:
            return
        from ...access import KeyRing

        first = self._config is None
        self._config = config
        if first:  # the one the state was built from
            return
        self.keys = KeyRing.from_config(config.server)
        self.capture = config.server.capture
        self.capture_models = {n: m.capture for n, m in config.models.items() if m.capture is not None}
        self.may_capture = self.capture or any(self.capture_models.values())

    def begin(self, scope: Any, rid: str | None) -> Draft:
        client = scope.get("client")
        record = Record(
            started=time.time(),
            route=scope["path"],
            method=scope["method"],
            request_id=rid,
            client=client[0] if client else None,
        )
        draft = Draft(record, time.perf_counter(), capture=self.may_capture and self.store is not None)
        current.set(draft)
        return draft

    def identified(self, draft: Draft | None, key: Key) -> None:
        if draft is not None:
            draft.key = key
            draft.record.key = key.name
            draft.limiter = self.limiter

    def keep_request(self, draft: Draft, chunk: bytes) -> None:
        if len(draft.request_body) <= self.capture_max_bytes:
            draft.request_body += chunk[: self.capture_max_bytes + 1 - len(draft.request_body)]

    def keep_response(self, draft: Draft, chunk: bytes) -> None:
        # A stream is kept raw and assembled into its text on the store's thread: its events are
        # several times the size of their text, so more is kept than the text's cut.
        room = self.capture_max_bytes * 8
        if len(draft.response_body) <= room:
            draft.response_body += chunk[: room + 1 - len(draft.response_body)]

    def finish(self, draft: Draft, status: int, *, completed: bool) -> None:
        """The request is over (``completed``: its last byte was sent): count it and hand it to
        the store. Called once, by the middleware."""
        if draft.done:
            return
        draft.done = True
        r = draft.record
        r.duration = time.perf_counter() - draft.t0
        r.status = draft.status_override or status
        r.cancelled = not (completed or draft.answered)
        tokens = (r.prompt_tokens or 0) + (r.completion_tokens or 0)
        key = r.key or "-"
        # A label only for a configured model: whatever name a client sends must not grow /metrics
        # (the activity row keeps the name asked for).
        known = self._config is not None and r.model in self._config.models
        model = r.model if known and r.model else "-"
        self.metrics.key_requests.labels(key, model, str(r.status)).inc()
        if tokens:
            if r.model:  # tokens come only from a child: r.model names a configured model
                self.metrics.tokens_in.labels(r.model).inc(r.prompt_tokens or 0)
                self.metrics.tokens_out.labels(r.model).inc(r.completion_tokens or 0)
            self.metrics.key_tokens.labels(key, model, "prompt").inc(r.prompt_tokens or 0)
            self.metrics.key_tokens.labels(key, model, "completion").inc(r.completion_tokens or 0)
            if r.key is not None:
                self.limiter.add_tokens(r.key, tokens)
        if draft.capture and self._captures(r.model):
            r.request_body = self._scrub(bytes(draft.request_body))
            r.response_body = self._scrub(bytes(draft.response_body))
        if self.store is not None:
            self.store.submit(r)

    def _captures(self, model: str | None) -> bool:
        if model is not None and model in self.capture_models:
            return self.capture_models[model]
        return self.capture

    def _scrub(self, body: bytes) -> bytes | None:
        """Key material never reaches the file, even when a client puts a key in a prompt."""
        if not body:
            return None
        for key in self.keys.keys:
            if key.secret:
                body = body.replace(key.secret, b"[key]")
        return body


def admit_model(scope: Any, name: str, *, stream: bool | None = None) -> None:
    """The request's model is known: may its key use it (:class:`KeyForbidden` naming the key's
    name and the model, never the key)? Then, for a model request, the key's limits count it
    (:class:`RateLimited`): here and not at the edge, so a request refused for its model (or any
    earlier 4xx) costs no budget, and a rate-limited row names the model it asked for."""
    note_model(name, stream=stream)  # a refused request's row names the model it asked for
    key = request_key(scope)
    if key is None:
        return
    key.check_model(name)
    d = _draft()  # a model request (one with a record) counts once; over a limit, it does not
    if d is not None and d.limiter is not None and not d.admitted:
        d.limiter.admit(key)
        d.admitted = True


def note_priority(draft: Draft, key: Key | None, asked: str | None) -> None:
    """The request's admission class, from its key and ``X-Priority`` (``access.request_class``:
    a 400 for an unknown class, a 403 for a raise the key may not do)."""
    from ...access import request_class

    draft.priority = request_class(key, asked)
    draft.record.priority = draft.priority


def may_use(name: str) -> bool:
    """Whether the running request's key may use model ``name`` (a fallback it would go to)."""
    d = _draft()
    if d is None or d.key is None:
        return True
    try:
        d.key.check_model(name)
    except ForgeError:
        return False
    return True


def admission() -> tuple[PriorityClass, str | None]:
    """(class, key name) the running request queues with; interactive and no key outside one."""
    d = _draft()
    if d is None:
        return "interactive", None
    return d.priority, d.key.name if d.key is not None else None


def open_store(config: ForgeConfig) -> ActivityStore | None:
    """``<state_dir>/activity.db``, its writer started (None: ``server.activity = false``). A file
    that cannot be used is reported by the store (``problem``), not raised: the service serves."""
    server = config.server
    if not server.activity:
        return None
    store = ActivityStore(
        config.state_dir / "activity.db",
        keep_days=server.activity_keep_days,
        max_rows=server.activity_max_rows,
        capture_max_bytes=server.capture_max_bytes,
    )
    store.start()
    return store
