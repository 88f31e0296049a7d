"""The inference-routing gauges on a real `forge serve` with the real llama-server: the key-free
metrics port serves /metrics alone, and under a real burst the specs the shipped endpoint-picker
config names track the load (waiting rises past max_concurrency, running = in flight, KV usage
rises with a long prompt and falls back after)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.deploy.test_inference import COMPONENT, resolve
from tests.support.service import model_section, running_service, wait_for, write_config

KEY = "pool-metrics-test-key"


def _specs() -> dict[str, str]:
    text = yaml.safe_load((COMPONENT / "epp-config.yaml").read_text())["data"]["epp-config.yaml"]
    config = yaml.safe_load(text)
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    engine = next(e for e in extractor["parameters"]["engineConfigs"] if e["name"] == "rocmforge")
    return {k: v for k, v in engine.items() if k.endswith("Spec")}


@pytest.fixture
def service(tmp_path: Path, llama_server_bin: Path, smollm2_path: Path):  # type: ignore[no-untyped-def]
    cfg = f'[server]\napi_key = "{KEY}"\nmetrics_port = 0\n\n' + model_section(
        "m", smollm2_path, ctx_size=1024, parallel=1, max_concurrency=1, preload=True, args=["--threads", "1"]
    )
    with running_service(
        write_config(tmp_path / "forge.toml", cfg), tmp_path / "state", llama_server_bin, api_key=KEY
    ) as svc:
        yield svc


def _metrics_url(svc: Any) -> str:
    info = json.loads((svc.state_dir / "service.json").read_text())
    port = info["metrics_port"]
    assert isinstance(port, int) and port > 0
    return f"http://127.0.0.1:{port}"


def test_the_metrics_port_serves_metrics_alone_without_a_key(service: Any) -> None:
    url = _metrics_url(service)
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200 and "forge_requests_waiting" in r.text
    for path in ("/v1/models", "/api/models", "/health", "/", "/api/status"):
        assert httpx.get(f"{url}{path}", timeout=5).status_code == 404, path
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=5)
    assert r.status_code in (404, 405)
    # The main port still wants the key for /metrics (metrics_public is off).
    assert httpx.get(f"{service.url}/metrics", timeout=5).status_code == 401


def test_the_picker_specs_track_a_real_burst(service: Any) -> None:
    url = _metrics_url(service)
    specs = _specs()

    def read() -> dict[str, float]:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        out = {}
        for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
            found = resolve(specs[key], text)
            assert len(found) == 1, (key, found)
            out[key] = found[0][1]
        return out

    idle = read()
    assert idle == {"queuedRequestsSpec": 0, "runningRequestsSpec": 0, "kvUsageSpec": 0}
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~400 tokens
    body = {"model": "m", "prompt": prompt, "max_tokens": 48, "ignore_eos": True, "temperature": 0}
    results: list[int] = []

    def one() -> None:
        with service.client() as c:
            results.append(c.post("/v1/completions", json=body).status_code)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    seen: list[dict[str, float]] = []
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        seen.append(read())
        time.sleep(0.1)
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]
    assert max(s["queuedRequestsSpec"] for s in seen) >= 1  # max_concurrency 1: the others wait
    assert max(s["runningRequestsSpec"] for s in seen) == 1  # never more than the one in flight
    busy = [s["kvUsageSpec"] for s in seen if s["runningRequestsSpec"] == 1]
    assert busy and max(busy) > 0.3  # a ~400-token prompt in a 1024-token slot
    after = wait_for(lambda: (r := read())["runningRequestsSpec"] == 0 and r, timeout=10, what="idle")
    assert after["kvUsageSpec"] == 0 and after["queuedRequestsSpec"] == 0
