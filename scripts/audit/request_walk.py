"""Which of forge's modules one request walks through, in order of first entry, and whether the
walk re-enters one (the files a streamed chat crosses; no module re-entered).
Only the request's own task counts (the one uvicorn or starlette called the gateway in), and the
tasks it starts in the gateway (the relay's keep-alive and disconnect watch).

**Re-entered** is a call into a module that is still on the walk's stack, from another module: a
module called back by what it called, directly or through a callback it handed down (the relay
calling the middleware's ``send`` wrapper, a route calling back into the middleware for the body,
a dialect pulling the forwarder's iterator). That is the walk going back up a layer. A module
the walk *returns to* after it had left (the forwarder asking ``_recording`` at the start and at
the end of the request; a context manager's exit) is listed apart: every request that opens
something and closes it later does that.

Runs the gateway in-process against the FAKE llama-server (tests/support/fake_llama_server.py),
sends one warm-up request, then traces the next one with ``sys.setprofile`` (every Python call
in the process: the gateway's tasks and the client's). Only files under rocmforge_supervisor/
count; the client's own calls (httpx) are not ours.

    python scripts/audit/request_walk.py [openai|anthropic|ollama] [--stream]
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.gateway_fast.dialects import DIALECTS, chat  # noqa: E402
from tests.support.gateway import serving  # noqa: E402
from tests.support.supervised import fake_config  # noqa: E402
from tests.support.tiny_gguf import write_tiny_gguf  # noqa: E402

PKG = str(ROOT / "rocmforge_supervisor")
_SUSPENDABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


@dataclass
class Walk:
    order: list[str] = field(default_factory=list)  # modules, in order of first entry
    reentered: list[str] = field(default_factory=list)  # "module:function <- caller:function"
    returned: list[str] = field(default_factory=list)  # modules called into again after leaving


def _rel(frame: FrameType | None) -> str | None:
    if frame is None or not frame.f_code.co_filename.startswith(PKG):
        return None
    return frame.f_code.co_filename[len(PKG) + 1 :]


def _ours(frame: FrameType | None, rel: str | None = None) -> FrameType | None:
    """The nearest frame from ``frame`` up that is forge's (of module ``rel`` when given)."""
    while frame is not None and (_rel(frame) is None or (rel is not None and _rel(frame) != rel)):
        frame = frame.f_back
    return frame


async def walk(dialect: str, stream: bool) -> Walk:
    w = Walk()
    order, reentered, returned = w.order, w.reentered, w.returned
    last: str | None = None

    request_tasks: set[int] = set()
    suspendable: dict[int, FrameType] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal last
        if event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(PKG):
            return
        rel = name[len(PKG) + 1 :]
        # Only the request's own task (the one that entered the ASGI app): the children's log
        # readers and other background tasks run in the same loop but are not the request's walk.
        try:
            task = id(asyncio.current_task())
        except RuntimeError:
            return
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if rel.startswith("service/") and not caller.startswith(PKG):
            request_tasks.add(task)  # the server (uvicorn, starlette) calling into the gateway
        if task not in request_tasks:
            return
        # A suspended coroutine or generator that resumes reports a "call" of the same frame
        # again, its awaiting frame as the caller: that is the walk going on, not a new entry.
        # Such frames are kept (alive, so their ids stay theirs) to tell a resume from a call.
        resumed = suspendable.get(id(frame)) is frame
        if not resumed and frame.f_code.co_flags & _SUSPENDABLE:
            suspendable[id(frame)] = frame
        if rel not in order:
            order.append(rel)
        elif not resumed and rel != last:
            caller_frame = _ours(frame.f_back)  # through the framework's frames (a send wrapper)
            caller_rel = _rel(caller_frame)
            if caller_frame is not None and caller_rel is not None and caller_rel != rel:
                if rel not in returned:  # a call into a module the walk had left
                    returned.append(rel)
                if _ours(caller_frame.f_back, rel) is not None:  # still on the stack: back up
                    where = f"{caller_rel}:{caller_frame.f_code.co_name}"
                    reentered.append(f"{rel}:{frame.f_code.co_name} <- {where}")
        last = rel

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model = write_tiny_gguf(d / "tiny.gguf")
        fake = d / "llama-server"  # as tests/conftest.py's fake_bin: the FAKE under the real name
        script = ROOT / "tests" / "support" / "fake_llama_server.py"
        fake.write_text(f'#!/bin/bash\nexec -a llama-server "{sys.executable}" "{script}" "$@"\n')
        fake.chmod(0o755)
        config = fake_config(d, model, {"m": {"preload": True}})
        async with serving(config, fake) as gw:
            path, body = chat(dialect, "m", stream=stream)  # type: ignore[arg-type]
            (await gw.client.post(path, json=body)).raise_for_status()  # warm: imports, pools
            sys.setprofile(profile)
            try:
                r = await gw.client.post(path, json=body)
                await r.aread()
            finally:
                sys.setprofile(None)
            r.raise_for_status()
    return w


def main() -> None:
    dialect = next((a for a in sys.argv[1:] if a in DIALECTS), "openai")
    stream = "--stream" in sys.argv
    w = anyio.run(walk, dialect, stream)
    print(f"{dialect} {'streamed' if stream else 'whole'}: {len(w.order)} modules")
    for rel in w.order:
        print("  " + rel)
    print(f"re-entered (called back while on the walk's stack): {', '.join(w.reentered) or 'none'}")
    print(f"returned to after leaving: {', '.join(w.returned) or 'none'}")


if __name__ == "__main__":
    main()
