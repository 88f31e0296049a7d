"""Has a GPU build computed on its GPU here? Compiling is not running.

The self-test serves one completion with a child's flags; llama.cpp's default ``-ngl`` offloads
the tiny model when the backend sees a device, and the child logs ``ROCm0 model buffer size``.
A HIP build on a machine without an AMD GPU (a CI runner, a build host) still serves, on the CPU:
the binary and its CPU part are proven, its GPU code is not. The record says which, from what the
self-test's child printed, never from what the build asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["GPU_BUFFER_PREFIX", "GpuRun", "backend_init_failures", "gpu_run"]

#: The prefix of each GPU accel's devices and buffers in llama-server's log (``ROCm0``, ``CUDA0``).
GPU_BUFFER_PREFIX: dict[str, str] = {"hip": "ROCm", "cuda": "CUDA", "vulkan": "Vulkan"}
#: The discovery vendor and the word for it, by accel (Vulkan: any vendor's GPU).
_VENDOR: dict[str, tuple[str | None, str]] = {
    "hip": ("amd", "AMD GPU"),
    "cuda": ("nvidia", "NVIDIA GPU"),
    "vulkan": (None, "GPU"),
}

#: ``ggml_cuda_init: failed to initialize ROCm: no ROCm-capable device is detected`` (and CUDA's).
_INIT_FAILED_RE = re.compile(r"\bfailed to initialize (\w+): (.+?)\s*$")


def backend_init_failures(lines: Sequence[str]) -> tuple[str, ...]:
    """Why a compiled-in (or loaded) GPU backend has no device: ``ROCm: no ROCm-capable device
    is detected``, one entry per backend, in the order printed."""
    found: list[str] = []
    for line in lines:
        m = _INIT_FAILED_RE.search(line)
        if m and (entry := f"{m[1]}: {m[2]}") not in found:
            found.append(entry)
    return tuple(found)


@dataclass(frozen=True)
class GpuRun:
    """build-info.json's ``gpu_run``: did the self-test compute on the build's GPU backend."""

    ran: bool
    detail: str

    def to_json(self) -> dict[str, object]:
        return {"ran": self.ran, "detail": self.detail}

    @classmethod
    def from_json(cls, data: object) -> GpuRun | None:
        if not isinstance(data, Mapping) or not isinstance(data.get("ran"), bool):
            return None
        return cls(ran=bool(data["ran"]), detail=str(data.get("detail") or ""))


def gpu_run(
    accel: str,
    *,
    tested: bool,
    buffers: Sequence[str],
    init_failures: Sequence[str],
    gpus_here: Sequence[str],
) -> GpuRun | None:
    """The record of a build for ``accel`` (None for a CPU build).

    ``tested``: a self-test served (False: self-tests off or none ran). ``buffers``: the model
    buffer types its child used (``ROCm0``, ``CPU``). ``init_failures``: what the backend said
    when it found no device. ``gpus_here``: the vendors of the usable GPUs discovery sees.
    """
    prefix = GPU_BUFFER_PREFIX.get(accel)
    if prefix is None:
        return None
    vendor, word = _VENDOR[accel]
    on_gpu = [b for b in buffers if b.startswith(prefix)]
    if tested and on_gpu:
        return GpuRun(True, f"its self-test computed on {', '.join(on_gpu)}")
    why = "; ".join(f for f in init_failures if f.startswith(prefix)) or ""
    have_gpu = any(vendor is None or v == vendor for v in gpus_here)
    if not tested:
        return GpuRun(False, "compiled, not run (no self-test)" + (f": {why}" if why else ""))
    if not have_gpu:
        detail = f"compiled, not run here (no {word})"
        return GpuRun(False, detail + (f": {why}" if why else "") + "; its self-test served on the CPU")
    return GpuRun(
        False,
        f"its self-test served on the CPU only, not on the {word} here ("
        + (why or f"no {prefix} buffer in its log")
        + ")",
    )
