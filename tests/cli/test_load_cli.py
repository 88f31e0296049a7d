"""`forge load` as a user runs it: real subprocesses, real llama-server, real bad inputs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


@pytest.fixture
def env(tmp_path: Path, llama_server_bin: Path) -> dict[str, str]:
    return dict(
        os.environ,
        FORGE_STATE_DIR=str(tmp_path / "state"),
        FORGE_LLAMA_SERVER=str(llama_server_bin),
        COLUMNS="200",
    )


def _forge(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_prompt_streams_one_completion(tiny_gguf: Path, env: dict[str, str]) -> None:
    r = _forge(["load", str(tiny_gguf), "--prompt", "Once upon", "--max-tokens", "5", "--gpu", "cpu"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "5 completion tokens" in r.stderr and "finish: length" in r.stderr


def test_embedded_default_model_by_name(env: dict[str, str], gemma_path: Path) -> None:
    r = _forge(
        ["load", "gemma-3-270m", "-p", "The capital of France is", "-n", "8", "--ctx-size", "512"], env
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 0


def _not_gguf(tmp: Path) -> str:
    p = tmp / "notes.gguf"
    p.write_text("hello, not a model\n" * 10)
    return str(p)


def _truncated(tmp: Path, tiny: Path) -> str:
    p = tmp / "cut.gguf"
    p.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 3])
    return str(p)


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "no model file at"),
        ("directory", "is a directory"),
        ("not_gguf", "GGUF"),
        ("truncated", "truncated"),
        ("bad_ctx", "--ctx-size"),
        ("bad_gpu", "--gpu"),
        ("bad_ngl", "--n-gpu-layers"),
    ],
)
def test_bad_input_one_line_exit_2_nothing_left(
    case: str, needle: str, tmp_path: Path, tiny_gguf: Path, env: dict[str, str]
) -> None:
    args = {
        "missing": ["load", str(tmp_path / "nope.gguf")],
        "directory": ["load", str(tmp_path)],
        "not_gguf": ["load", _not_gguf(tmp_path)],
        "truncated": ["load", _truncated(tmp_path, tiny_gguf)],
        "bad_ctx": ["load", str(tiny_gguf), "--ctx-size", "-3"],
        "bad_gpu": ["load", str(tiny_gguf), "--gpu", "fastest"],
        "bad_ngl": ["load", str(tiny_gguf), "--n-gpu-layers", "lots"],
    }[case]
    r = _forge([*args, "--prompt", "x"], env, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # no_orphans (autouse) checks that no llama-server was left behind.


def test_port_taken_is_a_usage_error(tiny_gguf: Path, env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _forge(["load", str(tiny_gguf), "--port", str(port), "--prompt", "x", "--gpu", "cpu"], env)
    assert r.returncode == 2
    assert f"port {port}" in r.stderr and "already in use" in r.stderr


def test_foreground_serves_until_ctrl_c(tiny_gguf: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [*FORGE, "load", str(tiny_gguf), "--gpu", "cpu", "--ctx-size", "512"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().strip()
        assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
        assert httpx.get(base.removesuffix("/v1") + "/health", timeout=5).status_code == 200
        children = [
            p for p in psutil.Process(proc.pid).children(recursive=True) if "llama-server" in p.name()
        ]
        assert len(children) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "API key" in err and "pid / port" in err and "stopping" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
