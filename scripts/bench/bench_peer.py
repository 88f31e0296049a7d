"""Benchmark: the measured overhead of a peer hop. The same streamed chat request sent (a) directly
to a peer and (b) through a real ``forge serve`` whose ``[peers.p]`` points at that peer, one
request at a time, interleaved over ``--rounds`` rounds (the order alternating each round), because
the machine is shared and noisy: medians, and the paired difference of each round.

The peer, by default: the FAKE OpenAI-compatible server of tests/support/fake_peer.py (a test
double, no model: it echoes the prompt, so a prompt of ``--chunks`` − 5 words streams ``--chunks``
``data:`` chunks), run in a process of its own so that it shares no interpreter with the load
generator. Its chunk rate is artificial (every chunk written at once, nothing computed): what the
hop adds is all there is to see, and its throughput ratio is the hop's ceiling, not a model's.

``--real``: a real llama-server child as the peer side. A first ``forge serve`` with a real small
model (the embedded default ``smollm2-135m``, as ``forge pull`` fetches it; the binary as every
forge command finds it, or ``FORGE_LLAMA_SERVER``), and a second ``forge serve`` with the first
as its ``api = "forge"`` peer: direct-to-first vs through-second, ``max_tokens = --chunks`` with
``ignore_eos``.

Printed, for each path: time to first token (the first chunk with content) p50 and p90, total
time p50, chunks/s per stream p50; the added TTFT (forge minus direct, the median of the rounds'
paired differences), the throughput ratio (forge over direct, of the chunks/s medians), and the
CPU seconds of the hop's ``forge serve`` process (its own, children excluded: psutil cpu_times
before and after each of its requests, summed) per chunk it relayed; with ``--real`` a request
lasts seconds and the process's idle background work in them is charged too (small, but not
nothing at a model's chunk rate), and psutil counts in 10 ms ticks: read it over many rounds.
Then one JSON line with all of it, the command, the date and the machine (CPU model and count from
/proc/cpuinfo, git commit).

Every client has a timeout (``--timeout`` between bytes and for a whole stream); every process this
starts is stopped (SIGTERM, then SIGKILL) however the run ends.

Usage: .venv/bin/python scripts/bench/bench_peer.py [--rounds 30] [--chunks 64] [--warmup 3]
       [--real [--model PATH] [--threads 1]] [--timeout 60]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.service import FORGE  # noqa: E402  (after the path: run as a script)

PEER_KEY_ENV = "BENCH_PEER_KEY"
PEER_KEY = "bench-peer-key"

#: The fake peer in its own process: its URL on stdout, then serving until its stdin closes.
FAKE_PEER_MAIN = """
import sys
from tests.support.fake_peer import FakePeer
with FakePeer(api="openai", models=[sys.argv[1]], key=sys.argv[2]) as peer:
    print(peer.url, flush=True)
    sys.stdin.read()
"""


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (as the other benches)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine_load() -> str:
    try:
        psi = Path("/proc/pressure/cpu").read_text().split()[1:3]
    except OSError:
        psi = ["n/a"]
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, cpu pressure {' '.join(psi)}"


def machine() -> dict[str, Any]:
    model, count = "unknown", 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "processor":
                count += 1
            elif key.strip() == "model name" and model == "unknown":
                model = value.strip()
    except OSError:
        pass
    return {"cpu": model, "cores": count or os.cpu_count()}


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


# -- processes --------------------------------------------------------------------------------------


def stop(p: subprocess.Popen[str], timeout: float = 30) -> None:
    """SIGTERM, a bounded wait, then SIGKILL."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def first_line(p: subprocess.Popen[str], what: str, timeout: float) -> str:
    """The first line ``p`` prints on stdout, waited for at most ``timeout`` seconds."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"{what} printed nothing within {timeout:.0f} s")
    return p.stdout.readline().strip()


@contextmanager
def process(
    args: list[str], log: Path, env: dict[str, str], what: str, *, stdin: bool = False
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``args`` running (stderr in ``log``); yields it and the first line it printed (a URL)."""
    with log.open("w") as err:
        p = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=ROOT,
        )
    try:
        url = first_line(p, what, 120)
        if not url.startswith("http"):
            p.wait(10)
            raise RuntimeError(f"{what} did not start (exit {p.returncode}): {log.read_text()[-2000:]}")
        yield p, url
    finally:
        if p.stdin is not None:
            p.stdin.close()  # the fake peer's signal to stop
            with suppress(subprocess.TimeoutExpired):
                p.wait(5)
        stop(p)
        if p.stdout is not None:
            p.stdout.close()


def wait_until(what: str, cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


@contextmanager
def forge_serve(
    config: Path, state: Path, env: dict[str, str], what: str, key: str | None = None
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A real ``forge serve`` (its state in ``state``), ready (``/ready`` 200)."""
    state.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FORGE_STATE_DIR": str(state), "PYTHONUNBUFFERED": "1", **env}
    env.pop("NOTIFY_SOCKET", None)
    args = [*FORGE, "serve", "--config", str(config), "--port", "0"]
    with process(args, state / "serve.stderr", env, what) as (p, url):
        headers = {"Authorization": f"Bearer {key}"} if key else {}

        def ready() -> bool:
            if p.poll() is not None:
                raise RuntimeError(f"{what} exited with {p.returncode}")
            return httpx.get(f"{url}/ready", headers=headers, timeout=2).status_code == 200

        wait_until(f"{what} /ready", ready, 180)
        yield p, url


def listed(url: str, model: str, key: str | None = None) -> bool:
    """``model`` in ``url``'s /v1/models (a peer's model is listed by its served name; ``p/ID``
    reaches it too)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = httpx.get(f"{url}/v1/models", headers=headers, timeout=5).json()["data"]
    return model in [m["id"] for m in data]


# -- the load -------------------------------------------------------------------------------------


@dataclass
class Route:
    """One way to the peer's model: where, with which key, and the process whose CPU is charged."""

    name: str
    url: str
    key: str | None
    model: str
    pid: int
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)
    errors: int = 0
    cpu: float = 0.0
    relayed: int = 0

    def cpu_time(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return float(t.user + t.system)


@dataclass
class Result:
    ttft: float | None
    total: float
    chunks: int
    error: str | None


def has_content(data: bytes) -> bool:
    try:
        choices = json.loads(data).get("choices") or [{}]
    except ValueError:
        return False
    delta = choices[0].get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls"))


def stream_once(client: httpx.Client, route: Route, body: dict[str, Any], limit: float) -> Result:
    """One streamed request: the time to the first chunk with content, the time to the stream's end
    (``[DONE]``), the ``data:`` chunks counted (``[DONE]`` not counted)."""
    headers = {"Authorization": f"Bearer {route.key}"} if route.key else {}
    body = {**body, "model": route.model}
    t0 = time.perf_counter()
    ttft: float | None = None
    chunks, done, buf = 0, False, b""
    try:
        with client.stream("POST", f"{route.url}/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                return Result(None, 0.0, 0, f"{r.status_code} {r.read()[:200]!r}")
            for raw in r.iter_raw():
                buf += raw.replace(b"\r\n", b"\n")
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                            continue
                        chunks += 1
                        if b'"error"' in data[:20]:
                            return Result(ttft, 0.0, chunks, f"an error event {data[:200]!r}")
                        if ttft is None and has_content(data):
                            ttft = time.perf_counter() - t0
                if time.perf_counter() - t0 > limit:
                    return Result(ttft, 0.0, chunks, f"the stream ran past {limit:.0f} s")
    except httpx.HTTPError as exc:
        return Result(ttft, 0.0, chunks, f"{type(exc).__name__}: {exc}")
    total = time.perf_counter() - t0
    if not done:
        return Result(ttft, total, chunks, "the stream ended without [DONE]")
    if ttft is None:
        return Result(None, total, chunks, "no chunk with content")
    return Result(ttft, total, chunks, None)


_SAID: set[str] = set()


def rounds(routes: list[Route], body: dict[str, Any], hop: Route, args: argparse.Namespace) -> list[float]:
    """``--warmup`` requests on each route, then ``--rounds`` rounds of one request on each (the
    order alternating); the hop process's CPU measured around each of its requests. Returns the
    paired TTFT differences (hop minus direct) of the rounds where both succeeded."""
    timeout = httpx.Timeout(args.timeout, connect=10.0)
    clients = {r.name: httpx.Client(timeout=timeout) for r in routes}
    pairs: list[float] = []
    try:
        for r in routes:
            for _ in range(args.warmup):
                res = stream_once(clients[r.name], r, body, args.timeout)
                if res.error:
                    raise RuntimeError(f"{r.name}: warm-up request failed: {res.error}")
        for rnd in range(args.rounds):
            got: dict[str, float] = {}
            for r in routes if rnd % 2 == 0 else routes[::-1]:
                cpu0 = r.cpu_time()
                res = stream_once(clients[r.name], r, body, args.timeout)
                r.cpu += r.cpu_time() - cpu0
                r.relayed += res.chunks
                if res.error or res.ttft is None:
                    r.errors += 1
                    if r.name not in _SAID:
                        _SAID.add(r.name)
                        print(f"{r.name}: first error: {res.error}", file=sys.stderr, flush=True)
                    continue
                r.ttft.append(res.ttft)
                r.total.append(res.total)
                r.rate.append(res.chunks / res.total)
                r.chunks.append(res.chunks)
                got[r.name] = res.ttft
            if len(got) == len(routes):
                pairs.append(got[hop.name] - got[routes[0].name])
            line = "  ".join(
                f"{r.name} TTFT {r.ttft[-1] * 1000:7.2f} ms total {r.total[-1] * 1000:8.1f} ms"
                for r in routes
                if r.ttft
            )
            print(f"round {rnd + 1:>3}/{args.rounds}  {line}", file=sys.stderr, flush=True)
    finally:
        for c in clients.values():
            c.close()
    return pairs


# -- the two set-ups --------------------------------------------------------------------------------


def chat_body(model: str, chunks: int, real: bool) -> dict[str, Any]:
    if real:
        content = "Write a long story about a robot who learns to paint."
        extra: dict[str, Any] = {"max_tokens": chunks, "ignore_eos": True, "temperature": 0}
    else:
        # The fake echoes "echo from MODEL: " + the prompt, a chunk per word, after a role chunk and
        # before a finish chunk: 5 + words chunks.
        content = " ".join(f"w{i}" for i in range(max(1, chunks - 5)))
        extra = {}
    return {"model": model, "messages": [{"role": "user", "content": content}], "stream": True, **extra}


@contextmanager
def fake_setup(tmp: Path, stack: ExitStack) -> Iterator[tuple[Route, Route, Route | None, str]]:
    model = "fake-model"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    peer_proc, peer_url = stack.enter_context(
        process(
            [sys.executable, "-c", FAKE_PEER_MAIN, model, PEER_KEY],
            tmp / "fake-peer.stderr",
            env,
            "the fake peer",
            stdin=True,
        )
    )
    cfg = tmp / "hop.toml"
    cfg.write_text(
        f"""
[peers.p]
url = "{peer_url}"
api = "openai"
api_key_env = "{PEER_KEY_ENV}"
models = ["{model}"]
"""
    )
    hop_proc, hop_url = stack.enter_context(
        forge_serve(cfg, tmp / "hop", {PEER_KEY_ENV: PEER_KEY}, "forge serve (the hop)")
    )
    wait_until("the peer's model listed", lambda: listed(hop_url, model), 30)
    direct = Route("direct", peer_url, PEER_KEY, model, peer_proc.pid)
    hop = Route("forge", hop_url, None, f"p/{model}", hop_proc.pid)
    yield direct, hop, None, "FAKE peer (tests/support/fake_peer.py; artificial chunk rate, no model)"


@contextmanager
def real_setup(
    tmp: Path, stack: ExitStack, args: argparse.Namespace
) -> Iterator[tuple[Route, Route, Route | None, str]]:
    from rocmforge_supervisor.binaries import locate_llama_server
    from rocmforge_supervisor.config import get_settings
    from rocmforge_supervisor.models import DEFAULT_MODEL, ensure_embedded

    settings = get_settings()
    binary = locate_llama_server(settings).path
    gguf = Path(args.model) if args.model else ensure_embedded(DEFAULT_MODEL, settings)
    first_key = "first-key"
    threads = f'args = ["--threads", "{args.threads}"]\n' if args.threads else ""
    first_cfg = tmp / "first.toml"
    first_cfg.write_text(
        f"""
[server]
api_key = "{first_key}"
[models.smol]
path = "{gguf}"
gpu = "cpu"
ctx_size = 2048
parallel = 1
preload = true
{threads}"""
    )
    env = {"FORGE_LLAMA_SERVER": str(binary)}
    first_proc, first_url = stack.enter_context(
        forge_serve(first_cfg, tmp / "first", env, "forge serve (the peer)", first_key)
    )
    second_cfg = tmp / "second.toml"
    second_cfg.write_text(
        f"""
[peers.p]
url = "{first_url}"
api = "forge"
api_key_env = "{PEER_KEY_ENV}"
"""
    )
    hop_proc, hop_url = stack.enter_context(
        forge_serve(second_cfg, tmp / "second", {**env, PEER_KEY_ENV: first_key}, "forge serve (the hop)")
    )
    wait_until("the first forge's model listed by the second", lambda: listed(hop_url, "smol"), 60)
    direct = Route("direct", first_url, first_key, "smol", first_proc.pid)
    hop = Route("forge", hop_url, None, "p/smol", hop_proc.pid)
    peer_side = direct  # its CPU over the direct rounds: forge #1 relaying its child's stream
    yield (
        direct,
        hop,
        peer_side,
        f"llama-server ({gguf.name}, --threads {args.threads or 'default'}) behind forge serve #1",
    )


# -- report -----------------------------------------------------------------------------------------


def report(
    args: argparse.Namespace,
    direct: Route,
    hop: Route,
    peer_side: Route | None,
    peer: str,
    pairs: list[float],
    load: tuple[str, str],
) -> None:
    def ms(x: float) -> str:
        return f"{x * 1000:.2f}"

    ratio = med(hop.rate) / med(direct.rate) if direct.rate else float("nan")
    hop_cpu = hop.cpu / max(1, hop.relayed) * 1000
    added = med(pairs)
    print(
        f"\n## Peer hop: direct vs through forge serve ({args.rounds} interleaved rounds, one stream "
        f"at a time, medians; ~{args.chunks} chunks a stream)\n"
    )
    print(f"peer: {peer}\n")
    print("| | direct | through forge | forge − direct |")
    print("|---|---|---|---|")
    print(f"| TTFT p50 (ms) | {ms(med(direct.ttft))} | {ms(med(hop.ttft))} | {added * 1000:+.2f} (paired) |")
    print(
        f"| TTFT p90 (ms) | {ms(pct(direct.ttft, 0.9))} | {ms(pct(hop.ttft, 0.9))} | "
        f"{(pct(hop.ttft, 0.9) - pct(direct.ttft, 0.9)) * 1000:+.2f} |"
    )
    print(
        f"| total p50 (ms) | {ms(med(direct.total))} | {ms(med(hop.total))} | "
        f"{(med(hop.total) - med(direct.total)) * 1000:+.2f} |"
    )
    print(
        f"| chunks/s per stream p50 (chunks / total) | {med(direct.rate):.0f} | {med(hop.rate):.0f} | ratio {ratio:.3f} |"
    )
    print(f"| chunks per stream | {med(direct.chunks):.0f} | {med(hop.chunks):.0f} | |")
    print(f"| errors | {direct.errors} | {hop.errors} | |")
    print(
        f"\nforge serve (the hop) CPU per relayed chunk: {hop_cpu:.3f} ms "
        f"({hop.cpu:.2f} s over {hop.relayed} chunks, its own process; "
        "psutil counts CPU time in 10 ms ticks)"
    )
    side_cpu = None
    if peer_side is not None:
        side_cpu = peer_side.cpu / max(1, peer_side.relayed) * 1000
        print(
            f"forge serve #1 (the peer, relaying its child) CPU per chunk over the direct rounds: "
            f"{side_cpu:.3f} ms"
        )
    print(f"machine before: {load[0]}\nmachine after:  {load[1]}")
    if not args.real:
        print("note: the fake peer's chunk rate is artificial (no model): the ratio is the hop's ceiling")
    line = {
        "bench": "bench_peer",
        "command": f"python {shlex.join(sys.argv)}",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(),
        "peer": "llama-server" if args.real else "fake",
        "rounds": args.rounds,
        "chunks_per_stream": {"direct": float(med(direct.chunks)), "forge": float(med(hop.chunks))},
        "ttft_ms": {
            "direct": {"p50": med(direct.ttft) * 1000, "p90": pct(direct.ttft, 0.9) * 1000},
            "forge": {"p50": med(hop.ttft) * 1000, "p90": pct(hop.ttft, 0.9) * 1000},
        },
        "total_ms_p50": {"direct": med(direct.total) * 1000, "forge": med(hop.total) * 1000},
        "added_ttft_ms_p50_paired": added * 1000,
        "throughput_ratio": ratio,
        "hop_cpu_ms_per_chunk": hop_cpu,
        "peer_side_cpu_ms_per_chunk": side_cpu,
        "errors": {"direct": direct.errors, "forge": hop.errors},
        "load": {"before": load[0], "after": load[1]},
    }
    print(json.dumps({k: _rounded(v) for k, v in line.items()}))


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument(
        "--chunks", type=int, default=64, help="chunks a stream (the fake: about; --real: tokens)"
    )
    ap.add_argument("--warmup", type=int, default=3, help="requests on each path before the rounds")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds: between bytes, and a whole stream")
    ap.add_argument("--real", action="store_true", help="a real llama-server behind a first forge serve")
    ap.add_argument("--model", default=None, help="--real: a GGUF (default: the embedded smollm2-135m)")
    ap.add_argument(
        "--threads", type=int, default=1, help="--real: llama-server compute threads (0 = its default)"
    )
    args = ap.parse_args()
    if args.rounds < 1 or args.chunks < 6:
        ap.error("--rounds must be >= 1 and --chunks >= 6")

    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-peer-"))
    try:
        with ExitStack() as stack:
            setup = real_setup(tmp, stack, args) if args.real else fake_setup(tmp, stack)
            direct, hop, peer_side, peer = stack.enter_context(setup)
            body = chat_body(direct.model, args.chunks, args.real)
            print(f"peer: {peer}; direct {direct.url}, forge {hop.url}", file=sys.stderr, flush=True)
            before = machine_load()
            pairs = rounds([direct, hop], body, hop, args)
            after = machine_load()
        report(args, direct, hop, peer_side, peer, pairs, (before, after))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
