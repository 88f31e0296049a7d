"""What the AMX workaround costs: prompt and generation tokens/s of llama-server with its default
CPU kernels (extra buffer types: CPU_REPACK, and AMX on an AMX CPU) vs ``--no-repack`` (ggml's
plain kernels), on the same GGUFs, interleaved in one run.

Models: a Q4_K_M GGUF (the ``gemma-3-270m`` demo model) and a Q4_0 one (the same model
requantised with llama.cpp's ``llama-quantize``, built from the build tree of the llama-server in
use when it is not there yet; or ``--q4-0 PATH``). Each variant is a fresh llama-server; each
measurement a non-streamed ``/completion`` (prompt of ``--prompt-tokens``, ``--gen`` tokens,
``ignore_eos``), median of ``--runs``, from llama-server's own ``timings``.

On an AMX CPU at the pinned llama.cpp the default variant crashes (PR #26954): the script says so
and reports only ``--no-repack``. Threads default to llama-server's own choice (the child default).

Usage: .venv/bin/python scripts/bench/bench_repack.py [--runs 5] [--gen 64] [--prompt-tokens 256]
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

import httpx

from rocmforge_supervisor.binaries import locate_llama_server
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import cpu_flags, cpu_model_name
from rocmforge_supervisor.models import resolve_model_path
from rocmforge_supervisor.process import free_port, with_parent_death

VARIANTS: dict[str, list[str]] = {"default": [], "--no-repack": ["--no-repack"]}


def quantizer(binary: Path) -> Path | None:
    """llama-quantize from the build tree the binary came from (built once, a few seconds)."""
    info_file = binary.resolve().parents[1] / "build-info.json"
    try:
        meta = json.loads(info_file.read_text())
        configure = meta["configure"]
        tree = Path(configure[configure.index("-B") + 1])
    except (OSError, ValueError, KeyError):
        return None
    exe = tree / "bin" / "llama-quantize"
    if not exe.is_file() and tree.is_dir():
        subprocess.run(
            ["cmake", "--build", str(tree), "--target", "llama-quantize", "-j", str(os.cpu_count() or 1)],
            check=False,
            capture_output=True,
        )
    return exe if exe.is_file() else None


def q4_0_model(source: Path, binary: Path, out_dir: Path) -> Path | None:
    out = out_dir / f"{source.stem}.Q4_0.gguf"
    if out.is_file():
        return out
    tool = quantizer(binary)
    if tool is None:
        return None
    r = subprocess.run(
        [str(tool), "--allow-requantize", str(source), str(out), "Q4_0"], capture_output=True, text=True
    )
    return out if r.returncode == 0 and out.is_file() else None


def measure(
    binary: Path, model: Path, args: list[str], runs: int, n_prompt: int, n_gen: int
) -> dict[str, object]:
    port = free_port()
    argv = [str(binary), "-m", str(model), "--port", str(port), "--no-webui", "-c", "2048", "-np", "1", *args]
    proc = subprocess.Popen(
        with_parent_death(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as c:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    return {"error": f"exited with {proc.returncode} while loading"}
                try:
                    if c.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    return {"error": "not ready in 120 s"}
                time.sleep(0.1)
            pp: list[float] = []
            tg: list[float] = []
            prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * (n_prompt // 9 + 1))
            for _ in range(runs):
                body = {
                    "prompt": prompt,
                    "n_predict": n_gen,
                    "ignore_eos": True,
                    "temperature": 0,
                    "cache_prompt": False,
                }
                try:
                    t = c.post("/completion", json=body).json()["timings"]
                except (httpx.HTTPError, KeyError, ValueError):
                    return {"error": f"crashed during a completion (exit {proc.poll()})"}
                pp.append(t["prompt_per_second"])
                tg.append(t["predicted_per_second"])
            return {"prompt_tps": statistics.median(pp), "gen_tps": statistics.median(tg)}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--q4-0", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every variant")
    a = ap.parse_args()
    settings = ForgeSettings()
    binary = locate_llama_server(settings).path
    q4_k_m = resolve_model_path("gemma-3-270m", settings)
    with tempfile.TemporaryDirectory() as tmp:
        q4_0 = a.q4_0 or q4_0_model(q4_k_m, binary, Path(tmp))
        models = {"Q4_K_M": q4_k_m, **({"Q4_0": q4_0} if q4_0 else {})}
        print(f"cpu: {cpu_model_name()}; AMX: {'amx_int8' in cpu_flags()}; binary: {binary}", file=sys.stderr)
        if q4_0 is None:
            print("no Q4_0 model (llama-quantize unavailable): pass --q4-0 PATH", file=sys.stderr)
        results: dict[str, dict[str, list[dict[str, object]]]] = {}
        for _ in range(a.rounds):
            for mname, path in models.items():
                for vname, vargs in VARIANTS.items():
                    r = measure(binary, path, vargs, a.runs, a.prompt_tokens, a.gen)
                    results.setdefault(mname, {}).setdefault(vname, []).append(r)
                    print(f"{mname} {vname}: {r}", file=sys.stderr)
    report: dict[str, object] = {}
    for mname, by_variant in results.items():
        row: dict[str, object] = {}
        for vname, rs in by_variant.items():
            ok = [r for r in rs if "error" not in r]
            if not ok:
                row[vname] = {"error": rs[0]["error"]}
                continue
            row[vname] = {
                "prompt_tps": round(statistics.median(float(r["prompt_tps"]) for r in ok), 1),  # type: ignore[arg-type]
                "gen_tps": round(statistics.median(float(r["gen_tps"]) for r in ok), 1),  # type: ignore[arg-type]
            }
        d, n = row.get("default"), row.get("--no-repack")
        if isinstance(d, dict) and isinstance(n, dict) and "error" not in d and "error" not in n:
            row["no_repack_vs_default"] = {
                "prompt": round(n["prompt_tps"] / d["prompt_tps"], 3),
                "gen": round(n["gen_tps"] / d["gen_tps"], 3),
            }
        report[mname] = row
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
