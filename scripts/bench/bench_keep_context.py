"""What ``keep_context`` buys: the first-token time of a resumed conversation after an unload, with
the model's slot saved and restored vs computed again, at a few prompt lengths; and what the save
adds to the unload.

One real ``forge serve`` (a subprocess, its own state dir) with SmolLM2-135M (the embedded chat
model) on the CPU, ``keep_context = true``, one slot. For each length:

1. a conversation of about that many prompt tokens (its first turn, computed cold);
2. ``POST /api/models/kept/unload`` (the slot is saved): timed;
3. the conversation resumed (the first turn, the model's answer, a new question): timed to its
   first token — the restore happens in the load, which the request waits for;
4. the same again with ``?forget=true`` (no save, the saved slot deleted): the resumed request
   computes the whole conversation — what every unload costs without keep_context.

The first-token time is a non-streamed request for 1 token, from send to answer (load, restore and
prefill included); the prompt tokens computed are llama-server's own ``timings.prompt_n``.

Usage: .venv/bin/python scripts/bench/bench_keep_context.py [--lengths 500,1000,2000]
"""

from __future__ import annotations

import argparse
import os
import signal
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


def conversation(tokens: int) -> list[dict[str, str]]:
    """A first turn of about ``tokens`` prompt tokens (~8 per item with SmolLM2's tokenizer)."""
    items = " ".join(f"Item {i} is a {('red', 'green', 'blue')[i % 3]} box." for i in range(tokens // 8))
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Here is a list. {items} How many boxes are there?"},
    ]


def chat(c: httpx.Client, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    r = c.post(
        "/v1/chat/completions",
        json={"model": "kept", "messages": messages, "max_tokens": max_tokens, "temperature": 0},
        timeout=900,
    )
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def unload(c: httpx.Client, forget: bool) -> float:
    t0 = time.perf_counter()
    c.post("/api/models/kept/unload" + ("?forget=true" if forget else ""), timeout=300).raise_for_status()
    return time.perf_counter() - t0


def one_length(c: httpx.Client, tokens: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for mode in ("kept", "cold"):
        first = conversation(tokens)
        _, answer = chat(c, first, 16)
        row["prompt_tokens"] = answer["usage"]["prompt_tokens"]
        reply = answer["choices"][0]["message"]["content"]
        resumed = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "And red?"}]
        row[f"unload_{mode}_s"] = unload(c, forget=mode == "cold")
        row[f"ttft_{mode}_s"], again = chat(c, resumed, 1)
        row[f"computed_{mode}"] = again["timings"]["prompt_n"]
        row["resumed_tokens"] = again["usage"]["prompt_tokens"]
        unload(c, forget=True)  # the next measurement starts from nothing saved
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="500,1000,2000", help="prompt tokens of the first turn")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    settings = ForgeSettings()
    binary = locate_llama_server(settings).path
    model = ensure_embedded(DEFAULT_MODEL, settings)
    with tempfile.TemporaryDirectory(prefix="bench-keep-context-") as tmp:
        cfg = Path(tmp) / "forge.toml"
        cfg.write_text(
            "[supervisor]\nhealth_interval = 30\n"
            f'[models.kept]\npath = "{model}"\ngpu = "cpu"\nctx_size = {max(lengths) * 2 + 512}\n'
            "parallel = 1\nkeep_context = true\n"
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
            with httpx.Client(base_url=url) as c:
                print(f"llama-server {binary}, {model.name}, {os.cpu_count()} CPUs")
                print(
                    "| prompt tokens (resumed) | first token, restored | first token, recomputed "
                    "| prompt tokens computed | unload with save | unload without |"
                )
                print("|---|---|---|---|---|---|")
                for n in lengths:
                    r = one_length(c, n)
                    print(
                        f"| {r['prompt_tokens']} ({r['resumed_tokens']}) | {r['ttft_kept_s']:.2f} s "
                        f"| {r['ttft_cold_s']:.2f} s | {r['computed_kept']} vs {r['computed_cold']} "
                        f"| {r['unload_kept_s']:.2f} s | {r['unload_cold_s']:.2f} s |",
                        flush=True,
                    )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
