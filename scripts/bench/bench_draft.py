"""What a draft model buys and costs (speculative decoding): tokens/s and first-token time
of the same prompt with and without ``draft``, the acceptance rate, and the memory the draft adds
(the estimate's share vs what the child logged).

One real ``forge serve`` (a subprocess, its own state dir) with two models over the same GGUF:
``plain`` and ``drafted`` (``draft`` = the same file by default: SmolLM2-135M drafting for itself,
the one same-vocabulary pair the embedded models give — a real draft is a much smaller model of the
target's family, so this measures the mechanism and its overhead, not a typical speed-up). Both
on the CPU (or ``--gpu``), one slot, loaded before the timed runs; requests go one at a time.

Per model, ``--runs`` streamed requests at temperature 0: first token (send → first content
event, client side), decode tokens/s (completion tokens / (last event − first event)), and the
child's own ``timings.predicted_per_second`` and ``draft_n`` / ``draft_n_accepted``.
Memory: ``GET /api/models``' estimate and the child's logged allocations of each model; the
draft's cost is the difference between the two models.

Usage: .venv/bin/python scripts/bench/bench_draft.py [--runs 3] [--max-tokens 64] [--threads 1]
       [--draft-max 8] [--model PATH] [--draft PATH] [--gpu auto]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from rocmforge_supervisor.binaries import locate_llama_server
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import DEFAULT_MODEL, ensure_embedded

PROMPT = "Count from 1 to 60, separated by commas."


def one_run(c: httpx.Client, model: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    t0 = time.perf_counter()
    first = last = None
    timings: dict[str, Any] = {}
    events = 0
    with c.stream("POST", "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            timings = chunk.get("timings") or timings
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                events += 1
    assert first is not None and last is not None, "no content came back"
    n = int(timings.get("predicted_n") or events)
    return {
        "ttft_s": first - t0,
        "tps": (n - 1) / (last - first) if last > first else float("nan"),
        "child_tps": float(timings.get("predicted_per_second") or 0.0),
        "draft_n": int(timings.get("draft_n") or 0),
        "accepted": int(timings.get("draft_n_accepted") or 0),
        "tokens": n,
    }


def memory(c: httpx.Client, name: str) -> tuple[int, int]:
    rows = {m["name"]: m for m in c.get("/api/models").json()["models"]}
    mem = rows[name]["memory"]
    return sum(mem["estimated_bytes"].values()), sum((mem.get("actual_bytes") or {}).values())


def wait_ready(c: httpx.Client, names: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = {m["name"]: m["state"] for m in c.get("/api/models").json()["models"]}
        if all(rows.get(n) == "ready" for n in names):
            return
        time.sleep(0.2)
    raise SystemExit(f"models not ready after {timeout} s: {rows}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--model", default="", help="the target GGUF (default: the embedded SmolLM2-135M)")
    ap.add_argument("--draft", default="", help="the draft GGUF (default: the target itself)")
    ap.add_argument("--gpu", default="cpu", help='the models\' gpu key ("cpu", "auto", 0, ...)')
    args = ap.parse_args()
    settings = ForgeSettings()
    binary = locate_llama_server(settings).path
    model = args.model or str(ensure_embedded(DEFAULT_MODEL, settings))
    draft = args.draft or model
    gpu = json.dumps(int(args.gpu) if args.gpu.isdigit() else args.gpu)
    common = f'gpu = {gpu}\nctx_size = 2048\nparallel = 1\npreload = true\nargs = ["--threads", "{args.threads}"]\n'
    with tempfile.TemporaryDirectory(prefix="bench-draft-") as tmp:
        cfg = Path(tmp) / "forge.toml"
        cfg.write_text(
            "[supervisor]\nhealth_interval = 30\n"
            f'[models.plain]\npath = "{model}"\n{common}'
            f'[models.drafted]\npath = "{model}"\n{common}draft = "{draft}"\ndraft_max = {args.draft_max}\n'
        )
        env = {**os.environ, "FORGE_STATE_DIR": f"{tmp}/state", "FORGE_LLAMA_SERVER": str(binary)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rocmforge_supervisor.cli", "serve", "--config", str(cfg), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            with httpx.Client(base_url=url, timeout=60) as c:
                wait_ready(c, ["plain", "drafted"])
                print(f"llama-server {binary}\nmodel {Path(model).name}, draft {Path(draft).name}, ", end="")
                print(
                    f"{os.cpu_count()} CPUs, --threads {args.threads}, gpu {args.gpu}, draft_max {args.draft_max}"
                )
                print(f"prompt {PROMPT!r}, max_tokens {args.max_tokens}, {args.runs} runs each (median)\n")
                print(
                    "| model | first token | tokens/s (client) | tokens/s (child) | drafted | accepted | rate |"
                )
                print("|---|---|---|---|---|---|---|")
                for name in ("plain", "drafted"):
                    one_run(c, name, 8)  # warm-up
                    runs = [one_run(c, name, args.max_tokens) for _ in range(args.runs)]
                    med = {k: statistics.median(r[k] for r in runs) for k in ("ttft_s", "tps", "child_tps")}
                    n, acc = sum(r["draft_n"] for r in runs), sum(r["accepted"] for r in runs)
                    rate = f"{acc / n:.0%}" if n else "–"
                    print(
                        f"| {name} | {med['ttft_s'] * 1000:.0f} ms | {med['tps']:.1f} | {med['child_tps']:.1f} "
                        f"| {n} | {acc} | {rate} |",
                        flush=True,
                    )
                (pe, pa), (de, da) = memory(c, "plain"), memory(c, "drafted")
                mib = 2**20
                print("\n| memory | estimate | child's log |\n|---|---|---|")
                print(f"| plain | {pe / mib:.1f} MiB | {pa / mib:.1f} MiB |")
                print(f"| drafted | {de / mib:.1f} MiB | {da / mib:.1f} MiB |")
                print(f"| the draft's share | {(de - pe) / mib:.1f} MiB | {(da - pa) / mib:.1f} MiB |")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
