"""What a returning chat turn costs when many conversations share one model: the
first-token time of each conversation's next turn, p50 and p95, for llama-server directly (its RAM
prompt cache only), llama.cpp's router, `forge serve` as it was (keep_context off) and `forge serve`
with the per-conversation disk tier (``keep_context = true``, ``keep_conversations = true``); then
the same after an unload and after a restart of the server process.

The workload: K conversations (default 8) on SmolLM2-135M (the embedded chat model) on the CPU,
``--parallel 2``, ``--cache-ram 64`` (MiB: about one 2k-token conversation of this model's KV, so
K x context is far over the RAM cache, as the issue asks, on a 2-core box). Each conversation's
first turn is 1.5k-2.5k tokens (computed cold, its time is the "cold" reference); then the
conversations take turns round-robin (``--rounds``), each turn a short new question. A turn is a
non-streamed request for one token at temperature 0 (the tier takes part in non-streamed chat
turns), timed from send to answer: the first-token time, with any restore and the prefill of
what the child did not hold. ``computed`` is llama-server's own ``timings.prompt_n`` (tokens it
computed for the turn), the mean over the turns.

Every target runs alone, one after another, with the same llama-server command line (forge's
child's, copied for the direct and router runs), so the figures compare the same process doing
the same work. ``unload``: forge's ``POST /api/models/NAME/unload`` (the tier saves nothing more
at an unload: its states were saved after each turn), the router's ``POST /models/unload``, the
direct server stopped and started again; ``restart``: the whole process stopped with SIGTERM
and started again on the same state directory.

``--found N``: where the time of a returning turn goes when its slot still holds the
conversation (nothing restored, ``prompt_n`` ~17): one ~1.6k-token conversation (the shape of a
report's reproducer: ``ctx_size`` 4096, 4 slots sharing the cache, ``--reply-tokens`` 16), then N
returning turns, through forge with the tier and straight to the same llama-server command line.
Each turn is split into llama-server's own prompt and reply times (its ``timings``), the tier's
save after the turn (its ``context_saved`` event's ``ms``) and the rest (forge, HTTP). A turn's
reply costs one decode step per token, which the main workload (one token) never pays; on a
shared 2-core box llama-server's two threads wait on each other at every step (``--threads 1``
shows it).

Usage: .venv/bin/python scripts/bench/bench_context.py [--conversations 8] [--rounds 1]
       [--targets direct,router,forge,tier] [--json out.json]
       .venv/bin/python scripts/bench/bench_context.py --soak 200 [--soak-budget 4]
         (200 turns on forge with the tier under a budget of ~4 states: files and bytes counted)
       .venv/bin/python scripts/bench/bench_context.py --found 3 [--reply-tokens 16] [--threads 1]
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import (
    free_port,
    llama_children,
    machine_load,
    pct,
    router_args,
    stop,
    wait_http,
    without,
)

from rocmforge_supervisor.binaries import locate_llama_server
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import DEFAULT_MODEL, ensure_embedded

MODEL = "bench"
PHASES = ("first", "returning", "after unload", "after restart")
COLORS = ("red", "green", "blue", "amber", "violet", "teal", "grey", "olive", "coral", "navy", "rust", "mint")


def first_turn(i: int, tokens: int) -> list[dict[str, str]]:
    """Conversation ``i``'s first turn, about ``tokens`` prompt tokens (~14 per item for SmolLM2,
    ~40 for the template and the question)."""
    color = COLORS[i % len(COLORS)]
    n = max(1, (tokens - 40) // 14)
    items = " ".join(f"Box {j} of shelf {i} is {color} number {j * 7 % 13}." for j in range(n))
    return [
        {"role": "system", "content": f"You are a terse clerk of warehouse {i}."},
        {"role": "user", "content": f"Inventory: {items} How many boxes are there?"},
    ]


class Target:
    """One way to serve the model: started, asked, unloaded, restarted, stopped."""

    name = ""

    def __init__(self, tmp: Path, child: list[str]) -> None:
        self.tmp, self.child = tmp, child
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        raise NotImplementedError

    def unload(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            stop(p, timeout=120)

    def _spawn(self, args: list[str], env: dict[str, str] | None = None, *, url_line: bool = False) -> None:
        log = (self.tmp / f"{self.name}.log").open("a")
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE if url_line else log, stderr=log, text=True, env=env
        )
        if url_line:
            assert self.proc.stdout is not None
            self.url = self.proc.stdout.readline().strip()
            if not self.url.startswith("http"):
                log.flush()
                tail = (self.tmp / f"{self.name}.log").read_text()[-3000:]
                raise RuntimeError(f"{self.name} did not start:\n{tail}")


class Direct(Target):
    name = "direct"

    def start(self) -> None:
        port = free_port()
        args = without(self.child, "--slot-save-path", "--api-key-file")
        args[args.index("--port") + 1] = str(port)
        self._spawn(args)
        self.url = f"http://127.0.0.1:{port}"
        assert self.proc is not None
        wait_http(f"{self.url}/health", self.proc, self.name, timeout=300)


class Router(Target):
    name = "router"

    def start(self) -> None:
        models = self.tmp / "router-models"
        models.mkdir(exist_ok=True)
        link = models / f"{MODEL}.gguf"
        if not link.exists():
            link.symlink_to(self.child[self.child.index("--model") + 1])
        port = free_port()
        child = without(self.child, "--slot-save-path")
        self._spawn(router_args(child, models, port))
        self.url = f"http://127.0.0.1:{port}"
        assert self.proc is not None
        wait_http(f"{self.url}/health", self.proc, self.name, timeout=300)

    def unload(self) -> None:
        """Unload, and wait until the router says so (a request while it unloads is its 500)."""
        r = httpx.post(f"{self.url}/models/unload", json={"model": MODEL}, timeout=120)
        r.raise_for_status()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            models = httpx.get(f"{self.url}/models", timeout=10).json().get("data", [])
            status = next((m.get("status") for m in models if m.get("id") == MODEL), None)
            if (status.get("value") if isinstance(status, dict) else status) == "unloaded":
                return
            time.sleep(0.2)
        raise RuntimeError(f"the router did not unload {MODEL} within 120 s")


class Forge(Target):
    def __init__(self, tmp: Path, child: list[str], config: Path, env: dict[str, str], name: str) -> None:
        super().__init__(tmp, child)
        self.config, self.env, self.name = config, env, name

    def start(self) -> None:
        cli = [sys.executable, "-m", "rocmforge_supervisor.cli", "serve", "--config", str(self.config)]
        self._spawn([*cli, "--port", "0"], self.env, url_line=True)
        assert self.proc is not None
        wait_http(f"{self.url}/ready", self.proc, self.name, timeout=300)

    def unload(self) -> None:
        httpx.post(f"{self.url}/api/models/{MODEL}/unload", timeout=300).raise_for_status()


def forge_config(tmp: Path, model: Path, args: argparse.Namespace, *, tier: bool) -> Path:
    path = tmp / ("tier.toml" if tier else "forge.toml")
    path.write_text(
        f"""
[models.{MODEL}]
path = "{model}"
gpu = "cpu"
ctx_size = {args.ctx_per_slot * 2}
parallel = 2
preload = true
args = ["--cache-ram", "{args.cache_ram}"]
keep_context = {str(tier).lower()}
keep_conversations = {str(tier).lower()}
"""
    )
    return path


def ask(url: str, messages: list[dict[str, str]]) -> tuple[float, int, str]:
    """One turn: seconds to the answer, the prompt tokens the child computed, the reply."""
    t0 = time.perf_counter()
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0},
        timeout=900,
    )
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    answer = r.json()
    return (
        seconds,
        int(answer.get("timings", {}).get("prompt_n", -1)),
        answer["choices"][0]["message"]["content"],
    )


def workload(target: Target, args: argparse.Namespace) -> dict[str, list[tuple[float, int]]]:
    """The conversations through ``target``: each phase's (seconds, computed tokens) per turn."""
    k = args.conversations
    lengths = [args.min_tokens + (args.max_tokens - args.min_tokens) * i // max(1, k - 1) for i in range(k)]
    convs = [first_turn(i, n) for i, n in enumerate(lengths)]
    out: dict[str, list[tuple[float, int]]] = {p: [] for p in PHASES}
    question = 0

    def turn(phase: str, messages: list[dict[str, str]]) -> None:
        nonlocal question
        if messages[-1]["role"] == "assistant":
            question += 1
            messages.append(
                {"role": "user", "content": f"And how many are {COLORS[question % 12]}? ({question})"}
            )
        seconds, computed, reply = ask(target.url, messages)
        messages.append({"role": "assistant", "content": reply})
        out[phase].append((seconds, computed))
        print(
            f"  {target.name:7} {phase:14} {seconds:7.3f} s  computed {computed}", file=sys.stderr, flush=True
        )

    for m in convs:
        turn("first", m)
    for _ in range(args.rounds):
        for m in convs:
            turn("returning", m)
    target.unload()
    for m in convs:
        turn("after unload", m)
    target.restart()
    for m in convs:
        turn("after restart", m)
    return out


def soak(args: argparse.Namespace, model: Path, env: dict[str, str], tmp: Path) -> None:
    """``--soak N``: N turns over the K conversations in a seeded random order on forge with the
    tier and a byte budget of ``--soak-budget`` states, the files and bytes under the context
    directory counted after every turn (the budget must hold; no temporary file may stay)."""
    import random

    state = tmp / "soak-state"
    config = forge_config(tmp, model, args, tier=True)
    one_state = 48 * 2**20  # a 2k-token SmolLM2-135M slot is ~45 MiB
    budget = args.soak_budget * one_state
    config.write_text(f"[server]\ncontext_max_bytes = {budget}\n" + config.read_text())
    target = Forge(tmp, [], config, dict(env, FORGE_STATE_DIR=str(state)), "soak")
    rng = random.Random(35)
    k = args.conversations
    convs = [first_turn(i, args.min_tokens) for i in range(k)]
    most_bytes = most_files = 0
    seconds: list[float] = []
    with running(target):
        for n in range(args.soak):
            messages = rng.choice(convs)
            if messages[-1]["role"] == "assistant":
                messages.append({"role": "user", "content": f"Turn {n}: and the next box?"})
            took, _, reply = ask(target.url, messages)
            messages.append({"role": "assistant", "content": reply})
            seconds.append(took)
            files = [p for p in (state / "contexts").rglob("*") if p.is_file()]
            size = sum(p.stat().st_size for p in files if p.suffix == ".slot")
            temps = [p for p in files if p.name.startswith("tmp-")]
            most_bytes, most_files = max(most_bytes, size), max(most_files, len(files))
            if size > budget or temps:
                raise SystemExit(f"turn {n}: {size} bytes on disk (budget {budget}), temporary files {temps}")
        row = httpx.get(f"{target.url}/api/models", timeout=30).json()["models"][0]["contexts"]
    print(
        f"soak: {args.soak} turns over {k} conversations, budget {budget} bytes ({args.soak_budget} states): "
        f"at most {most_bytes} bytes and {most_files} files on disk; turn p50 {pct(seconds, 0.5):.2f} s, "
        f"p95 {pct(seconds, 0.95):.2f} s; tier counters "
        + ", ".join(
            f"{k.removeprefix('conversation_')} {v}" for k, v in row.items() if k.startswith("conversation_")
        )
    )


def report_doc(tag: str) -> str:
    """A ~1.6k-token system prompt for SmolLM2 (the reproducer's report of 58 facts)."""
    goods = ["apples", "wire", "books", "lamps", "tea"]
    return " ".join(
        f"Fact {i}: the {tag} depot in zone {i % 17} holds {i * 13 % 97} boxes of {goods[i % 5]}, "
        f"checked on day {i % 28 + 1}."
        for i in range(58)
    )


def saved_ms(url: str) -> list[float]:
    """The ``ms`` of every ``context_saved`` event of the tier so far (``/api/events?replay=1``,
    read until it goes quiet)."""
    out: list[float] = []
    try:
        with httpx.stream("GET", f"{url}/api/events", params={"replay": "1"}, timeout=2) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"context_saved"' in line:
                    data = json.loads(line[6:]).get("data") or {}
                    if data.get("conversation"):
                        out.append(float(data.get("ms") or 0))
    except httpx.ReadTimeout:
        pass
    return out


def found(args: argparse.Namespace, model: Path, env: dict[str, str], tmp: Path) -> None:
    """``--found N``: a returning turn whose slot still holds it, its time split in parts."""
    threads = ["--threads", str(args.threads)] if args.threads else []
    config = tmp / "found.toml"
    config.write_text(
        f"""
[models.{MODEL}]
path = "{model}"
gpu = "cpu"
ctx_size = {args.found_ctx}
parallel = {args.found_parallel}
preload = true
args = {json.dumps(threads)}
keep_context = true
keep_conversations = true
"""
    )
    tier = Forge(tmp, [], config, dict(env, FORGE_STATE_DIR=str(tmp / "found-state")), "tier")
    print(f"machine before: {machine_load()}", file=sys.stderr, flush=True)
    with running(tier):
        child = llama_children(tier.proc.pid)[MODEL] if tier.proc else []
        rows = turns(tier.url, args, lambda: saved_ms(tier.url))
    direct = Direct(tmp, child)
    with running(direct):
        rows += turns(direct.url, args, None)
    print(f"machine after: {machine_load()}", file=sys.stderr, flush=True)
    print("| returning turn | wall | llama-server prompt | llama-server reply | the tier's save | the rest |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row)


def turns(url: str, args: argparse.Namespace, saves: Callable[[], list[float]] | None) -> list[str]:
    """The conversation's first turn, then ``--found`` returning turns: one table row each."""
    messages = [
        {"role": "system", "content": "Answer about this report.\n" + report_doc("north")},
        {"role": "user", "content": "What does fact 3 say?"},
    ]
    rows = []
    for n in range(args.found + 1):
        before = saves() if saves else []
        t0 = time.perf_counter()
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": args.reply_tokens, "temperature": 0},
            timeout=900,
        )
        wall = time.perf_counter() - t0
        r.raise_for_status()
        answer = r.json()
        t = answer["timings"]
        save = sum(saves()[len(before) :]) / 1000 if saves else 0.0
        messages += [
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"And fact {n + 5}?"},
        ]
        prompt_s, reply_s = t["prompt_ms"] / 1000, t["predicted_ms"] / 1000
        per_token = t["predicted_ms"] / max(1, t["predicted_n"])
        label = f"{'tier' if saves else 'direct'}, {'first (cold)' if n == 0 else f'returning {n}'}"
        rows.append(
            f"| {label} | {wall:.2f} s | {prompt_s:.2f} s ({t['prompt_n']} tok, {t['cache_n']} reused) "
            f"| {reply_s:.2f} s ({t['predicted_n']} tok, {per_token:.0f} ms/tok) "
            f"| {f'{save:.3f} s' if saves else '-'} | {wall - prompt_s - reply_s - save:.3f} s |"
        )
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def summary(results: dict[str, dict[str, list[tuple[float, int]]]]) -> str:
    names = list(results)
    lines = [
        "| returning turn, first-token time | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for phase in PHASES:
        for q, label in ((0.5, "p50"), (0.95, "p95")):
            cells = [f"{pct([s for s, _ in results[n][phase]], q):.2f} s" for n in names]
            lines.append(f"| {phase}, {label} | " + " | ".join(cells) + " |")
        cells = [f"{statistics.mean(c for _, c in results[n][phase]):.0f}" for n in names]
        lines.append(f"| {phase}, tokens computed (mean) | " + " | ".join(cells) + " |")
        if phase != "first":  # against the same target's cold first turns: the box's load cancels
            cells = [
                f"{statistics.median(s for s, _ in results[n][phase]) / statistics.median(s for s, _ in results[n]['first']):.3f}"
                for n in names
            ]
            lines.append(f"| {phase}, p50 / first turns' p50 | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@contextmanager
def running(target: Target) -> Iterator[Target]:
    target.start()
    try:
        yield target
    finally:
        target.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--min-tokens", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=2500)
    ap.add_argument("--ctx-per-slot", type=int, default=3072)
    ap.add_argument("--cache-ram", type=int, default=64, help="llama-server's --cache-ram, MiB")
    ap.add_argument("--targets", default="direct,router,forge,tier")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--soak", type=int, default=0, help="instead: N turns on forge + tier, the budget checked"
    )
    ap.add_argument(
        "--soak-budget", type=int, default=4, help="the soak's context_max_bytes, in ~2k-token states"
    )
    ap.add_argument(
        "--found",
        type=int,
        default=0,
        help="instead: N returning turns whose slot holds them, timed in parts",
    )
    ap.add_argument("--reply-tokens", type=int, default=16, help="--found: each turn's max_tokens")
    ap.add_argument("--found-ctx", type=int, default=4096, help="--found: the model's ctx_size")
    ap.add_argument("--found-parallel", type=int, default=4, help="--found: the model's parallel")
    ap.add_argument("--threads", type=int, default=0, help="--found: llama-server's --threads (0: its own)")
    args = ap.parse_args()
    settings = ForgeSettings()
    binary = locate_llama_server(settings).path
    model = ensure_embedded(DEFAULT_MODEL, settings)
    with tempfile.TemporaryDirectory(prefix="bench-context-") as t:
        tmp = Path(t)
        env = dict(os.environ, FORGE_STATE_DIR=str(tmp / "state"), FORGE_LLAMA_SERVER=str(binary))
        if args.soak:
            soak(args, model, env, tmp)
            return
        if args.found:
            found(args, model, env, tmp)
            return
        off = Forge(tmp, [], forge_config(tmp, model, args, tier=False), env, "forge")
        tier_env = dict(env, FORGE_STATE_DIR=str(tmp / "tier-state"))
        on = Forge(tmp, [], forge_config(tmp, model, args, tier=True), tier_env, "tier")
        with running(off):  # forge's child's command line, for the direct and router runs
            child = llama_children(off.proc.pid)[MODEL] if off.proc else []
        targets: dict[str, Target] = {
            "direct": Direct(tmp, child),
            "router": Router(tmp, child),
            "forge": off,
            "tier": on,
        }
        results: dict[str, dict[str, list[tuple[float, int]]]] = {}
        print(f"machine before: {machine_load()}", file=sys.stderr, flush=True)
        for name in args.targets.split(","):
            with running(targets[name]) as target:
                results[name] = workload(target, args)
        print(f"machine after: {machine_load()}", file=sys.stderr, flush=True)
    print(summary(results))
    if args.json:
        args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
