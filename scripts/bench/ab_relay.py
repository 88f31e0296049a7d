"""A/B of the gateway's relay: a baseline source tree of the package against this one, in
one interleaved session, both against the same llama-server served directly.

Two `forge serve` processes (the baseline's package first on PYTHONPATH, and this tree's), each with
the tiny random-weight GGUF at one slot per stream (the ceiling test of bench_gateway.py), and a
direct llama-server twin of this tree's child. For each stream count, ``--reps`` rounds, the three
paths in rotating order; medians of chunks/s (as a ratio to direct), added TTFT p50 and the gateway
process's CPU per streamed chunk, and the paired (same round) median of new/old CPU per chunk, the
figure least moved by the box's other load.

Usage: .venv/bin/python scripts/bench/ab_relay.py BASELINE_DIR [--streams 1 32 64] [--tokens 384]
       [--reps 7]   (BASELINE_DIR holds a rocmforge_supervisor/: `git archive main rocmforge_supervisor
       | tar -x -C DIR`)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT))

import bench_gateway as b  # noqa: E402


async def rounds(paths: list[b.Path_], streams: list[int], tokens: int, reps: int) -> list[str]:
    b.open_clients(paths, max(streams))  # one client per stream, as bench_gateway's rounds
    out = [
        "| streams | direct chunks/s | old/direct | new/direct | old added TTFT p50 ms | new added TTFT p50 ms "
        "| old ms CPU/chunk | new ms CPU/chunk | new/old CPU per chunk (paired) | errors d/o/n |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    try:
        for p in paths:
            await b.run_round(p, max(streams), 8, ignore_eos=True)  # warm
        for n in streams:
            rate: dict[str, list[float]] = {p.name: [] for p in paths}
            ttft: dict[str, list[float]] = {p.name: [] for p in paths}
            cpu: dict[str, list[float]] = {p.name: [] for p in paths}
            errors = {p.name: 0 for p in paths}
            for rep in range(reps):
                for p in paths[rep % len(paths) :] + paths[: rep % len(paths)]:
                    cpu0 = p.cpu_time()
                    r, ttfts, e, chunks = await b.run_round(p, n, tokens, ignore_eos=True)
                    rate[p.name].append(r)
                    ttft[p.name].append(statistics.median(ttfts) if ttfts else float("nan"))
                    cpu[p.name].append((p.cpu_time() - cpu0) / max(1, chunks) * 1000)
                    errors[p.name] += e

            def med(d: dict[str, list[float]], k: str) -> float:
                return statistics.median(d[k])

            paired = statistics.median(x / y for x, y in zip(cpu["new"], cpu["old"], strict=True) if y)
            out.append(
                f"| {n} | {med(rate, 'direct'):.0f} | {med(rate, 'old') / med(rate, 'direct'):.3f} "
                f"| {med(rate, 'new') / med(rate, 'direct'):.3f} "
                f"| {(med(ttft, 'old') - med(ttft, 'direct')) * 1000:+.1f} "
                f"| {(med(ttft, 'new') - med(ttft, 'direct')) * 1000:+.1f} "
                f"| {med(cpu, 'old'):.3f} | {med(cpu, 'new'):.3f} | {paired:.2f} "
                f"| {errors['direct']}/{errors['old']}/{errors['new']} |"
            )
            print(out[-1], file=sys.stderr, flush=True)
    finally:
        await b.close_clients(paths)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("baseline", type=Path)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 32, 64])
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()

    from rocmforge_supervisor.binaries import locate_llama_server
    from rocmforge_supervisor.config import get_settings
    from tests.support.tiny_gguf import write_tiny_gguf

    binary = locate_llama_server(get_settings()).path
    n = max(args.streams)
    tmp = Path(tempfile.mkdtemp(prefix="forge-ab-"))
    try:
        tiny = write_tiny_gguf(tmp / "tiny.gguf")
        key = tmp / "bench.key"
        key.write_text("bench-key\n")
        with ExitStack() as stack:
            gateways: dict[str, b.Path_] = {}
            child: list[str] = []
            for name, src in (("old", args.baseline.resolve()), ("new", ROOT)):
                cfg = tmp / f"{name}.toml"
                cfg.write_text(
                    f'[models.tiny]\npath = "{tiny}"\ngpu = "cpu"\nctx_size = {n * 256}\nparallel = {n}\n'
                    f"max_concurrency = {n}\nqueue = 4096\npreload = true\n"
                )
                env = dict(
                    os.environ,
                    FORGE_STATE_DIR=str(tmp / f"state-{name}"),
                    FORGE_LLAMA_SERVER=str(binary),
                    PYTHONPATH=str(src),
                )
                where = subprocess.run(
                    [sys.executable, "-c", "import rocmforge_supervisor as r; print(r.__file__)"],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
                print(f"{name}: {where}", file=sys.stderr)
                cmd = [
                    sys.executable,
                    "-m",
                    "rocmforge_supervisor.cli",
                    "serve",
                    "--config",
                    str(cfg),
                    "--port",
                    "0",
                ]
                os.chdir(tmp)  # not the repository root: PYTHONPATH picks the package
                p = stack.enter_context(b.proc(cmd, tmp / f"{name}.log", env, read_stdout=True))
                assert p.stdout is not None
                url = p.stdout.readline().strip()
                if not url.startswith("http"):
                    raise RuntimeError((tmp / f"{name}.log").read_text())
                b.wait_http(f"{url}/ready", p, name)
                gateways[name] = b.Path_(name, url, None, "tiny", p.pid)
                child = b.llama_children(p.pid)["tiny"]
            port = b.free_port()
            d = stack.enter_context(b.proc(b.twin_args(child, port, key), tmp / "direct.log"))
            b.wait_http(f"http://127.0.0.1:{port}/health", d, "direct llama-server")
            direct = b.Path_("direct", f"http://127.0.0.1:{port}", "bench-key", "tiny", d.pid)
            print(f"machine before: {b.machine_load()}", file=sys.stderr)
            t0 = time.monotonic()
            rows = anyio.run(
                rounds, [direct, gateways["old"], gateways["new"]], args.streams, args.tokens, args.reps
            )
            print(
                f"\n## Relay A/B: tiny GGUF, one slot per stream, ignore_eos, {args.tokens} tokens, "
                f"{args.reps} interleaved rounds per row, medians ({time.monotonic() - t0:.0f} s)\n"
            )
            print("\n".join(rows))
            print(f"machine after: {b.machine_load()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
