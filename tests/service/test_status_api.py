"""The control API behind the status page: /api/devices, /api/throughput and the extra status fields,
against a real `forge serve` with real llama-server children."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from tests.support.service import running_service, wait_for, write_config

CONFIG = """
[supervisor]
restart_backoff_initial = 0.2

[models.tiny]
path = "{tiny}"
gpu = "cpu"
ctx_size = 2048
parallel = 1
preload = true
ttl = 300

[models.broken]
path = "{tiny}"
gpu = "cpu"
ctx_size = 1024
preload = true
args = ["--no-such-flag-for-the-page"]
"""


def test_devices_throughput_and_status_fields(
    tmp_path: Path, tiny_gguf: Path, llama_server_bin: Path
) -> None:
    cfg = write_config(tmp_path / "forge.toml", CONFIG.format(tiny=tiny_gguf))
    with running_service(cfg, tmp_path / "state", llama_server_bin) as svc, svc.client() as c:
        models = svc.models()
        tiny, broken = models["tiny"], models["broken"]
        assert tiny["state"] == "ready"
        assert tiny["ttl"] == 300 and 0 < tiny["ttl_left"] <= 300
        assert tiny["max_concurrency"] >= 1 and tiny["queue_limit"] >= 1
        assert broken["state"] == "failed" and broken["failure_kind"] == "bad_args"
        assert any("--no-such-flag-for-the-page" in line for line in broken["last_stderr"]), broken

        devices = c.get("/api/devices").json()["devices"]
        cpu = next(d for d in devices if d["key"] == "cpu")
        held = cpu["models"]["tiny"]
        assert held > 0 and cpu["ours_bytes"] == held and "broken" not in cpu["models"]
        assert held == sum(tiny["memory"]["actual_bytes"].values())
        assert 0 < cpu["used_bytes"] <= cpu["total_bytes"]
        assert cpu["free_bytes"] == cpu["total_bytes"] - cpu["used_bytes"]

        assert c.get("/api/throughput").json()["models"]["tiny"]["tokens_per_second"] in (0.0, None)

        # A long generation in the background: the live rate goes above zero while it runs.
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        done = threading.Event()

        def generate() -> None:
            with (
                httpx.Client(base_url=svc.url, timeout=120) as g,
                g.stream("POST", "/v1/completions", json=body) as r,
            ):
                for _ in r.iter_lines():
                    if done.is_set():
                        break
            done.set()

        worker = threading.Thread(target=generate)
        worker.start()
        try:
            rate = wait_for(
                lambda: c.get("/api/throughput").json()["models"]["tiny"].get("tokens_per_second") or 0,
                timeout=60,
                interval=0.3,
                what="a live tokens/s above zero",
            )
            assert rate > 0
            assert json.dumps(c.get("/api/throughput").json())  # stays valid JSON while busy
        finally:
            done.set()
            worker.join(timeout=60)

        # Without a key, a same-origin request counts only by IP address: a host name could be a
        # DNS-rebinding page's own.
        port = svc.url.rsplit(":", 1)[1]
        rebound = {"Host": f"rebind.example:{port}", "Origin": f"http://rebind.example:{port}"}
        assert c.post("/api/models/broken/unload", headers=rebound).status_code == 403
        by_ip = {"Host": f"127.0.0.2:{port}", "Origin": f"http://127.0.0.2:{port}"}
        assert c.post("/api/models/broken/unload", headers=by_ip).status_code == 200
