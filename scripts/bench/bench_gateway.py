"""Benchmark of the gateway's data path: `forge serve` as a real process, against the same
llama-server served directly and through llama.cpp's own router (`llama-server --models-dir`).

Processes (all real): `forge serve` (its child serves the model), a *direct* llama-server started with
the child's exact command line (same binary, model and flags; a key of ours: the child's own key file
is gone once it started), and a *router* llama-server with `--models-dir` and the same flags. The load
generator is this process: every concurrent stream is its own long-lived httpx client (one kept-alive
connection, as each of N SDK users would hold it). Not one client shared by all streams: llama-server
closes a connection after every streamed answer and the gateway keeps it, so a shared pool held N idle
connections only on the gateway's path, and httpcore's pool scans every connection it holds for each
request it assigns (O(N) per request, with a poll of each idle socket): at 32 streams that spread the
requests' sending over 0.3–0.5 s, which this bench then reported as the gateway's added TTFT
(measured: the requests reached the gateway's socket that late, the gateway's loop was idle).
Rounds are interleaved — for each round, each concurrency, the three paths in rotating order — and
medians reported, because the machine is shared and noisy.

Printed: tokens/s ratio to direct (c=1/4/16), added time-to-first-token p50/p99, keep-alive request
latency (20 GETs on one connection), gateway CPU per streamed chunk (the gateway process's own CPU
time, children excluded, over its streaming rounds), RSS, errors; then the ceiling test: the tiny
random-weight GGUF (never emits EOS) with one slot per stream, 32/64 streams, chunks/s through the
gateway and the router vs direct, their added TTFT p50 and CPU per chunk, and the gateway's CPU
share while it forwards them (the goal's figures).

Usage: .venv/bin/python scripts/bench/bench_gateway.py [--model PATH] [--rounds 3] [--tokens 64]
       [--concurrency 1 4 16] [--ceiling 32 64] [--pin] [--no-ceiling-router]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


#: No byte for this long on a stream counts as an error, not a wait: llama.cpp's router sometimes
#: leaves a proxied request hanging (seen at c=4 on this box), which stalled a whole run 10 minutes.
STALL = httpx.Timeout(60.0, connect=10.0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def machine_load() -> str:
    """How contended the CPU is (load average; PSI "some": the share of time tasks waited for a CPU)."""
    try:
        psi = Path("/proc/pressure/cpu").read_text().split()[1:3]
    except OSError:
        psi = ["n/a"]
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, cpu pressure {' '.join(psi)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def wait_http(url: str, proc: subprocess.Popen[Any], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {url} within {timeout} s")


@dataclass
class Path_:
    """One way to reach the model: its URL, key, model name, and the process whose CPU we charge."""

    name: str
    url: str
    key: str | None
    model: str
    pid: int
    clients: list[httpx.AsyncClient] = field(default_factory=list)
    tps: dict[int, list[float]] = field(default_factory=dict)
    ttft: dict[int, list[float]] = field(default_factory=dict)
    errors: int = 0
    chunks: int = 0
    cpu: float = 0.0

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def cpu_time(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return t.user + t.system


# -- processes --------------------------------------------------------------------------------------


@contextmanager
def proc(
    args: list[str], log: Path, env: dict[str, str] | None = None, *, read_stdout: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """``args`` running, its output in ``log``; ``read_stdout``: its stdout a pipe for the caller
    (forge serve's URL line). Nobody reads any other pipe: llama.cpp's router forwards its
    children's logs to its stdout, and with a pipe there (as every process here once had) the
    router's child blocked on a full pipe at the first burst of 32 streams — the "router hangs at
    the ceiling" of earlier runs was this bench's."""
    with log.open("w") as f:
        stdout = subprocess.PIPE if read_stdout else f
        p = subprocess.Popen(args, stdout=stdout, stderr=f, text=True, env=env)
        try:
            yield p
        finally:
            stop(p)


def stop(p: subprocess.Popen[Any], timeout: float = 60) -> None:
    """SIGTERM, a bounded wait, then SIGKILL."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def llama_children(pid: int) -> dict[str, list[str]]:
    """The forge service's llama-server children, by alias: their command lines."""
    out = {}
    for c in psutil.Process(pid).children(recursive=True):
        args = c.cmdline()
        if args and "llama-server" in Path(args[0]).name and "--alias" in args:
            out[args[args.index("--alias") + 1]] = args
    return out


def twin_args(child: list[str], port: int, key_file: Path) -> list[str]:
    args = list(child)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--api-key-file") + 1] = str(key_file)
    return args


def without(args: list[str], *flags: str) -> list[str]:
    """``args`` minus each of ``flags`` and the value after it."""
    out, i = [], 0
    while i < len(args):
        if args[i] in flags:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def router_args(child: list[str], models_dir: Path, port: int) -> list[str]:
    """The router with the child's flags (merged into every child it spawns), minus per-instance ones."""
    drop = ("-m", "--model", "--port", "--host", "--api-key-file", "--alias", "-a", "--log-file")
    return [
        *without(child, *drop),
        "--models-dir",
        str(models_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models-max",
        "1",
    ]


_CPUS = sorted(os.sched_getaffinity(0))


def place(paths: list[Path_], pin: bool) -> None:
    """``--pin``: every model server (a llama-server without ``--models-dir``: the direct twin, each
    child of forge and of the router) onto the first CPU this process may use, and the proxies
    (forge serve, the router) and this load generator onto the others. The GPU box's layout on a
    CPU box: there the model computes on the GPU and the gateway has cores of its own; unpinned on
    2 cores, the child's compute, the gateway and the load generator share both, so every ms of
    the gateway's CPU is taken from the model (what the default, unpinned run shows). Threads are
    pinned one by one (``sched_setaffinity`` is per thread); a child the router starts later
    inherits the router's CPUs, so this runs again after each warm-up."""
    if not pin:
        return
    cpus = _CPUS  # as at the start: this process is pinned itself after the first call
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs or more")
    model_cpus, proxy_cpus = set(cpus[:1]), set(cpus[1:])

    def pin_threads(pid: int, where: set[int]) -> None:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), where)

    for p in paths:
        root = psutil.Process(p.pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                args = proc.cmdline()
                model = bool(args) and "llama-server" in Path(args[0]).name and "--models-dir" not in args
                pin_threads(proc.pid, model_cpus if model else proxy_cpus)
    pin_threads(os.getpid(), proxy_cpus)


# -- load -------------------------------------------------------------------------------------------


#: ``--shared-client``: one client per path for every stream (as one ``AsyncOpenAI`` would be).
SHARED = False


def open_clients(paths: list[Path_], n: int) -> None:
    """``n`` clients per path (kept across rounds): stream ``i`` of a round always uses client ``i``;
    with ``--shared-client`` one pooled client (the OpenAI SDK's limits) is all ``n``."""
    for p in paths:
        if SHARED:
            pooled = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
            p.clients = [httpx.AsyncClient(timeout=STALL, limits=pooled)] * n
        else:
            one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            p.clients = [httpx.AsyncClient(timeout=STALL, limits=one) for _ in range(n)]


async def close_clients(paths: list[Path_]) -> None:
    for p in paths:
        for c in set(p.clients):
            await c.aclose()
        p.clients = []


async def stream_one(
    p: Path_, client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[float | None, int, bool]:
    t0 = time.perf_counter()
    ttft, n, done = None, 0, False
    try:
        async with client.stream("POST", f"{p.url}/v1/completions", json=body, headers=p.headers) as r:
            if r.status_code != 200:
                _first_error(p, f"{r.status_code} {(await r.aread())[:200]!r}")
                return None, 0, False
            async for raw in r.aiter_raw():
                if ttft is None and b"data: {" in raw:
                    ttft = time.perf_counter() - t0
                n += raw.count(b"data: {")
                if b'"error"' in raw:
                    _first_error(p, f"an error event {raw[:200]!r}")
                    return ttft, n, False
                done = done or b"data: [DONE]" in raw
    except httpx.HTTPError as exc:
        _first_error(p, f"{type(exc).__name__}: {exc}")
        return ttft, n, False
    return ttft, n, done


_SAID: set[str] = set()


def _first_error(p: Path_, what: str) -> None:
    """The first failure of each path, on stderr: an error count says nothing of its cause."""
    if p.name not in _SAID:
        _SAID.add(p.name)
        print(f"{p.name}: first error: {what}", file=sys.stderr, flush=True)


async def run_round(
    p: Path_, conc: int, tokens: int, *, ignore_eos: bool = False
) -> tuple[float, list[float], int, int]:
    body = {
        "model": p.model,
        "prompt": "Once upon a time",
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": ignore_eos,
    }
    results: list[tuple[float | None, int, bool]] = []

    async def one(client: httpx.AsyncClient) -> None:
        results.append(await stream_one(p, client, body))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for client in p.clients[:conc]:
            tg.start_soon(one, client)
    wall = time.perf_counter() - t0
    chunks = sum(n for _, n, _ in results)
    ttfts = [t for t, _, _ in results if t is not None]
    return chunks / wall, ttfts, sum(1 for *_, ok in results if not ok), chunks


async def keepalive_latency(p: Path_, path: str, n: int = 20) -> float:
    """p50 of ``n`` GETs on one kept-alive connection (the first, which opens it, not counted)."""
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1), timeout=10) as c:
        times = []
        for _ in range(n + 1):
            t0 = time.perf_counter()
            r = await c.get(f"{p.url}{path}", headers=p.headers)
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
    return statistics.median(times[1:]) * 1000


async def probe_health(p: Path_, out: list[float], stop: anyio.Event) -> None:
    """/health every 200 ms on one kept-alive connection while the rounds run. A stall in the proxy's
    own event loop (something synchronous: scraping, logging, status) shows as a spike here that the
    direct server's probe, run at the same moments on the same machine, does not have."""
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1), timeout=60) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                await c.get(f"{p.url}/health", headers=p.headers)
                out.append(time.perf_counter() - t0)
            except httpx.HTTPError:
                out.append(float("inf"))
            with anyio.move_on_after(0.2):
                await stop.wait()


async def measure(paths: list[Path_], args: argparse.Namespace) -> dict[str, list[float]]:
    open_clients(paths, max(args.concurrency))
    for p in paths:
        await run_round(p, 1, 4)  # warm: the router loads its model on the first request
    place(paths, args.pin)
    probes: dict[str, list[float]] = {p.name: [] for p in paths}
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for p in paths:
            tg.start_soon(probe_health, p, probes[p.name], stop)
        await rounds(paths, args)
        stop.set()
    await close_clients(paths)
    return probes


async def rounds(paths: list[Path_], args: argparse.Namespace) -> None:
    for rnd in range(args.rounds):
        for conc in args.concurrency:
            order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
            for p in order:
                cpu0 = p.cpu_time()
                tps, ttft, errors, chunks = await run_round(p, conc, args.tokens)
                p.cpu += p.cpu_time() - cpu0
                p.chunks += chunks
                p.tps.setdefault(conc, []).append(tps)
                p.ttft.setdefault(conc, []).extend(ttft)
                p.errors += errors
            line = "  ".join(f"{p.name} {statistics.median(p.tps[conc]):7.1f}" for p in paths)
            print(f"round {rnd + 1} c={conc:<3} tokens/s  {line}", file=sys.stderr, flush=True)
            await anyio.sleep(args.pause)  # idle gaps: llama-server's 5 s keep-alive race shows here


def table(
    paths: list[Path_], ka: dict[str, dict[str, float]], rss: dict[str, float], concs: list[int]
) -> str:
    d = paths[0]
    rows = [f"| | {' | '.join(p.name for p in paths[1:])} |", "|---|" + "---|" * (len(paths) - 1)]

    def row(label: str, f: Any) -> None:
        rows.append(f"| {label} | " + " | ".join(f(p) for p in paths[1:]) + " |")

    row(
        "tokens/s vs direct, c=" + "/".join(map(str, concs)),
        lambda p: " / ".join(
            f"{statistics.median(p.tps[c]) / statistics.median(d.tps[c]):.3f}" for c in concs
        ),
    )
    for c in (concs[0], concs[-1]):
        row(
            f"added TTFT p50 / p99, c={c} (ms)",
            lambda p, c=c: (
                f"{(statistics.median(p.ttft[c]) - statistics.median(d.ttft[c])) * 1000:+.2f} / "
                f"{(pct(p.ttft[c], 0.99) - pct(d.ttft[c], 0.99)) * 1000:+.1f}"
            ),
        )
    row(
        "keep-alive GET p50, /health; /v1/models (ms)",
        lambda p: f"{ka[p.name]['/health']:.2f}; {ka[p.name]['/v1/models']:.2f}",
    )
    row("proxy CPU per streamed chunk (ms)", lambda p: f"{p.cpu / max(1, p.chunks) * 1000:.3f}")
    row("proxy RSS (MiB)", lambda p: f"{rss[p.name]:.0f}")
    row("errors", lambda p: str(p.errors))
    head = (
        "direct: tokens/s c="
        + "/".join(f"{statistics.median(d.tps[c]):.0f}" for c in concs)
        + f"; TTFT p50 c={concs[0]} {statistics.median(d.ttft[concs[0]]) * 1000:.1f} ms; "
        f"keep-alive /health {ka[d.name]['/health']:.2f} ms; errors {d.errors}"
    )
    return head + "\n" + "\n".join(rows)


async def ceiling(
    gw: Path_, direct: Path_, router: Path_ | None, streams: list[int], tokens: int, *, pin: bool
) -> list[str]:
    """Each stream count ``reps`` times, the paths in rotating order (the box is shared: medians).
    The goal is read off the table: gateway ratio >= 0.98, its added TTFT p50 within
    10 ms of the router's, its CPU per chunk <= 0.08 ms."""
    paths = [p for p in (direct, router, gw) if p is not None]
    others = paths[1:]
    out = [
        "| streams | direct chunks/s | "
        + " | ".join(f"{p.name} ratio | {p.name} added TTFT p50 (ms) | {p.name} ms CPU/chunk" for p in others)
        + " | gateway CPU % | errors "
        + "/".join(p.name[0] for p in paths)
        + " |",
        "|---|---|" + "---|---|---|" * len(others) + "---|---|",
    ]
    open_clients(paths, max(streams))
    try:
        for p in paths:
            await run_round(p, streams[0], 8, ignore_eos=True)  # warm (the router loads its model now)
        place(paths, pin)
        for n in streams:
            rates: dict[str, list[float]] = {p.name: [] for p in paths}
            ttft: dict[str, list[float]] = {p.name: [] for p in paths}
            per_chunk: dict[str, list[float]] = {p.name: [] for p in paths}
            errs = {p.name: 0 for p in paths}
            cpu_pct: list[float] = []
            for rep in range(3):
                for p in paths[rep % len(paths) :] + paths[: rep % len(paths)]:
                    cpu0, t0 = p.cpu_time(), time.perf_counter()
                    rate, ttfts, e, chunks = await run_round(p, n, tokens, ignore_eos=True)
                    cpu, wall = p.cpu_time() - cpu0, time.perf_counter() - t0
                    rates[p.name].append(rate)
                    ttft[p.name].append(statistics.median(ttfts) if ttfts else float("nan"))
                    per_chunk[p.name].append(cpu / max(1, chunks) * 1000)
                    errs[p.name] += e
                    if p is gw:
                        cpu_pct.append(cpu / wall * 100)
            med = {name: statistics.median(xs) for name, xs in rates.items()}
            t50 = {name: statistics.median(xs) for name, xs in ttft.items()}
            cells = [
                f"{med[p.name] / med[direct.name]:.3f} | {(t50[p.name] - t50[direct.name]) * 1000:+.1f} | "
                f"{statistics.median(per_chunk[p.name]):.3f}"
                for p in others
            ]
            out.append(
                f"| {n} | {med[direct.name]:.0f} | "
                + " | ".join(cells)
                + f" | {statistics.median(cpu_pct):.0f} | {'/'.join(str(errs[p.name]) for p in paths)} |"
            )
            print("ceiling " + out[-1], file=sys.stderr, flush=True)
    finally:
        await close_clients(paths)
    return out


# -- main -------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--model",
        default=None,
        help="GGUF (default: the demo extra's gemma-3-270m, as in docs/benchmarks.md)",
    )
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--ceiling", type=int, nargs="*", default=[32, 64])
    ap.add_argument("--ceiling-tokens", type=int, default=192)
    ap.add_argument(
        "--no-ceiling-router",
        dest="ceiling_router",
        action="store_false",
        help="leave llama.cpp's router out of the ceiling test",
    )
    ap.add_argument("--pause", type=float, default=1.0, help="idle seconds between rounds")
    ap.add_argument(
        "--shared-client",
        action="store_true",
        help="one pooled httpx client per path for all its streams (the OpenAI SDK's shape: see the "
        "module docstring and server.keep_alive_streams)",
    )
    ap.add_argument(
        "--keep-alive-streams",
        action="store_true",
        help="forge keeps the client's connection after a streamed answer (server.keep_alive_streams)",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="the model servers on the first CPU, the proxies and the load generator on the rest "
        "(the GPU box's layout: see place())",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="llama-server compute threads (default 1: on a small shared box, ggml's spinning thread "
        "barrier turns any other load into 10x swings of every path; 0 = llama-server's default)",
    )
    ap.add_argument(
        "--kv-separate",
        action="store_true",
        help="each slot its own KV cache (kv_unified = false): the children's command line as forge "
        "wrote it before one shared cache became its default, for an A/B against older commits",
    )
    args = ap.parse_args()
    global SHARED
    SHARED = args.shared_client

    from rocmforge_supervisor.binaries import locate_llama_server
    from rocmforge_supervisor.config import get_settings
    from rocmforge_supervisor.models import BASE_MODEL, ensure_embedded

    settings = get_settings()
    binary = locate_llama_server(settings).path
    model = Path(args.model) if args.model else ensure_embedded(BASE_MODEL, settings)
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    try:
        run(args, binary, model, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, binary: Path, model: Path, tmp: Path) -> None:
    from tests.support.tiny_gguf import write_tiny_gguf

    tiny = write_tiny_gguf(tmp / "tiny.gguf")
    n_ceil = max(args.ceiling, default=0)
    cfg = tmp / "forge.toml"
    threads = f'args = ["--threads", "{args.threads}"]\n' if args.threads else ""
    if args.kv_separate:  # the children as forge started them before one shared KV cache
        threads += "kv_unified = false\n"
    text = f"""
[server]
keep_alive_streams = {str(args.keep_alive_streams).lower()}

[models.bench]
path = "{model}"
gpu = "cpu"
ctx_size = {1024 * args.parallel}
parallel = {args.parallel}
max_concurrency = {args.parallel}
queue = 4096
preload = true
{threads}"""
    if n_ceil:
        text += f"""
[models.tiny]
path = "{tiny}"
gpu = "cpu"
ctx_size = {n_ceil * 256}
parallel = {n_ceil}
max_concurrency = {n_ceil}
queue = 4096
preload = true
{threads}"""
    cfg.write_text(text)
    env = dict(os.environ, FORGE_STATE_DIR=str(tmp / "state"), FORGE_LLAMA_SERVER=str(binary))
    key_file = tmp / "bench.key"
    key_file.write_text("bench-key\n")
    models_dir = tmp / "router-models"
    models_dir.mkdir()
    (models_dir / "bench.gguf").symlink_to(model)
    forge = [sys.executable, "-m", "rocmforge_supervisor.cli", "serve", "--config", str(cfg), "--port", "0"]
    with ExitStack() as stack:
        svc = stack.enter_context(proc(forge, tmp / "serve.log", env, read_stdout=True))
        assert svc.stdout is not None
        url = svc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError((tmp / "serve.log").read_text())
        wait_http(f"{url}/ready", svc, "forge serve")
        children = llama_children(svc.pid)
        dport, rport = free_port(), free_port()
        direct_p = stack.enter_context(
            proc(twin_args(children["bench"], dport, key_file), tmp / "direct.log")
        )
        router_p = stack.enter_context(
            proc(router_args(children["bench"], models_dir, rport), tmp / "router.log")
        )
        wait_http(f"http://127.0.0.1:{dport}/health", direct_p, "direct llama-server")
        wait_http(f"http://127.0.0.1:{rport}/health", router_p, "router llama-server")
        paths = [
            Path_("direct", f"http://127.0.0.1:{dport}", "bench-key", "bench", direct_p.pid),
            Path_("router", f"http://127.0.0.1:{rport}", None, "bench", router_p.pid),
            Path_("forge", url, None, "bench", svc.pid),
        ]
        time.sleep(3)
        rss = {p.name: psutil.Process(p.pid).memory_info().rss / 2**20 for p in paths}
        idle_rss = rss["forge"]

        async def body() -> None:
            print(f"machine before: {machine_load()}", file=sys.stderr, flush=True)
            ka = {
                p.name: {path: await keepalive_latency(p, path) for path in ("/health", "/v1/models")}
                for p in paths
            }
            probes = await measure(paths, args)
            for p in paths:
                rss[p.name] = psutil.Process(p.pid).memory_info().rss / 2**20
            print(
                f"\n## Gateway data path ({args.rounds} interleaved rounds, medians; {args.tokens} tokens, parallel {args.parallel}, --threads {args.threads or 'default'}{', pinned (--pin)' if args.pin else ''}{', one shared client' if SHARED else ''}{', streams kept alive' if args.keep_alive_streams else ''}, {model.name}, CPU)\n"
            )
            print(table(paths, ka, rss, args.concurrency))
            print(f"\nforge serve RSS: idle {idle_rss:.0f} MiB, after the rounds {rss['forge']:.0f} MiB")
            print(f"machine after the rounds: {machine_load()}")
            print("\n/health every 200 ms during the rounds (ms): p50 / p99 / max")
            for name, xs in probes.items():
                print(
                    f"  {name:7} {pct(xs, 0.5) * 1000:8.2f} / {pct(xs, 0.99) * 1000:8.1f} / {max(xs) * 1000:8.1f}  (n={len(xs)})"
                )
            if n_ceil:
                # The first part's direct server and router go first: idle, they still held a
                # model, a port and (the router) a child nobody else would stop before the end.
                for done in (direct_p, router_p):
                    done.send_signal(signal.SIGTERM)
                    done.wait(60)
                tport, trport = free_port(), free_port()
                tproc = stack.enter_context(
                    proc(twin_args(children["tiny"], tport, key_file), tmp / "tiny.log")
                )
                wait_http(f"http://127.0.0.1:{tport}/health", tproc, "direct tiny llama-server")
                d = Path_("direct", f"http://127.0.0.1:{tport}", "bench-key", "tiny", tproc.pid)
                r: Path_ | None = None
                if args.ceiling_router:
                    tiny_dir = tmp / "router-tiny"
                    tiny_dir.mkdir()
                    (tiny_dir / "tiny.gguf").symlink_to(tiny)
                    trouter = stack.enter_context(
                        proc(router_args(children["tiny"], tiny_dir, trport), tmp / "router-tiny.log")
                    )
                    wait_http(f"http://127.0.0.1:{trport}/health", trouter, "router tiny llama-server")
                    r = Path_("router", f"http://127.0.0.1:{trport}", None, "tiny", trouter.pid)
                g = Path_("forge", url, None, "tiny", svc.pid)
                print(
                    f"\n## Ceiling: tiny GGUF, one slot per stream, ignore_eos, {args.ceiling_tokens} tokens, "
                    f"--threads {args.threads or 'default'}{', pinned (--pin)' if args.pin else ''}"
                    f"{', one shared client' if SHARED else ''}"
                    f"{', streams kept alive' if args.keep_alive_streams else ''}, "
                    "3 interleaved runs per row, medians\n"
                )
                rows = await ceiling(g, d, r, args.ceiling, args.ceiling_tokens, pin=args.pin)
                print("\n".join(rows))
                print(f"machine after the ceiling: {machine_load()}")

        anyio.run(body)


if __name__ == "__main__":
    main()
