"""The RPC cost floor: one model split across two loopback llama.cpp RPC workers vs the
same model in one llama-server process, on this machine's CPU, all real processes.

Two `forge worker`-style rpc-servers (supervised by process.run_supervised, ``-t`` threads each),
one llama-server with ``--rpc A,B --tensor-split 0.5,0.5 -ngl all`` and one with ``--no-repack``
(the reference whose greedy tokens the split must reproduce). Each prompt runs on both, alternating;
tokens/s is llama-server's own ``timings.predicted_per_second``.

Usage: .venv/bin/python scripts/bench/bench_rpc.py [--prompts 8] [--tokens 48] [--worker-threads 1]
       [--single-threads N]  (1 matches one worker's threads; on a busy box 2 threads spin-wait)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import anyio
import httpx

from rocmforge_supervisor.binaries import locate_llama_server, locate_rpc_server
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.models import DEFAULT_MODEL, resolve_model_path
from rocmforge_supervisor.process import InstanceSpec, ModelServer, WorkerSpec, free_port, run_supervised

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "Three reasons to learn Rust:",
    "Once upon a time, in a small village,",
    "The difference between TCP and UDP is",
    "Photosynthesis converts",
    "A good breakfast includes",
]
_HIDE_GPUS = {"HIP_VISIBLE_DEVICES": "-1", "CUDA_VISIBLE_DEVICES": "-1", "GGML_VK_VISIBLE_DEVICES": ""}


async def complete(server: ModelServer, prompt: str, tokens: int) -> tuple[str, float]:
    async with httpx.AsyncClient(timeout=600, trust_env=False) as c:
        r = await c.post(
            f"{server.base_url}/completion",
            headers={"Authorization": f"Bearer {server.api_key}"},
            json={"prompt": prompt, "n_predict": tokens, "temperature": 0, "seed": 1, "cache_prompt": False},
        )
        r.raise_for_status()
        body = r.json()
        return body["content"], float(body["timings"]["predicted_per_second"])


async def main(args: argparse.Namespace) -> dict[str, object]:
    settings = ForgeSettings()
    rpc_server = locate_rpc_server(settings)
    found = locate_llama_server(settings, rpc=True)
    llama, flags = found.path, list(found.child_args)  # the self-test's flags (--no-repack on AMX)
    model = resolve_model_path(args.model, settings)
    state = Path(tempfile.mkdtemp(prefix="bench-rpc-"))
    ports = [free_port(), free_port()]
    ready = anyio.Event()
    seen: set[str] = set()

    def on_event(name: str, event: str, _detail: str) -> None:
        if event == "ready":
            seen.add(name)
            if len(seen) == 2:
                ready.set()

    async with anyio.create_task_group() as tg:
        for i, port in enumerate(ports):
            spec = WorkerSpec(
                binary=rpc_server,
                port=port,
                threads=args.worker_threads,
                mask=_HIDE_GPUS,
                name=f"w{i}",
                state_dir=state,
            )
            tg.start_soon(functools.partial(run_supervised, spec, on_event=on_event))
        with anyio.fail_after(60):
            await ready.wait()
        common = {
            "model_path": model,
            "ctx_size": 1024,
            "parallel": 1,
            "state_dir": state,
            "mask": _HIDE_GPUS,
        }
        split = InstanceSpec(
            binary=llama,
            alias="split",
            n_gpu_layers="all",
            extra_args=[
                "--rpc",
                ",".join(f"127.0.0.1:{p}" for p in ports),
                "--tensor-split",
                "0.5,0.5",
                *flags,
            ],
            **common,  # type: ignore[arg-type]
        )
        single = InstanceSpec(
            binary=llama, alias="single", cpu_only=True, extra_args=["--no-repack"], **common
        )  # type: ignore[arg-type]
        same, tps_split, tps_single = 0, [], []
        async with ModelServer(split) as s, ModelServer(single) as o:
            for prompt in PROMPTS[: args.prompts]:
                a, ta = await complete(s, prompt, args.tokens)
                b, tb = await complete(o, prompt, args.tokens)
                same += a == b
                tps_split.append(ta)
                tps_single.append(tb)
        tg.cancel_scope.cancel()
    shutil.rmtree(state, ignore_errors=True)
    result = {
        "prompts": args.prompts,
        "tokens": args.tokens,
        "worker_threads": args.worker_threads,
        "single_threads": args.single_threads or "default",
        "identical": f"{same}/{args.prompts}",
        "split_tps_median": round(statistics.median(tps_split), 1),
        "single_tps_median": round(statistics.median(tps_single), 1),
        "ratio": round(statistics.median(tps_split) / statistics.median(tps_single), 2),
        "load_average_1m": round(os.getloadavg()[0], 1),  # other work on the box skews both sides
    }
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--worker-threads", type=int, default=1)
    ap.add_argument("--single-threads", type=int, default=None, help="-t of the one-process reference")
    print(json.dumps(anyio.run(main, ap.parse_args()), indent=2))
