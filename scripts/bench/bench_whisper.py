"""Benchmark of the whisper backend: readiness lag and the gateway's added latency.

Processes (all real): the project's whisper-server (`forge build --whisper`) and `forge serve` with one
``backend = "whisper"`` model. The audio is espeak-ng speaking one sentence (about 3 s of WAV).

1. Readiness lag: whisper-server started directly with the command line forge gives its children,
   from the spawn to the first ``GET /health`` 200 (polled every 5 ms); and through forge, from
   ``POST /api/models/NAME/load`` (after an unload) to the model's ``ready`` state, which includes
   forge's own placement and readiness polling.
2. Added latency of one transcription: ``POST /inference`` on forge's own child directly (the form
   forge sends: verbose_json, no language probabilities) against ``POST /v1/audio/transcriptions``
   through the gateway (which parses and checks the upload, queues for the child, renders the
   answer), interleaved round by round, medians.

Usage: .venv/bin/python scripts/bench/bench_whisper.py [--model PATH] [--rounds 9] [--weightless]
       (default model: whisper tiny.en, the tests' conversion of PyPI's CTranslate2 copy;
       --weightless: whisper.cpp's for-tests-ggml-tiny.bin from the pinned source)
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
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rocmforge_supervisor._whisper_argv import whisper_argv  # noqa: E402
from rocmforge_supervisor.binaries import locate_whisper_server  # noqa: E402
from rocmforge_supervisor.binaries._whisper import _source_tree  # noqa: E402
from rocmforge_supervisor.config import ForgeSettings  # noqa: E402
from rocmforge_supervisor.models import fetch_whisper_model  # noqa: E402
from rocmforge_supervisor.process import free_port  # noqa: E402


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.1f} ms (min {min(xs) * 1000:.1f}, n={len(xs)})"


def wait(cond: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.005)
    raise SystemExit("timed out")


def direct_readiness(binary: Path, model: Path, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        port = free_port()
        argv = whisper_argv(
            binary=binary, model_path=model, host="127.0.0.1", port=port, cpu_only=True, extra_args=[]
        )
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1) as c:

                def up() -> bool:
                    try:
                        return c.get("/health").status_code == 200
                    except httpx.HTTPError:
                        return False

                wait(up, 60)
            out.append(time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--weightless", action="store_true")
    a = ap.parse_args()
    settings = ForgeSettings()
    binary = locate_whisper_server(settings)
    if a.weightless:
        model = _source_tree(settings) / "models" / "for-tests-ggml-tiny.bin"
    else:
        model = a.model or fetch_whisper_model("tiny.en", settings)
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise SystemExit("espeak-ng is needed for the audio (apt-get install espeak-ng)")
    print(f"whisper-server {binary}\nmodel {model} ({model.stat().st_size} bytes), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "fox.wav"
        subprocess.run([espeak, "-w", str(wav), "The quick brown fox jumps over the lazy dog."], check=True)
        audio = wav.read_bytes()
        print(f"direct spawn -> /health 200: {ms(direct_readiness(binary, model, a.rounds))}")
        cfg = Path(tmp) / "forge.toml"
        cfg.write_text(f'[models.stt]\npath = "{model}"\nbackend = "whisper"\npreload = true\n')
        env = {**os.environ, "FORGE_STATE_DIR": str(Path(tmp) / "state"), "FORGE_WHISPER_SERVER": str(binary)}
        serve = subprocess.Popen(
            [sys.executable, "-m", "rocmforge_supervisor.cli", "serve", "--config", str(cfg), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert serve.stdout is not None
            url = serve.stdout.readline().strip()
            with httpx.Client(base_url=url, timeout=120) as g:

                def state() -> dict[str, object]:
                    rows = g.get("/api/models").json()["models"]
                    return dict(rows[0])

                wait(lambda: state()["state"] == "ready", 120)
                loads = []
                for _ in range(a.rounds):
                    g.post("/api/models/stt/unload")
                    wait(lambda: state()["state"] != "ready", 30)
                    t0 = time.perf_counter()
                    g.post("/api/models/stt/load")
                    wait(lambda: state()["state"] == "ready", 60)
                    loads.append(time.perf_counter() - t0)
                print(f"forge load -> ready:        {ms(loads)}")
                port = state()["port"]
                form = {
                    "response_format": "verbose_json",
                    "no_language_probabilities": "true",
                    "language": "auto",
                }
                direct, gateway = [], []
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as d:
                    d.post("/inference", data=form, files={"file": ("a.wav", audio)})  # warm
                    for i in range(a.rounds):
                        for which in (0, 1) if i % 2 == 0 else (1, 0):
                            t0 = time.perf_counter()
                            if which == 0:
                                r = d.post("/inference", data=form, files={"file": ("a.wav", audio)})
                                direct.append(time.perf_counter() - t0)
                            else:
                                r = g.post(
                                    "/v1/audio/transcriptions",
                                    data={"model": "stt", "response_format": "verbose_json"},
                                    files={"file": ("a.wav", audio)},
                                )
                                gateway.append(time.perf_counter() - t0)
                            r.raise_for_status()
                print(f"transcription direct:       {ms(direct)}")
                print(f"transcription via gateway:  {ms(gateway)}")
                added = statistics.median(gateway) - statistics.median(direct)
                print(f"gateway added (medians):    {added * 1000:.1f} ms")
        finally:
            serve.terminate()
            serve.wait(timeout=30)


if __name__ == "__main__":
    main()
