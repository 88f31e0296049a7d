"""What the gateway's route modules share: the supervisor, the upstream pool, metrics, settings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
from starlette.requests import Request

from ..._errors import PayloadTooLarge
from ...access import KeyRing, Limiter
from ...activity import ActivityStore
from ...batches import BatchRunner, BatchStore
from ...client import async_pool
from ...config import ForgeConfig, ForgeSettings, ServerConfig
from ...supervisor import Supervisor
from ._metrics import Metrics
from ._recording import Recorder
from ._routes import FORWARDED
from ._upstream_http import StreamPool

__all__ = ["AUDIO_PATHS", "GatewayState", "body_limit", "read_body", "request_id", "state_of", "too_large"]


class GatewayState:
    """One per app (``app.state.gateway``); routes reach it through :func:`state_of`.

    It holds the running ``[server]`` section itself (:attr:`server`), swapped whole by a reload
    (:meth:`apply`), and routes read ``st.server.KEY`` at use: a new ``[server]`` key that applies
    per request needs no copy here (uvicorn's one ``Config`` read as ``self.config.x``)."""

    def __init__(
        self,
        supervisor: Supervisor,
        config: ForgeConfig,
        *,
        reload: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        activity: ActivityStore | None = None,
    ) -> None:
        self.supervisor = supervisor
        #: The ``[server]`` settings in force: read at use, replaced by :meth:`apply`.
        self.server: ServerConfig = config.server
        self.settings: ForgeSettings = config.settings
        self.model_dirs = [p.resolve() for p in config.model_dirs]
        self.reload = reload
        self.metrics = Metrics(supervisor.status)
        #: Keys, limits and the activity log: what the middleware checks and records. Keys and
        #: capture follow the supervisor's config across reloads (``Recorder.follow``).
        self.recorder = Recorder(
            activity,
            KeyRing.from_config(config.server),
            Limiter(),
            self.metrics,
            capture=config.server.capture,
            capture_models={n: m.capture for n, m in config.models.items() if m.capture is not None},
            capture_max_bytes=config.server.capture_max_bytes,
        )
        self.recorder.follow(supervisor.config)
        #: Set when the service starts stopping: endless responses (events, log follow) end then.
        self.closing = anyio.Event()
        self.upstream: httpx.AsyncClient = async_pool(httpx.Timeout(None, connect=5.0), max_keepalive=512)
        #: The relay's own connections for streamed answers (``_upstream_http``).
        self.streams = StreamPool(connect_timeout=5.0, max_idle=512)
        #: The Batch API's records and its runner (``ops._server`` sets them; None: no batches).
        self.batches: BatchStore | None = None
        self.batch_runner: BatchRunner | None = None
        #: The app these routes serve in (set by ``ops._server``; the batch runner sends into it).
        self.app: Any = None

    def apply(self, config: ForgeConfig) -> None:
        """A reloaded config's ``[server]`` settings, from the next request on: the section is
        swapped; what lives outside it (the recorder's byte limit, the activity store's bounds) is
        told. Opening or closing the store (``server.activity``) and what only a restart applies
        are the reload's (``service._server``)."""
        server = self.server = config.server
        self.model_dirs = [p.resolve() for p in config.model_dirs]
        self.recorder.capture_max_bytes = server.capture_max_bytes
        store = self.recorder.store
        if store is not None:  # read by its writer thread at each trim and each captured body
            store.keep_days = server.activity_keep_days
            store.max_rows = server.activity_max_rows
            store.capture_max_bytes = server.capture_max_bytes


def state_of(request: Request) -> GatewayState:
    st: GatewayState = request.app.state.gateway
    return st


def request_id(request: Request) -> str | None:
    """The id the middleware gave this request (``X-Request-ID``)."""
    rid: str | None = request.scope.get("state", {}).get("request_id")
    return rid


#: Multipart framing and the text fields beside an audio file: what an upload may add to its file.
_FORM_OVERHEAD = 1024 * 1024
#: The audio upload routes (whisper models take files up to ``audio_max_bytes`` on them).
AUDIO_PATHS = frozenset(r.path for r in FORWARDED if r.audio)


def body_limit(st: GatewayState, path: str) -> int:
    """The body limit of a route: ``max_body_bytes``, or on the audio routes enough for an
    ``audio_max_bytes`` file and its form (the file itself is checked by ``_audio``)."""
    if path in AUDIO_PATHS:
        return max(st.server.max_body_bytes, st.server.audio_max_bytes + _FORM_OVERHEAD)
    if path == "/v1/files":  # a batch's input file (``proxy._batch_api``)
        return max(st.server.max_body_bytes, st.server.batch_max_bytes + _FORM_OVERHEAD)
    return st.server.max_body_bytes


def too_large(limit: int, path: str = "") -> PayloadTooLarge:
    """The 413 of a body over ``limit`` on ``path`` (an audio upload's names its file field)."""
    if path in AUDIO_PATHS:
        return PayloadTooLarge(
            f"file: the upload is over {limit} bytes",
            param="file",
            hint="send a smaller audio file (server.audio_max_bytes sets the limit)",
        )
    return PayloadTooLarge(f"request body over {limit} bytes", hint="send a smaller request")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, counted while read (a chunked body has no Content-Length to check up front;
    the middleware checks a declared one against the same limit)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit, request.url.path)
        chunks.append(chunk)
    return b"".join(chunks)
