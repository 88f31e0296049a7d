"""A second SIGTERM/SIGINT during the drain forces the exit, and the exit status says so.

A real ``forge serve`` subprocess; its child is the fake llama-server (tests/support), streaming
one slow SSE response that would hold the drain for 20 s.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.service import running_service, wait_for, write_config

SLOW = ["--fake-token-delay", "0.2", "--fake-chunks", "100"]  # 20 s of stream


def _config(tmp_path: Path, tiny_gguf: Path) -> Path:
    return write_config(
        tmp_path / "forge.toml",
        f'[supervisor]\ndrain_timeout = 60\n\n[models.m]\npath = "{tiny_gguf}"\nargs = {SLOW!r}\n'.replace(
            "'", '"'
        ),
    )


def _hold_a_stream(url: str, got: list[str]) -> threading.Thread:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}

    def read() -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
                got.extend(line for line in r.iter_lines() if line)
        except httpx.HTTPError as exc:
            got.append(f"error: {type(exc).__name__}")

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_forces_the_exit(tmp_path: Path, tiny_gguf: Path, fake_bin: Path, sig: int) -> None:
    with running_service(_config(tmp_path, tiny_gguf), tmp_path / "state", fake_bin) as svc:
        got: list[str] = []
        reader = _hold_a_stream(svc.url, got)
        wait_for(lambda: any(line.startswith("data: ") for line in got), timeout=30, what="the stream")
        svc.proc.send_signal(sig)
        wait_for(lambda: "stopping" in svc.stderr_text(), timeout=10, what="the drain to start")
        assert svc.proc.poll() is None, "the first signal must drain, not exit"
        started = time.monotonic()
        svc.proc.send_signal(sig)
        code = svc.proc.wait(timeout=15)
        forced_in = time.monotonic() - started
        reader.join(timeout=10)
        assert code == 128 + sig
        assert forced_in < 10
        assert "data: [DONE]" not in got  # the stream was cut off, not finished
        err = svc.stderr_text()
        assert f"forced exit: a second {signal.Signals(sig).name} during the drain" in err
        assert svc.llama_children() == []


def test_one_signal_drains_and_exits_zero(tmp_path: Path, tiny_gguf: Path, fake_bin: Path) -> None:
    cfg = write_config(
        tmp_path / "forge.toml",
        f'[models.m]\npath = "{tiny_gguf}"\nargs = ["--fake-token-delay", "0.05", "--fake-chunks", "20"]\n',
    )
    with running_service(cfg, tmp_path / "state", fake_bin) as svc:
        got: list[str] = []
        reader = _hold_a_stream(svc.url, got)
        wait_for(lambda: any(line.startswith("data: ") for line in got), timeout=30, what="the stream")
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=30) == 0
        reader.join(timeout=10)
        assert got[-1] == "data: [DONE]"  # the drain let it finish
