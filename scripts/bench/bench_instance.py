"""Benchmarks of one llama-server child, all against the real binary and real models.

1. Readiness lag: supervisor-ready time minus the moment the child's ``listening on`` line was
   read, over N loads (p50/p95). Also spawn→ready.
2. First token: ``forge load MODEL --prompt`` (a fresh CLI process: Python start, resolve,
   spawn, ready, first token) vs starting llama-server by hand and polling /health every 10 ms,
   then streaming the same request (median of runs, ratio).
3. Streaming throughput: TextModel.generate vs raw httpx + line parsing on the same child,
   alternating runs (median tokens/s, ratio).

Usage: .venv/bin/python scripts/bench/bench_instance.py [--model gemma-3-270m] [--loads 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

from rocmforge_supervisor.binaries import locate_llama_server
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import resolve_model_path
from rocmforge_supervisor.process import InstanceSpec, ModelServer, free_port
from rocmforge_supervisor.supervisor import load_model


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def readiness(
    binary: Path, flags: tuple[str, ...], model: Path, n: int, state: Path
) -> dict[str, float]:
    lags, totals = [], []
    for _ in range(n):
        spec = InstanceSpec(
            binary=binary,
            model_path=model,
            alias="b",
            ctx_size=512,
            cpu_only=True,
            state_dir=state,
            extra_args=flags,  # the self-test's flags on this CPU (--no-repack on AMX), as forge's children
        )
        t0 = time.monotonic()
        async with ModelServer(spec) as s:
            assert s.ready_monotonic is not None and s.listening_at is not None
            lags.append((s.ready_monotonic - s.listening_at) * 1000)
            totals.append((s.ready_monotonic - t0) * 1000)
    return {
        "lag_p50_ms": statistics.median(lags),
        "lag_p95_ms": pct(lags, 0.95),
        "spawn_to_ready_p50_ms": statistics.median(totals),
    }


def manual_first_token(binary: Path, flags: tuple[str, ...], model: Path, prompt: str) -> float:
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--port", str(port), "-c", "512", "--no-webui", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            while True:
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.01)
            body = {"prompt": prompt, "max_tokens": 8, "stream": True, "temperature": 0}
            with c.stream("POST", "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"text":"' in line and '"text":""' not in line:
                        return time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait()
    raise RuntimeError("no token")


def forge_first_token(model_ref: str, prompt: str, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rocmforge_supervisor.cli",
            "load",
            model_ref,
            "--prompt",
            prompt,
            "-n",
            "8",
            "-c",
            "512",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    took = time.monotonic() - t0
    proc.wait()
    if not first:
        raise RuntimeError("forge load printed nothing")
    return took


def raw_httpx_tps(base: str, key: str, max_tokens: int) -> float:
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True, "temperature": 0}
    n = 0
    with httpx.Client(timeout=120) as c:
        t0 = time.perf_counter()
        with c.stream(
            "POST", f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    n += 1
        dt = time.perf_counter() - t0
    return n / dt


def textmodel_tps(tm: object, max_tokens: int) -> float:
    t0 = time.perf_counter()
    n = sum(1 for _ in tm.generate("Once upon a time", max_tokens=max_tokens, temperature=0))  # type: ignore[attr-defined]
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--loads", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    settings = ForgeSettings()
    found = locate_llama_server(settings)
    binary, flags = found.path, found.child_args
    model = resolve_model_path(args.model, settings)
    out: dict[str, object] = {"binary": str(binary), "model": str(model)}
    with tempfile.TemporaryDirectory() as tmp:
        out["readiness"] = anyio.run(readiness, binary, flags, model, args.loads, Path(tmp))
        print(json.dumps(out["readiness"]), flush=True)

        env = dict(os.environ, FORGE_STATE_DIR=tmp)
        manual, forge = [], []
        for _ in range(args.runs):
            manual.append(manual_first_token(binary, flags, model, "The capital of France is"))
            forge.append(forge_first_token(args.model, "The capital of France is", env))
        out["first_token"] = {
            "manual_p50_s": statistics.median(manual),
            "forge_load_prompt_p50_s": statistics.median(forge),
            "ratio_forge_over_manual": statistics.median(forge) / statistics.median(manual),
        }
        print(json.dumps(out["first_token"]), flush=True)

        raw, ours = [], []
        with load_model(
            model, settings=ForgeSettings(state_dir=Path(tmp)), ctx_size=2048, gpu="cpu", parallel=1
        ) as tm:
            for _ in range(args.runs):
                raw.append(raw_httpx_tps(tm.base_url, tm.server.api_key, args.tokens))
                ours.append(textmodel_tps(tm, args.tokens))
        out["streaming"] = {
            "raw_httpx_tokens_per_s_p50": statistics.median(raw),
            "textmodel_tokens_per_s_p50": statistics.median(ours),
            "ratio": statistics.median(ours) / statistics.median(raw),
        }
        print(json.dumps(out["streaming"]), flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
