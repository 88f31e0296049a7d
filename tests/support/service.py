"""Run a real `forge serve` in a subprocess for tests, and wait on conditions with deadlines."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]

#: ``[supervisor]`` timers for a real ``forge serve`` in tests: a crashed or hung child is noticed
#: in about a second and restarted within two; a drain or stop never waits long.
FAST = """
[supervisor]
restart_backoff_initial = 0.2
restart_backoff_max = 2.0
health_interval = 0.5
health_failures = 2
drain_timeout = 10
stop_timeout = 5
"""


def wait_for(
    cond: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@dataclass
class Service:
    proc: subprocess.Popen[str]
    url: str
    state_dir: Path
    config: Path
    api_key: str | None = None
    #: How its certificate is checked when it serves HTTPS (``[server] tls_cert``).
    verify: ssl.SSLContext | bool = True

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, verify=self.verify)

    def models(self) -> dict[str, dict[str, Any]]:
        with self.client() as c:
            rows = c.get("/api/models").json()["models"]
        return {r["name"]: r for r in rows}

    def model(self, name: str) -> dict[str, Any]:
        return self.models()[name]

    def llama_children(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in kids:
            try:
                if "llama-server" in p.name() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def stderr_text(self) -> str:
        return (self.state_dir / "serve.stderr").read_text()


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@contextmanager
def forge_process(
    args: list[str],
    state_dir: Path,
    stderr: Path,
    *,
    extra_env: dict[str, str] | None = None,
    stop_timeout: float = 30,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``forge ARGS`` with its state in ``state_dir`` and its stderr in the file ``stderr``; yields
    the process and the first line it printed (where it listens). However the block ends, it is
    sent SIGTERM, and SIGKILL if it has not exited ``stop_timeout`` seconds later."""
    env = {**os.environ, "FORGE_STATE_DIR": str(state_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("NOTIFY_SOCKET", None)
    env.update(extra_env or {})
    state_dir.mkdir(parents=True, exist_ok=True)
    with stderr.open("w") as err:
        proc = subprocess.Popen([*FORGE, *args], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def running_service(
    config: Path,
    state_dir: Path,
    llama_server_bin: Path,
    *,
    api_key: str | None = None,
    extra_env: dict[str, str] | None = None,
    wait_ready: bool = True,
    verify: ssl.SSLContext | bool = True,
) -> Iterator[Service]:
    env = {"FORGE_LLAMA_SERVER": str(llama_server_bin), **(extra_env or {})}
    stderr = state_dir / "serve.stderr"
    with forge_process(
        ["serve", "--config", str(config), "--port", "0"], state_dir, stderr, extra_env=env
    ) as (proc, url):
        if not url.startswith("http"):
            proc.wait(timeout=10)
            raise AssertionError(f"forge serve did not start (exit {proc.returncode}): {stderr.read_text()}")
        svc = Service(proc, url, state_dir, config, api_key, verify)
        if wait_ready:
            wait_for(lambda: _ready(svc), timeout=60, what="/ready")
        yield svc


def _ready(svc: Service) -> bool:
    try:
        with svc.client() as c:
            return c.get("/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def chat_and_plain_models(d: Path) -> str:
    """Two tiny models for the dialect tests, as forge.toml sections: ``chat`` (a tool-calling
    template and FIM tokens, 2 slots) and ``plain`` (no template; serves embeddings)."""
    from tests.support.tiny_gguf import TOOLS_TEMPLATE, write_tiny_gguf

    chat = write_tiny_gguf(d / "chat.gguf", chat_template=TOOLS_TEMPLATE, fim=True)
    plain = write_tiny_gguf(d / "plain.gguf")
    return f"""
[models.chat]
path = "{chat}"
gpu = "cpu"
ctx_size = 2048
parallel = 2
preload = true
[models.plain]
path = "{plain}"
gpu = "cpu"
ctx_size = 1024
parallel = 1
preload = true
args = ["--embeddings", "--pooling", "mean"]
"""


def model_section(name: str, path: Path, **kw: object) -> str:
    """``[models.NAME]`` on the CPU (ctx_size 1024 unless given), other keys as TOML values."""
    lines = [f"[models.{name}]", f'path = "{path}"', 'gpu = "cpu"']
    kw.setdefault("ctx_size", 1024)
    lines += [f"{k} = {json.dumps(v)}" for k, v in kw.items()]
    return "\n".join(lines) + "\n"
