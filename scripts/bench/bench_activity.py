"""Benchmark: does the activity log move the gateway's relay? Two real `forge serve`
processes on the same tiny random-weight GGUF (never emits EOS; one slot per stream), one with
``activity = false`` and one with the log on (the default), driven in one run with interleaved
rounds (off/on order alternating) at 16 and 64 streams; medians of chunks/s and of the gateway
process's own CPU per streamed chunk, and the on/off ratio. Short streams (``--tokens``, default
32) make the per-request record count more per chunk than in real use.

Usage: .venv/bin/python scripts/bench/bench_activity.py [--rounds 5] [--streams 16 64] [--tokens 32]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import anyio
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import STALL, Path_, machine_load, proc, run_round, wait_http

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _config(tmp: Path, name: str, tiny: Path, streams: int, activity: bool) -> Path:
    cfg = tmp / f"{name}.toml"
    cfg.write_text(
        f"""
[server]
activity = {"true" if activity else "false"}
[models.tiny]
path = "{tiny}"
gpu = "cpu"
ctx_size = {streams * 256}
parallel = {streams}
max_concurrency = {streams}
queue = 4096
preload = true
args = ["--threads", "1"]
"""
    )
    return cfg


async def _rounds(
    paths: list[Path_], args: argparse.Namespace
) -> dict[tuple[str, int], list[tuple[float, float]]]:
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    for p in paths:
        p.client = httpx.AsyncClient(timeout=STALL, limits=limits)
        await run_round(p, args.streams[0], 8, ignore_eos=True)  # warm
    try:
        for rnd in range(args.rounds):
            for n in args.streams:
                order = paths if rnd % 2 == 0 else paths[::-1]
                for p in order:
                    cpu0 = p.cpu_time()
                    rate, _, errors, chunks = await run_round(p, n, args.tokens, ignore_eos=True)
                    p.errors += errors
                    out.setdefault((p.name, n), []).append(
                        (rate, (p.cpu_time() - cpu0) / max(1, chunks) * 1000)
                    )
                line = "  ".join(f"{p.name} {out[(p.name, n)][-1][0]:7.0f}" for p in paths)
                print(f"round {rnd + 1} streams={n:<3} chunks/s  {line}", file=sys.stderr, flush=True)
    finally:
        for p in paths:
            assert p.client is not None
            await p.client.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--streams", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()

    from rocmforge_supervisor.binaries import locate_llama_server
    from rocmforge_supervisor.config import get_settings
    from tests.support.tiny_gguf import write_tiny_gguf

    binary = locate_llama_server(get_settings()).path
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-activity-"))
    try:
        tiny = write_tiny_gguf(tmp / "tiny.gguf")
        n = max(args.streams)
        paths: list[Path_] = []
        with ExitStack() as stack:
            for name, on in (("log off", False), ("log on", True)):
                env = dict(
                    os.environ,
                    FORGE_STATE_DIR=str(tmp / name.replace(" ", "-")),
                    FORGE_LLAMA_SERVER=str(binary),
                )
                cfg = _config(tmp, name.replace(" ", "-"), tiny, n, on)
                argv = [
                    sys.executable,
                    "-m",
                    "rocmforge_supervisor.cli",
                    "serve",
                    "--config",
                    str(cfg),
                    "--port",
                    "0",
                ]
                svc = stack.enter_context(proc(argv, tmp / f"{name.replace(' ', '-')}.log", env))
                assert svc.stdout is not None
                url = svc.stdout.readline().strip()
                wait_http(f"{url}/ready", svc, f"forge serve ({name})")
                paths.append(Path_(name, url, None, "tiny", svc.pid))
            time.sleep(2)
            print(f"machine before: {machine_load()}", file=sys.stderr, flush=True)
            results = anyio.run(_rounds, paths, args)
            print(f"machine after: {machine_load()}", file=sys.stderr, flush=True)
        rows = (
            sqlite3.connect(tmp / "log-on" / "activity.db")
            .execute("SELECT COUNT(*) FROM requests")
            .fetchone()[0]
        )
        print(
            f"\n## Activity log on vs off ({args.rounds} interleaved rounds, medians; {args.tokens} tokens per stream, tiny GGUF, CPU)\n"
        )
        print("| streams | chunks/s off | chunks/s on | on/off | gateway ms CPU/chunk off | on |")
        print("|---|---|---|---|---|---|")
        for s in args.streams:
            off, on = results[("log off", s)], results[("log on", s)]
            r_off, r_on = statistics.median(r for r, _ in off), statistics.median(r for r, _ in on)
            c_off, c_on = statistics.median(c for _, c in off), statistics.median(c for _, c in on)
            print(f"| {s} | {r_off:.0f} | {r_on:.0f} | {r_on / r_off:.3f} | {c_off:.3f} | {c_on:.3f} |")
        print(
            f"\nerrors: {' / '.join(f'{p.name} {p.errors}' for p in paths)}; rows written with the log on: {rows}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
