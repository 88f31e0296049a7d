"""Which of forge's modules one request walks through, in order of first entry, and which modules
are called into again from another module after the walk had left them (issue 32's "files a
streamed chat crosses"). Only the request's own task counts (the one uvicorn or starlette called the gateway in).

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


async def walk(dialect: str, stream: bool) -> tuple[list[str], list[str]]:
    order: list[str] = []
    reentered: list[str] = []
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
        elif (
            not resumed
            and rel != last
            and rel not in reentered
            and last is not None
            and frame.f_back is not None
        ):
            caller = frame.f_back.f_code.co_filename  # a call into a module already left
            if caller.startswith(PKG) and caller[len(PKG) + 1 :] != rel:
                reentered.append(rel)
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
    return order, reentered


def main() -> None:
    dialect = next((a for a in sys.argv[1:] if a in DIALECTS), "openai")
    stream = "--stream" in sys.argv
    order, reentered = anyio.run(walk, dialect, stream)
    print(f"{dialect} {'streamed' if stream else 'whole'}: {len(order)} modules")
    for rel in order:
        print("  " + rel)
    print(f"entered again after leaving: {', '.join(reentered) or 'none'}")


if __name__ == "__main__":
    main()
