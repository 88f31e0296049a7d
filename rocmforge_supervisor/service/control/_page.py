"""The status page at ``/``: hand-written HTML, CSS and ES modules shipped as package data.

No build step and no third-party code: the files under ``static/`` are served as they are. The
page itself holds no data — everything comes from the control API with the Bearer key the page
asks for — so these paths are public (the app hands ``PAGE_PATHS`` to the auth middleware). Every page
response carries a strict Content-Security-Policy: scripts, styles and connections from this
origin only, no inline script or style, no frames.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CSP", "PAGE_PATHS", "routes"]

STATIC = Path(__file__).with_name("static")
_ASSETS = "/ui"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-cache"),
]

#: The page's own files: served without the API key (they hold no data).
PAGE_PATHS = frozenset(
    {"/", *(f"{_ASSETS}/{p.relative_to(STATIC).as_posix()}" for p in STATIC.rglob("*") if p.is_file())}
)


class _SecurityHeaders:
    """Adds the CSP and friends to every response of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k for k, _ in _HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message["headers"] = [*kept, *_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _index(request: Request) -> Response:
    headers = {k.decode(): v.decode() for k, v in _HEADERS}
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=headers)


def routes() -> list[BaseRoute]:
    return [
        Route("/", _index, methods=["GET", "HEAD"], include_in_schema=False),
        Mount(_ASSETS, app=_SecurityHeaders(StaticFiles(directory=STATIC)), name="ui"),
    ]
