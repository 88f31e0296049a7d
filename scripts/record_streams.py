#!/usr/bin/env python3
"""Re-record the SSE fixtures in tests/fixtures/streams/ from a real llama-server.

The SSE decoder's tests replay these bytes, cut at random points, so they must be what llama-server
really sends: each file is the raw response body as received (``iter_raw``), nothing re-encoded.

    .venv/bin/python scripts/record_streams.py --server /path/to/llama-server [--model gemma.gguf]

Without ``--model`` the embedded gemma-3-270m is used; the tiny random-weight GGUF is written to a
temporary directory. ``--server`` defaults to ``FORGE_LLAMA_SERVER`` (through ForgeSettings).

Files written:
    chat_include_usage.sse          /v1/chat/completions, stream_options.include_usage (gemma)
    completions.sse                 /v1/completions (gemma)
    native_completion.sse           /completion, the native endpoint that sends no [DONE] (gemma)
    tiny_completions.sse            /v1/completions from the tiny random-weight GGUF
    tiny_chat_midstream_error.sse   /v1/chat/completions from the tiny GGUF built with
                                    invalid_utf8=True: a REAL mid-stream error (chat parser) after
                                    the role chunk, then the end without [DONE]
    error_400_exceed_context.json   the body of a too-long prompt against ``-c 256`` (HTTP 400);
                                    llama-server raises a smaller -c to 256 (``-c 64`` gives a
                                    256-token slot), so the prompt is made longer than that
    fake_midstream_error.sse        SYNTHETIC: the start of the chat stream, then llama-server's
                                    mid-stream error frame, then the end without [DONE]; a real
                                    one (KV pool overflow, compute error) cannot be provoked on demand
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "streams"
_LISTENING = re.compile(r"listening on (http://\S+)")

# The shape llama-server sends for an error after the stream has started (llama-server-details.md §3.0).
_MIDSTREAM_ERROR = (
    b'data: {"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}\n\n'
)


@contextmanager
def llama_server(server: Path, model: Path, *extra: str, deadline_s: float = 120.0) -> Iterator[str]:
    """Start llama-server on an OS-chosen port, yield its base URL once /health is 200, stop it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    with tempfile.TemporaryDirectory() as xdg:
        env["XDG_CONFIG_HOME"] = xdg
        cmd = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", "0", "--log-colors", "off"]
        proc = subprocess.Popen(
            [*cmd, *extra], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stderr is not None
            for raw in proc.stderr:
                lines.put(raw.decode("utf-8", "replace"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            end = time.monotonic() + deadline_s
            url = None
            while url is None:
                try:
                    line = lines.get(timeout=max(0.01, end - time.monotonic()))
                except queue.Empty:
                    raise RuntimeError(f"llama-server did not listen within {deadline_s} s") from None
                if line is None:
                    raise RuntimeError(f"llama-server exited with {proc.wait()} before listening")
                if m := _LISTENING.search(line):
                    url = m.group(1)
            with httpx.Client(timeout=5) as client:
                while client.get(f"{url}/health").status_code != 200:
                    if time.monotonic() > end:
                        raise RuntimeError("llama-server never answered /health with 200")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _client(timeout: float) -> httpx.Client:
    # One connection per request: reusing one right after a stream sometimes meets a connection the
    # server is closing ("Server disconnected without sending a response", llama-server.md).
    return httpx.Client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> bytes:
    with client.stream("POST", url, json=body) as resp:
        data = b"".join(resp.iter_raw())
        if resp.status_code != 200:
            raise RuntimeError(f"{url} answered {resp.status_code}: {data[:300]!r}")
        return data


def _write(name: str, data: bytes) -> None:
    (OUT_DIR / name).write_bytes(data)
    print(f"{name}: {len(data)} bytes, {data.count(b'data:')} data lines")


def record(server: Path, gemma: Path, tiny: Path, tiny_bad: Path) -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    with (
        llama_server(server, gemma, "-c", "2048", "-np", "1", "--alias", "gemma-3-270m") as url,
        _client(120) as c,
    ):
        chat = _stream(
            c,
            f"{url}/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "Write a short poem about GPUs, with emoji."}],
                "max_tokens": 80,
                "seed": 7,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        _write("chat_include_usage.sse", chat)
        _write(
            "completions.sse",
            _stream(
                c,
                f"{url}/v1/completions",
                {"prompt": "Le café de la gare, naïve déjà vu:", "max_tokens": 60, "seed": 7, "stream": True},
            ),
        )
        _write(
            "native_completion.sse",
            _stream(
                c,
                f"{url}/completion",
                {"prompt": "The three primary colours are", "n_predict": 24, "seed": 7, "stream": True},
            ),
        )
    events = chat.split(b"\n\n")
    _write(
        "fake_midstream_error.sse",
        b": FAKE recorded-shape stand-in: the first real chat events, then llama-server's"
        b" mid-stream error frame, then the end without [DONE]\n\n"
        + b"".join(e + b"\n\n" for e in events[:4])
        + _MIDSTREAM_ERROR,
    )
    with (
        llama_server(server, gemma, "-c", "256", "-np", "1", "--alias", "gemma-3-270m") as url,
        _client(60) as c,
    ):
        body = {"messages": [{"role": "user", "content": "tell me more " * 120}], "stream": True}
        resp = c.post(f"{url}/v1/chat/completions", json=body)
        if resp.status_code != 400:
            raise RuntimeError(f"expected HTTP 400 for a too-long prompt, got {resp.status_code}")
        _write("error_400_exceed_context.json", resp.content)
    with (
        llama_server(server, tiny, "-c", "2048", "-np", "1", "--alias", "tiny-llama") as url,
        _client(60) as c,
    ):
        _write(
            "tiny_completions.sse",
            _stream(
                c,
                f"{url}/v1/completions",
                {"prompt": "the world", "max_tokens": 64, "seed": 7, "stream": True},
            ),
        )
    with (
        llama_server(server, tiny_bad, "-c", "2048", "-np", "1", "--alias", "tiny-llama-invalid-utf8") as url,
        _client(60) as c,
    ):
        chat_body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16, "stream": True}
        _write("tiny_chat_midstream_error.sse", _stream(c, f"{url}/v1/chat/completions", chat_body))


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from rocmforge_supervisor.config import ForgeSettings
    from tests.support.tiny_gguf import write_tiny_gguf

    settings = ForgeSettings()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--server", type=Path, default=settings.llama_server)
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded gemma-3-270m")
    args = parser.parse_args()
    if args.server is None:
        parser.error("no llama-server: pass --server or set FORGE_LLAMA_SERVER")
    model = args.model
    if model is None:
        from rocmforge_supervisor.models._catalog import BASE_MODEL, ensure_embedded

        model = ensure_embedded(BASE_MODEL, settings)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = write_tiny_gguf(Path(tmp) / "tiny.gguf")
        tiny_bad = write_tiny_gguf(Path(tmp) / "tiny-invalid-utf8.gguf", invalid_utf8=True)
        record(args.server, model, tiny, tiny_bad)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
