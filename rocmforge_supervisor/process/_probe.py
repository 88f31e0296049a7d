"""A server started for one question and stopped again, through the one lifecycle: the build
self-tests (llama-server's, whisper-server's) run their child this way, so that spawning, the
parent-death signal, readiness, the bind retry and the stop (SIGTERM to the group, bounded wait,
SIGKILL) are :class:`~._instance.ModelServer`'s and nothing outside ``process/`` signals a child.

The callers are synchronous (``forge build``, a binary located at start-up, a supervisor's worker
thread); the child's life runs on an event loop of its own in a short-lived thread, so the call
works whether or not the calling thread already runs one.
"""

from __future__ import annotations

import dataclasses
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from .._errors import StartFailed
from ._instance import ModelServer
from ._spec import InstanceSpec

__all__ = ["ProbeRun", "probe_server"]

#: After the question went wrong: how long the child may take to die of it (a crash on the first
#: computation), so the run says how it ended rather than "connection lost".
_DEATH_GRACE = 5.0


@dataclass(frozen=True)
class ProbeRun:
    """How one probe went: ``outcome`` is ``"ok"``, ``"not ready"`` (the start failed: ``failure``
    says why) or what the question's answer was instead; ``returncode`` when the child ended by
    itself (a crash), else None."""

    outcome: str
    returncode: int | None
    stage: str  # "load" or "question": where it ended
    failure: StartFailed | None = None

    @property
    def crashed(self) -> bool:
        """It died of itself (an exit status that is neither success nor our stop's signal)."""
        return self.returncode not in (None, 0, -signal.SIGTERM, -signal.SIGKILL)


def probe_server(spec: InstanceSpec, ask: Callable[[httpx.Client], str], *, timeout: float) -> ProbeRun:
    """Start ``spec``'s server (no key, a state directory of its own, ``timeout`` bounding the
    start), ``ask`` it one question once ready (a blocking function given a client on the child's
    URL: ``"ok"`` or what went wrong), stop it. Never raises for the server's behaviour."""
    result: list[ProbeRun | BaseException] = []

    def main() -> None:
        try:
            with tempfile.TemporaryDirectory(prefix=f"forge-{spec.alias}-") as state:
                one = dataclasses.replace(
                    spec,
                    api_key="",  # no key: it listens on loopback for this one question
                    state_dir=Path(state),
                    stall_timeout=timeout,
                    ready_timeout=timeout,
                    stop_timeout=10.0,
                )
                result.append(anyio.run(_probe, one, ask))
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=main, name=f"probe {spec.alias}", daemon=True)
    thread.start()
    thread.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


async def _probe(spec: InstanceSpec, ask: Callable[[httpx.Client], str]) -> ProbeRun:
    try:
        server = ModelServer(spec)
        async with server:

            def question() -> str:
                with httpx.Client(base_url=server.base_url, timeout=5.0, trust_env=False) as client:
                    return ask(client)

            outcome = await anyio.to_thread.run_sync(question)
            if outcome != "ok":
                with anyio.move_on_after(_DEATH_GRACE):
                    await server.exited.wait()
            died = server.returncode if server.exited.is_set() else None
    except StartFailed as exc:
        return ProbeRun("not ready", exc.returncode, "load", exc)
    return ProbeRun(outcome, died, "question")
