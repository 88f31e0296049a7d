"""Benchmark: does one interactive client stay responsive while a batch load fills the
model? One real `forge serve` per mode on one model with ``parallel = 2`` and a deep queue;
a background load of ``--batch-clients`` clients (each sending one non-streamed request after
another, ``X-Priority: batch`` when priorities are on) plus one interactive client sending a
streamed request every ``--interval`` seconds. Two modes, same load:

- ``fifo``: every request in one class and (no keys) one key: the admission queue is plain FIFO,
  as before priority classes;
- ``priority``: the load in the ``batch`` class, the interactive client in ``interactive``.

Reported per mode: the interactive requests' queue wait (from the activity log: request received →
a slot at the child) and time to first token (client side), p50/p95; one request's duration alone
(for the goal: interactive p95 queue wait under one request's duration); and the batch load's
throughput (requests/s and completion tokens/s). The model is the tiny random-weight GGUF (never
emits EOS: ``ignore_eos`` makes every answer exactly ``--tokens`` long) unless ``--model`` is given.

Usage: .venv/bin/python scripts/bench/bench_priority.py [--seconds 60] [--batch-clients 32]
       [--interval 2] [--tokens 32] [--model PATH] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import machine_load, pct, proc, wait_http

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _config(tmp: Path, mode: str, model: Path, threads: int) -> Path:
    cfg = tmp / f"{mode}.toml"
    cfg.write_text(
        f"""
[server]
state_dir = "{tmp / mode}"
[models.m]
path = "{model}"
gpu = "cpu"
ctx_size = 2048
parallel = 2
max_concurrency = 2
queue = 4096
preload = true
args = ["--threads", "{threads}"]
"""
    )
    return cfg


def _body(tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Write about the sea."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }


async def _batch_client(
    client: httpx.AsyncClient, headers: dict[str, str], tokens: int, stop: anyio.Event, done: list[int]
) -> None:
    while not stop.is_set():
        r = await client.post("/v1/chat/completions", json=_body(tokens, False), headers=headers)
        if r.status_code == 200 and not stop.is_set():
            done.append(int(r.json().get("usage", {}).get("completion_tokens", tokens)))


async def _interactive(
    client: httpx.AsyncClient, tokens: int, interval: float, stop: anyio.Event, out: list[tuple[str, float]]
) -> None:
    n = 0
    while not stop.is_set():
        rid = f"interactive-{n}"
        n += 1
        t0 = time.perf_counter()
        ttft = None
        async with client.stream(
            "POST", "/v1/chat/completions", json=_body(tokens, True), headers={"X-Request-ID": rid}
        ) as r:
            async for _ in r.aiter_raw():
                if ttft is None:
                    ttft = time.perf_counter() - t0
        if r.status_code == 200 and ttft is not None:
            out.append((rid, ttft))
        with anyio.move_on_after(interval):
            await stop.wait()


async def _solo(client: httpx.AsyncClient, tokens: int) -> float:
    """One request's duration with the model otherwise idle (the goal's yardstick)."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = await client.post("/v1/chat/completions", json=_body(tokens, False))
        r.raise_for_status()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


async def _run_mode(url: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        solo = await _solo(client, args.tokens)
        headers = {"X-Priority": "batch"} if mode == "priority" else {}
        stop = anyio.Event()
        done: list[int] = []
        inter: list[tuple[str, float]] = []
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(args.batch_clients):
                tg.start_soon(_batch_client, client, headers, args.tokens, stop, done)
            await anyio.sleep(min(5.0, args.seconds / 4))  # the queue fills first
            tg.start_soon(_interactive, client, args.tokens, args.interval, stop, inter)
            await anyio.sleep(args.seconds)
            stop.set()
            elapsed = time.perf_counter() - t0
            tg.cancel_scope.cancel()
        waits = await _queue_waits(client, {rid for rid, _ in inter})
    return {
        "solo": solo,
        "ttft": [t for _, t in inter],
        "wait": waits,
        "batch_rps": len(done) / elapsed,
        "batch_tps": sum(done) / elapsed,
        "batch_n": len(done),
    }


async def _queue_waits(client: httpx.AsyncClient, rids: set[str]) -> list[float]:
    """The interactive requests' queue waits as the activity log recorded them (it is written by
    its own thread: read until every one is there, at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        rows = (await client.get("/api/activity", params={"limit": 2000})).json()["activity"]
        found = {r["request_id"]: r["queue_wait"] for r in rows if r["request_id"] in rids}
        if len(found) == len(rids) or time.monotonic() > deadline:
            return [w for w in found.values() if w is not None]
        await anyio.sleep(0.2)


def _line(mode: str, r: dict[str, Any]) -> str:
    w, t = r["wait"], r["ttft"]
    return (
        f"{mode:9} interactive n={len(t):3}  queue wait p50 {pct(w, 0.5):6.2f} s  p95 {pct(w, 0.95):6.2f} s  "
        f"ttft p50 {pct(t, 0.5):6.2f} s  p95 {pct(t, 0.95):6.2f} s  |  batch {r['batch_rps']:6.2f} req/s "
        f"{r['batch_tps']:7.1f} tok/s ({r['batch_n']} requests)  |  one request alone {r['solo']:.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--batch-clients", type=int, default=32)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--model", default=None, help="a GGUF (default: the tiny random-weight one)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=["fifo", "priority"])
    args = ap.parse_args()

    from rocmforge_supervisor.binaries import locate_llama_server
    from rocmforge_supervisor.config import get_settings
    from tests.support.tiny_gguf import write_tiny_gguf

    binary = locate_llama_server(get_settings()).path
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-prio-"))
    try:
        model = Path(args.model) if args.model else write_tiny_gguf(tmp / "tiny.gguf")
        print(
            f"# {machine_load()}; {args.batch_clients} batch clients, 1 interactive every {args.interval} s, "
            f"{args.tokens} tokens each, {args.seconds} s per mode, model {model.name}",
            flush=True,
        )
        for mode in args.modes:
            env = dict(os.environ, FORGE_STATE_DIR=str(tmp / mode), FORGE_LLAMA_SERVER=str(binary))
            serve = [
                sys.executable,
                "-m",
                "rocmforge_supervisor.cli",
                "serve",
                "--config",
                str(_config(tmp, mode, model, args.threads)),
                "--port",
                "0",
            ]
            with proc(serve, tmp / f"{mode}.log", env, read_stdout=True) as p:
                assert p.stdout is not None
                url = p.stdout.readline().strip()
                wait_http(f"{url}/ready", p, f"forge serve ({mode})")
                result = anyio.run(_run_mode, url, mode, args)
            print(_line(mode, result), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
