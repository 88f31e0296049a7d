"""``POST /api/pull``: the Ollama client's download, through forge's own hub pull.

The model is a Hugging Face reference (``org/repo:QUANT``, ``hf.co/org/repo:QUANT`` as Ollama
writes it, or ``hf:…``), downloaded into the Hugging Face cache exactly as ``forge pull`` does
(resumable, every part of a split GGUF, offline mode honoured). Progress streams as Ollama's NDJSON
(``{"status","digest","total","completed"}``), fed from huggingface_hub's progress callbacks in
the download thread. The last line names the ``forge.toml`` entry that serves the file: a pull
does not add a model to the running config (a config reload would drop it again).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.from_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..._errors import ForgeError, UsageError
from ...config import ForgeSettings, get_settings
from ...models._hub import parse_hf_reference
from ...models._hub import pull as hub_pull
from ..core._state import request_id, state_of
from ..edge._errors_http import error_response
from ..proxy._validate import parse_object

__all__ = ["api_pull"]

_REPORT_EVERY = 0.25  # seconds between progress lines per file


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _pull_ref(body: Any) -> str:
    """The reference a pull body names; a bad one is a 400 before anything starts."""
    ref = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if not isinstance(ref, str) or not ref:
        raise UsageError('the request has no "model" field', hint='e.g. {"model": "org/repo:Q4_K_M"}')
    ref = ref.removeprefix("hf:")
    parse_hf_reference(ref)
    return ref


def _progress_class(report: Callable[[str, int, int], None]) -> type:
    """The tqdm interface huggingface_hub drives, reporting at most every ``_REPORT_EVERY``
    seconds per file; nothing is drawn."""

    class _Progress:
        def __init__(self, *args: Any, **kw: Any) -> None:
            self.desc = str(kw.get("desc") or "")
            self.total = int(kw.get("total") or 0)
            self.n = int(kw.get("initial") or 0)
            self._last = 0.0

        def update(self, n: float | None = 1) -> None:
            self.n += int(n or 0)
            now = time.monotonic()
            if now - self._last >= _REPORT_EVERY or self.n >= self.total:
                self._last = now
                report(self.desc, self.n, self.total)

        def __enter__(self) -> _Progress:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def close(self) -> None:
            return None

        def refresh(self) -> None:
            return None

        def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
            self.desc = str(desc or self.desc)

    return _Progress


async def _pull_lines(ref: str, settings: ForgeSettings, failed: list[ForgeError]) -> AsyncIterator[bytes]:
    """Ollama's NDJSON progress of one download (run in a thread); an error ends it in ``failed``."""
    yield _line({"status": "pulling manifest"})
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](256)

    def report(desc: str, done: int, total: int) -> None:
        line = {"status": f"pulling {desc}", "digest": desc, "total": total, "completed": done}
        anyio.from_thread.run_sync(send.send_nowait, line)

    progress = _progress_class(report)

    async def download() -> None:
        async with send:
            try:
                await anyio.to_thread.run_sync(lambda: hub_pull(ref, settings, progress=progress))
            except ForgeError as exc:
                failed.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(download)
        async with receive:
            async for line in receive:
                yield _line(line)
    if failed:
        yield _line({"error": str(failed[0])})
        return
    yield _line({"status": "verifying sha256 digest"})
    yield _line({"status": f'serve it with [models.NAME] path = "hf:{ref}" in forge.toml'})
    yield _line({"status": "success"})


async def api_pull(request: Request) -> Response:
    st = state_of(request)
    try:
        body = parse_object(await request.body() or b"{}")
        ref = _pull_ref(body)
    except ValueError:
        return error_response(
            UsageError("the request body is not valid JSON", hint="send a JSON object"),
            request_id(request),
            "ollama",
        )
    except ForgeError as exc:
        return error_response(exc, request_id(request), "ollama")
    settings = st.settings or get_settings()
    failed: list[ForgeError] = []
    if body.get("stream", True) is False:
        last: dict[str, Any] = {}
        async for raw in _pull_lines(ref, settings, failed):
            last = json.loads(raw)
        if failed:  # the status the one error map gives the hub's error
            return error_response(failed[0], request_id(request), "ollama")
        return JSONResponse(last)
    return StreamingResponse(_pull_lines(ref, settings, failed), media_type="application/x-ndjson")
