"""The estimate against what the real llama-server allocated, on the CPU.

Each case starts the real binary at ``-lv 4`` (the verbosity that prints allocations) with the flags
forge gives its children on this CPU (``llama_server_flags``: ``--no-repack`` where the self-test
found ggml's AMX kernels crash), feeds its log to :class:`AllocationLedger` and compares. Goal from the issue: within 10 % of the total on
the embedded model; weights and KV cache are computed exactly, so they are held to 1 %.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from rocmforge_supervisor._argv import embedding_args, outputs_every_token
from rocmforge_supervisor.models import (
    REQUIRED_VERBOSITY,
    AllocationLedger,
    MemoryEstimate,
    estimate_memory,
    inspect_gguf,
)

MIB = 1024 * 1024


def _actual(
    binary: Path, model: Path, args: list[str], verbosity: int = REQUIRED_VERBOSITY
) -> AllocationLedger:
    """Start llama-server, read its log until it is ready, stop it; what it allocated."""
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", "0", "--no-warmup"]
    proc = subprocess.Popen(
        [*cmd, "-lv", str(verbosity), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ledger = AllocationLedger()
    tail: list[str] = []
    deadline = time.monotonic() + 90
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            ledger.feed(line)
            tail = [*tail[-30:], line]
            if "listening on" in line:
                break
            assert time.monotonic() < deadline, "llama-server did not become ready"
        else:
            pytest.fail("llama-server exited before it was ready:\n" + "".join(tail))
    finally:
        _stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()
    return ledger


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, again if it was lost, then SIGKILL.

    llama-server (4df29be) loses a SIGTERM that lands between its ``listening on`` line and the
    start of its task loop (``start_loop`` sets ``running = true`` after the handler cleared it):
    seen here in 1-3 of 8 starts. A second SIGTERM stops it.
    """
    for _ in range(2):
        proc.terminate()
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    proc.wait(timeout=10)


def _estimate(model: Path, args: list[str]) -> MemoryEstimate:
    no_repack = {"--no-repack", "-nr"} & set(args)
    valued = [a for a in args if a not in ("--embeddings", "-kvu") and a not in no_repack]
    opts = dict(zip(valued[::2], valued[1::2], strict=True))
    fa = opts.get("-fa", "auto")
    return estimate_memory(
        inspect_gguf(model),
        n_gpu_layers=0,
        ctx_size=int(opts.get("-c", 0)),
        parallel=int(opts["-np"]) if "-np" in opts else None,
        cache_type_k=opts.get("-ctk", "f16"),
        cache_type_v=opts.get("-ctv", "f16"),
        flash_attn=None if fa == "auto" else fa == "on",
        n_ubatch=int(opts.get("-ub", 512)),
        embeddings=outputs_every_token(args),
        repack=not no_repack,
        kv_unified=True if "-kvu" in args else None,
    )


def _compare(name: str, est: MemoryEstimate, ledger: AllocationLedger) -> float:
    actual = ledger.part_totals()
    rows = [
        ("weights", est.weights_bytes, actual.get("weights", 0)),
        ("kv", est.kv_bytes, actual.get("kv", 0)),
        ("compute", est.compute_bytes, actual.get("compute", 0)),
        ("output", est.output_bytes, actual.get("output", 0)),
        ("total", est.total_bytes, ledger.total_bytes),
    ]
    print(f"\n{name}: estimate vs actual (MiB)")
    for part, e, a in rows:
        err = (e - a) / a * 100 if a else 0.0
        print(f"  {part:8} {e / MIB:9.2f} {a / MIB:9.2f}  {err:+6.2f} %")
    assert set(ledger.device_totals()) == {"cpu"}
    assert abs(est.weights_bytes - actual["weights"]) <= 0.01 * actual["weights"]
    assert abs(est.kv_bytes - actual["kv"]) <= 0.01 * actual["kv"]
    assert abs(est.compute_bytes - actual["compute"]) <= 0.25 * actual["compute"]
    return (est.total_bytes - ledger.total_bytes) / ledger.total_bytes


GEMMA_CASES = [
    [],  # llama-server's defaults: trained context (32768), 4 slots sharing one KV cache, FA auto
    ["-c", "4096", "-np", "1"],
    ["-c", "4096", "-np", "4", "-fa", "off"],
    ["-c", "4096", "-np", "4", "-kvu"],  # forge's default for slots: one cache shared by them
    ["-c", "8192", "-np", "2", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"],
    ["-c", "16384", "-np", "1", "-fa", "off"],
]


@pytest.mark.parametrize("args", GEMMA_CASES, ids=lambda a: " ".join(a) or "defaults")
def test_gemma_estimate_within_10_percent(
    gemma_path: Path, llama_server_bin: Path, llama_server_flags: tuple[str, ...], args: list[str]
) -> None:
    args = [*args, *llama_server_flags]
    ledger = _actual(llama_server_bin, gemma_path, args)
    error = _compare(
        f"gemma-3-270m Q4_K_M {' '.join(args) or '(defaults)'}", _estimate(gemma_path, args), ledger
    )
    assert abs(error) < 0.10, f"estimate off by {error:+.1%}"


# ``embeddings = true`` adds these flags (forge's own: embedding_args) to a chat model's child.
EMBED = embedding_args(True, [], "llama")
EMBEDDING_CASES = [
    ["-c", "4096", "-np", "4", "-kvu", *EMBED],  # examples/forge.toml's model with embeddings = true
    ["-c", "4096", "-np", "1", "-fa", "off", *EMBED],
    ["-c", "2048", "-np", "2", "-ub", "256", *EMBED],
]


@pytest.mark.parametrize("args", EMBEDDING_CASES, ids=lambda a: " ".join(a))
def test_embeddings_estimate_within_10_percent(
    smollm2_path: Path,
    gemma_path: Path,
    llama_server_bin: Path,
    llama_server_flags: tuple[str, ...],
    args: list[str],
) -> None:
    """With --embeddings the child's compute buffer holds a whole ubatch of logits (the issue:
    estimated 196 MiB, allocated 283 MiB for the default model): the estimate must count it."""
    assert EMBED == ["--embeddings", "--pooling", "mean"]
    args = [*args, *llama_server_flags]
    for name, model in (("smollm2-135m", smollm2_path), ("gemma-3-270m", gemma_path)):
        ledger = _actual(llama_server_bin, model, args)
        est = _estimate(model, args)
        error = _compare(f"{name} {' '.join(args)}", est, ledger)
        assert abs(error) < 0.10, f"{name}: estimate off by {error:+.1%}"
        # The cause, seen in the child's own numbers: a whole ubatch of logits in its compute buffer.
        n_ubatch = int(args[args.index("-ub") + 1]) if "-ub" in args else 512
        logits = n_ubatch * inspect_gguf(model).vocab_size * 4
        assert ledger.part_totals()["compute"] > logits and est.embeddings


@pytest.mark.parametrize("args", [["-c", "2048", "-np", "1"], ["-c", "2048", "-np", "2", "-fa", "off"]])
def test_tiny_llama_estimate(
    tiny_gguf: Path, llama_server_bin: Path, llama_server_flags: tuple[str, ...], args: list[str]
) -> None:
    args = [*args, *llama_server_flags]
    ledger = _actual(llama_server_bin, tiny_gguf, args)
    error = _compare(f"tiny llama {' '.join(args)}", _estimate(tiny_gguf, args), ledger)
    assert abs(error) < 0.10


def test_allocation_lines_need_verbosity_4(
    tiny_gguf: Path, llama_server_bin: Path, llama_server_flags: tuple[str, ...]
) -> None:
    """At the default verbosity (3) llama-server prints no allocation line: children must get -lv 4."""
    assert REQUIRED_VERBOSITY == 4
    args = ["-c", "512", *llama_server_flags]
    quiet = _actual(llama_server_bin, tiny_gguf, args, verbosity=3)
    assert not quiet
    loud = _actual(llama_server_bin, tiny_gguf, args, verbosity=4)
    assert loud.part_totals().keys() >= {"weights", "kv", "compute", "output"}
