"""whisper-server's self-test: it loads whisper.cpp's own ``for-tests-ggml-tiny.bin`` and serves.

The model has the shapes with no trained weights: it proves the binary loads and serves, not that
it transcribes well. Started through process/'s lifecycle (one thread), ``GET /health`` 200, then
one ``POST /inference`` of a generated 16 kHz WAV answered 200 with text.
"""

from __future__ import annotations

import collections
import io
import math
import struct
import wave
from pathlib import Path

import httpx

from ..process import WHISPER_SERVER as WHISPER_PROGRAM
from ..process import InstanceSpec, describe_returncode, probe_server

__all__ = ["SELFTEST_MODEL", "selftest_wav", "whisper_selftest"]

#: The test model the pinned whisper.cpp tree carries (under ``models/``).
SELFTEST_MODEL = "for-tests-ggml-tiny.bin"


def selftest_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 16 kHz mono 16-bit WAV of a 440 Hz tone: the format whisper-server reads without ffmpeg."""
    n = int(seconds * rate)
    frames = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


def whisper_selftest(binary: Path, model: Path, timeout: float = 120.0) -> tuple[bool, str]:
    """Start ``binary`` on ``model`` as a child runs (process/'s lifecycle, one thread); (True,
    detail) when it gets ready (``/health`` 200) and one ``/inference`` answers 200 with text."""
    if not model.is_file():
        return False, f"the self-test model {model} is missing"
    tail: collections.deque[str] = collections.deque(maxlen=3)
    spec = InstanceSpec(
        binary=binary,
        model_path=model,
        alias="whisper-selftest",
        program=WHISPER_PROGRAM,
        extra_args=["-t", "1"],
        line_listeners=[tail.append],
    )
    run = probe_server(spec, lambda client: _inference(client, timeout), timeout=timeout)
    if run.outcome == "ok":
        return True, "served /health and one /inference"
    if run.crashed:
        outcome = describe_returncode(run.returncode)
    elif run.failure is not None:
        outcome = (
            "not ready in time" if run.failure.reason == "timeout" else "exited before it answered /health"
        )
    else:
        outcome = run.outcome
    lines = [line for line in tail if not line.startswith("[forge]")]
    return False, outcome + (f" (last lines: {' | '.join(lines)})" if lines else "")


def _inference(client: httpx.Client, timeout: float) -> str:
    try:
        r = client.post(
            "/inference",
            files={"file": ("selftest.wav", selftest_wav(), "audio/wav")},
            data={"response_format": "json"},
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        return f"no answer to /inference ({type(exc).__name__})"
    if r.status_code != 200:
        return f"/inference answered HTTP {r.status_code}"
    try:
        body = r.json()
    except ValueError:
        return "/inference answered a body that is not JSON"
    return "ok" if isinstance(body, dict) and "text" in body else "/inference answered without text"
