"""``/api/openapi.json`` (an OpenAPI 3.1 document of every route the app serves) and ``/api/docs``.

Built from the app's own route table at request time, so a route another module adds (a new
dialect, a status page) is listed without being registered here. Starlette's ``SchemaGenerator``
was not used: it reads YAML out of docstrings and emitted ``"get": {"Alive": …}`` for plain ones,
which no OpenAPI tool accepts. The docs page is plain server-rendered HTML: no script, no
third-party origin (the service is often on a machine without internet, behind a strict CSP).
"""

from __future__ import annotations

import html
import inspect
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..._version import __version__

__all__ = ["document", "routes"]

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}")
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
_MODEL_BODY = {
    "type": "object",
    "required": ["model"],
    "properties": {"model": {"type": "string", "description": "a name from GET /v1/models"}},
    "additionalProperties": True,
}


def routes() -> list[BaseRoute]:
    return [
        Route("/api/openapi.json", _openapi, methods=["GET"], include_in_schema=False),
        Route("/api/docs", _docs, methods=["GET"], include_in_schema=False),
    ]


def _summary(route: Route) -> str:
    doc = inspect.getdoc(route.endpoint) or ""
    m = re.search(r"^summary:\s*(.+)$", doc, re.MULTILINE)
    if m:
        return m.group(1).strip()
    if doc:
        return doc.splitlines()[0].strip()
    if route.path.startswith("/v1/"):
        return f"OpenAI-compatible {route.path}, forwarded to the model named in the body"
    return route.path


def _operation(route: Route, method: str, path: str) -> dict[str, Any]:
    tag = "openai" if path.startswith("/v1") else "control" if path.startswith("/api") else "service"
    op: dict[str, Any] = {
        "summary": _summary(route),
        "operationId": f"{method}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_') or 'root'}",
        "tags": [tag],
        "responses": {
            "200": {"description": "OK"},
            "default": {
                "description": "an error, in the shape of the API the request was sent to",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
        },
    }
    params = _PARAM.findall(route.path)
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
        ]
    if method == "post" and path in _MULTIPART:  # an upload: a form with the file in it
        op["requestBody"] = {
            "required": True,
            "content": {"multipart/form-data": {"schema": _MULTIPART[path]}},
        }
    elif method == "post":
        # The Batch API's bodies name no model (a batch over a file).
        model_body = path.startswith("/v1/") and not path.startswith(("/v1/files", "/v1/batches"))
        schema = _MODEL_BODY if model_body else {"type": "object"}
        op["requestBody"] = {
            "required": path.startswith("/v1/"),
            "content": {"application/json": {"schema": schema}},
        }
    return op


def _form(*fields: str, required: tuple[str, ...]) -> dict[str, Any]:
    props: dict[str, Any] = {"file": {"type": "string", "format": "binary"}}
    props.update({f: {"type": "string"} for f in fields})
    return {"type": "object", "properties": props, "required": ["file", *required]}


_AUDIO = _form("model", "language", "prompt", "response_format", "temperature", required=("model",))
#: The routes whose request is a multipart form (OpenAI's file upload and audio routes).
_MULTIPART: dict[str, dict[str, Any]] = {
    "/v1/files": _form("purpose", required=("purpose",)),
    "/v1/audio/transcriptions": _AUDIO,
    "/v1/audio/translations": _AUDIO,
}


def document(app_routes: list[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``app_routes`` (every plain :class:`Route`)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in app_routes:
        if not isinstance(route, Route):  # every route, include_in_schema or not (that flag
            continue  # only kept them out of Starlette's YAML generator)
        path = _PARAM.sub(r"{\1}", route.path)
        for method in sorted((route.methods or set()) - {"HEAD"}):
            paths.setdefault(path, {})[method.lower()] = _operation(route, method.lower(), path)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "forge serve",
            "version": __version__,
            "description": "OpenAI-compatible routes under /v1 for every configured model, and the "
            "control API under /api.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": {"Error": _ERROR}},
    }


async def _openapi(request: Request) -> Response:
    return JSONResponse(document(request.app.routes))


async def _docs(request: Request) -> Response:
    doc = document(request.app.routes)
    rows = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            rows.append(
                f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}</code>"
                f"</td><td>{html.escape(op['summary'])}</td></tr>"
            )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>forge serve API</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:.2em 1em;vertical-align:top}</style>"
        "</head><body><h1>forge serve API</h1>"
        f"<p>Version {html.escape(__version__)}. The machine-readable document: "
        "<a href='/api/openapi.json'>/api/openapi.json</a> (OpenAPI 3.1).</p>"
        "<table><tr><th>Method</th><th>Path</th><th>What</th></tr>" + "".join(rows) + "</table></body></html>"
    )
    return HTMLResponse(page)
