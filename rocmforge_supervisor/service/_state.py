"""What the gateway's route modules share: the supervisor, the upstream pool, metrics, settings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.requests import Request

from ..access import ADMIN_KEY_NAME, Key, KeyRing, Limiter
from ..activity import ActivityStore
from ..client import async_pool
from ..config import ForgeConfig, ForgeSettings
from ..supervisor import Supervisor
from ._metrics import Metrics
from ._recording import Recorder
from ._upstream_http import StreamPool

__all__ = ["AUDIO_PATHS", "GatewayState", "body_limit", "request_id", "state_of"]


class GatewayState:
    """One per app (``app.state.gateway``); routes reach it through :func:`state_of`."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        api_key: str | None,
        max_body_bytes: int,
        model_dirs: list[Path],
        reload: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        cors_origins: list[str] | None = None,
        sse_keepalive: float = 5.0,
        keep_alive_streams: bool = False,
        settings: ForgeSettings | None = None,
        metrics_public: bool = False,
        keys: KeyRing | None = None,
        activity: ActivityStore | None = None,
        capture: bool = False,
        capture_models: dict[str, bool] | None = None,
        capture_max_bytes: int = 64 * 1024,
        allow_remote_media: bool = False,
        audio_max_bytes: int = 25 * 1024 * 1024,
    ) -> None:
        #: The largest audio file a whisper model takes (server.audio_max_bytes; see ``_audio``).
        self.audio_max_bytes = audio_max_bytes
        #: ``http(s)`` media URLs reach the children (server.allow_remote_media; see ``_media``).
        self.allow_remote_media = allow_remote_media
        #: ``/metrics`` answers without the API key (server.metrics_public).
        self.metrics_public = metrics_public
        #: Seconds between ``: keep-alive`` comments while a stream waits (0: off).
        self.sse_keepalive = sse_keepalive
        #: The client's connection stays open after a streamed answer (server.keep_alive_streams).
        self.keep_alive_streams = keep_alive_streams
        self.settings = settings
        self.cors_origins = list(cors_origins or [])
        self.supervisor = supervisor
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.model_dirs = [p.resolve() for p in model_dirs]
        self.reload = reload
        self.metrics = Metrics(supervisor.status)
        #: Keys built from the supervisor's config follow it across reloads (``Recorder.follow``).
        self.follows_config = keys is not None
        if keys is None:  # server.api_key alone: one admin key
            keys = KeyRing([Key(ADMIN_KEY_NAME, api_key.encode(), admin=True)] if api_key else [])
        #: Keys, limits and the activity log: what the middleware checks and records.
        self.recorder = Recorder(
            activity,
            keys,
            Limiter(),
            self.metrics,
            capture=capture,
            capture_models=dict(capture_models or {}),
            capture_max_bytes=capture_max_bytes,
        )
        if self.follows_config:
            self.recorder.follow(supervisor.config)
        #: Set when the service starts stopping: endless responses (events, log follow) end then.
        self.closing = anyio.Event()
        self.upstream: httpx.AsyncClient = async_pool(httpx.Timeout(None, connect=5.0), max_keepalive=512)
        #: The relay's own connections for streamed answers (``_upstream_http``: issue 21).
        self.streams = StreamPool(connect_timeout=5.0, max_idle=512)

    def apply(self, config: ForgeConfig) -> None:
        """A reloaded config's ``[server]`` settings that the gateway reads per request, from the
        next request on. Keys and capture follow the config by themselves (``Recorder.follow``);
        what only a restart applies is named by the reload (``service._server``)."""
        server = config.server
        self.max_body_bytes = server.max_body_bytes
        self.model_dirs = [p.resolve() for p in config.model_dirs]
        self.sse_keepalive = server.sse_keepalive
        self.keep_alive_streams = server.keep_alive_streams
        self.metrics_public = server.metrics_public
        self.allow_remote_media = server.allow_remote_media
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
AUDIO_PATHS = frozenset(
    {"/v1/audio/transcriptions", "/audio/transcriptions", "/v1/audio/translations", "/audio/translations"}
)


def body_limit(st: GatewayState, path: str) -> int:
    """The body limit of a route: ``max_body_bytes``, or on the audio routes enough for an
    ``audio_max_bytes`` file and its form (the file itself is checked by ``_audio``)."""
    if path in AUDIO_PATHS:
        return max(st.max_body_bytes, st.audio_max_bytes + _FORM_OVERHEAD)
    return st.max_body_bytes
