"""The gateway's data path through a real `forge serve` and a real llama-server child:
keep-alive requests do not wait on Nagle, and a stream arrives byte for byte as the child sent it."""

from __future__ import annotations

import re
import socket
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.service import Service, running_service, wait_for, write_config

CONFIG = """
[supervisor]
health_interval = 0.5
[models.tiny]
path = "{path}"
gpu = "cpu"
ctx_size = 512
parallel = 1
preload = true
"""


@contextmanager
def _twin(svc: Service, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A second llama-server with the child's exact command line (binary, model, every flag), on
    another port with a key of ours: at temperature 0 it sends what the child sends. (The child's
    own key file is removed once it has started, so the child itself cannot be asked directly.)"""
    (proc,) = svc.llama_children()
    args = proc.cmdline()
    key_file = tmp_path / "twin.key"
    key_file.write_text("twin-key\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--api-key-file") + 1] = str(key_file)
    log = (tmp_path / "twin.log").open("w")
    twin = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert twin.poll() is None, (tmp_path / "twin.log").read_text()
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=60, what="the twin llama-server")
        yield url, "twin-key"
    finally:
        twin.kill()
        twin.wait(10)
        log.close()


def test_keep_alive_requests_do_not_wait_for_delayed_acks(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    """With Nagle on, every request after the first on a connection took ~40 ms (the client's
    delayed ACK); without, a /health round trip is well under a millisecond. The median of 20
    is compared with 20 ms: a functional guard with room for a loaded machine, not a benchmark."""
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(path=tiny_gguf).replace("preload = true", ""))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        with httpx.Client(base_url=svc.url, timeout=10) as c:
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                times.append(time.perf_counter() - t0)
        assert statistics.median(times) < 0.020, f"keep-alive /health took {times}"


_VOLATILE = re.compile(rb'"(created|id|system_fingerprint)":("[^"]*"|\d+)|"timings":\{[^}]*\}')


def _mask(body: bytes) -> bytes:
    """Per-response values (creation time, response id, timings) replaced; every other byte kept."""
    return _VOLATILE.sub(rb'"\1":-', body)


def test_stream_through_gateway_is_the_childs_bytes(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(path=tiny_gguf))
    body = {
        "model": "tiny",
        "prompt": "The quick brown fox",
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc:
        with _twin(svc, tmp_path) as (child_url, key), httpx.Client(timeout=60) as c:
            via = c.post(f"{svc.url}/v1/completions", json=body)
            direct = c.post(
                f"{child_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        assert via.status_code == direct.status_code == 200
        assert via.headers["content-type"] == direct.headers["content-type"]
        assert via.content.count(b"data: ") == direct.content.count(b"data: ") >= 48
        assert via.content.endswith(b"data: [DONE]\n\n")
        assert _mask(via.content) == _mask(direct.content)
