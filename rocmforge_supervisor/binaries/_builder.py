"""``forge build``: llama-server (and llama.cpp's RPC worker) through the one recipe (:mod:`._recipe`).

Layout of the cache (``$XDG_CACHE_HOME/rocmforge/builds``), beside :mod:`._recipe`'s::

    <key>/bin/llama-server       a finished build (native: self-contained, static ggml/llama)
    <key>/bin/*.so               a portable build's libraries and CPU variants (``--portable``)
    <key>-rpc/bin/ggml-rpc-server  an RPC build (``--rpc``): both binaries with ``GGML_RPC=ON``

``<key>`` names the CPU too: ``n`` + a fingerprint of the instruction sets a native build was
compiled for, or ``portable``. The finished directory appears by one ``rename`` of a complete
staging directory that has passed its self-test (one real completion on this machine), so an
interrupted, failed or crashing build leaves nothing that ``locate`` would pick up. The compilers
run in their own process group, watched by a small reaper process that kills the group if forge
dies without cleaning up (SIGKILL): no ``cc1plus`` outlives the build that started it.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import ForgeError, SelfTestFailed
from .._version import LLAMA_CPP_COMMIT
from ..config import ForgeSettings
from ..hardware import cpu_flags, detect
from ._gpurun import GPU_BUFFER_PREFIX, GpuRun, gpu_run
from ._locate import BinaryInfo, probe_binary
from ._plan import RPC_SERVER_TARGET, Accel, BuildPlan, cache_key, choose_accel, isa_fingerprint
from ._recipe import (
    LLAMA,
    Job,
    ProgressFn,
    Proof,
    build,
    finished_binary,
    install_build,
    install_staged,
)
from ._selftest import Attempt, SelfTest, cpu_variant
from ._source import SourceTree, resolve_source

__all__ = [
    "BuildResult",
    "ProgressFn",
    "build_llama_server",
    "detected_gpu_targets",
    "gpu_targets_for",
    "install_staged",
]


@dataclass(frozen=True)
class BuildResult:
    info: BinaryInfo
    key: str
    cached: bool  # True: it was already built, nothing ran
    seconds: float
    source: SourceTree | None


def detected_gpu_targets(settings: ForgeSettings, accel: Accel = "hip") -> tuple[str, ...]:
    """GPU targets: ``FORGE_GPU_TARGETS``, else what discovery sees: the AMD GPUs' gfx targets for
    HIP, the NVIDIA GPUs' compute capabilities for CUDA (NVML's ``9.0`` → ``90``: one architecture
    compiled instead of the toolkit's whole default list)."""
    if settings.gpu_targets:
        return tuple(t for t in re.split(r"[;,\s]+", settings.gpu_targets) if t)
    try:
        inventory = detect(settings)
    except Exception:  # discovery never blocks a build; cmake then targets what it finds itself
        return ()
    if accel == "cuda":
        return tuple(
            sorted(
                {
                    d.compute_capability.replace(".", "")
                    for d in inventory.devices
                    if d.vendor == "nvidia" and d.compute_capability
                }
            )
        )
    return tuple(sorted({d.gfx_target for d in inventory.devices if d.vendor == "amd" and d.gfx_target}))


def gpu_targets_for(settings: ForgeSettings, accel: Accel, given: Sequence[str] | None) -> tuple[str, ...]:
    """A build's GPU targets: those given, else (HIP, CUDA) the detected ones; none for Vulkan
    and CPU unless given."""
    if given is not None or accel not in ("hip", "cuda"):
        return tuple(given or ())
    return detected_gpu_targets(settings, accel)


def job_for(
    settings: ForgeSettings,
    accel: str,
    gpu_targets: Sequence[str] | None,
    *,
    jobs: int | None,
    progress: ProgressFn | None,
    force: bool,
    rpc: bool = False,
    portable: bool = False,
) -> Job:
    """The build a ``forge build`` asks for; ``accel`` as the user gave it (``--accel``, ``auto``
    included), checked and resolved here."""
    chosen = choose_accel(accel)
    targets = gpu_targets_for(settings, chosen, gpu_targets)
    return Job(chosen, targets, jobs, progress, force, rpc, portable)


def build_llama_server(
    settings: ForgeSettings,
    *,
    accel: str = "auto",
    source: Path | None = None,
    gpu_targets: Sequence[str] | None = None,
    jobs: int | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
    rpc: bool = False,
    portable: bool = False,
) -> BuildResult:
    """Build (or find cached) llama-server; ``rpc`` also builds llama.cpp's RPC worker beside it;
    ``portable``: the CPU part with run-time ISA dispatch (one build for any x86-64 node).

    A build is finished when it has served one completion on this machine (the self-test); one
    that cannot is refused and leaves no cache entry. A cached build is proven on this CPU too.
    """
    started = time.monotonic()
    cpu = "portable" if portable else isa_fingerprint(cpu_flags())
    job = job_for(
        settings, accel, gpu_targets, jobs=jobs, progress=progress, force=force, rpc=rpc, portable=portable
    )
    # The cache is checked before sources are resolved: a cache hit must not download anything.
    pinned = source is None and settings.llama_cpp_source is None
    if pinned and not force:
        # An RPC build is a superset of a plain one: it satisfies a plain request (`make setup`
        # builds --rpc; a later `forge build` must not compile a second tree for 5 minutes).
        for with_rpc in (rpc,) if rpc else (False, True):
            key = cache_key(LLAMA_CPP_COMMIT, job.accel, job.targets, rpc=with_rpc, cpu=cpu)
            hit = _finished(settings.builds_dir / key, with_rpc, settings)
            if hit is not None:
                return BuildResult(hit, key, True, time.monotonic() - started, None)
    tree = resolve_source(settings, source)
    key = cache_key(tree.commit, job.accel, job.targets, rpc=rpc, cpu=cpu)
    if tree.origin == "explicit":
        # Trees without git all report commit "unknown": the path keeps them apart.
        key += "-src" + hashlib.sha256(str(tree.path).encode()).hexdigest()[:8]
    builds = settings.builds_dir
    info, cached = build(
        LLAMA,
        settings,
        job,
        key=key,
        tree=tree,
        cached=lambda final: _finished(final, rpc, settings),
        install=lambda work, plan: _install(work, builds / key, builds, plan, tree, key, settings),
    )
    return BuildResult(info, key, cached, time.monotonic() - started, tree)


def gpu_run_of(accel: Accel, passing: Attempt | None, settings: ForgeSettings) -> GpuRun | None:
    """Whether the self-test's passing start computed on the build's GPU (None: a CPU build)."""
    if accel not in GPU_BUFFER_PREFIX:
        return None
    try:
        vendors = [d.vendor for d in detect(settings).gpus]
    except Exception:  # discovery never blocks an install: "no GPU seen" is then the truth told
        vendors = []
    return gpu_run(
        accel,
        tested=passing is not None,
        buffers=passing.buffers if passing is not None else (),
        init_failures=passing.gpu_init if passing is not None else (),
        gpus_here=vendors,
    )


def _finished(final: Path, rpc: bool, settings: ForgeSettings) -> BinaryInfo | None:
    """A finished entry whose llama-server answers ``--version`` and is proven on this CPU."""
    binary = finished_binary(final, LLAMA.program)
    if binary is None:
        return None
    if rpc and not (final / "bin" / RPC_SERVER_TARGET).is_file():
        return None
    try:
        meta = json.loads((final / "build-info.json").read_text())
        info = probe_binary(binary, list_devices=False, source="cache")
    except SelfTestFailed:
        raise
    except (ForgeError, OSError, ValueError):  # a corrupt cached build is rebuilt rather than trusted
        return None
    # Proven on this CPU (a portable build in a shared cache may meet a CPU it was not tested on).
    info = info.with_selftest(settings, meta if isinstance(meta, dict) else None)
    return BinaryInfo(**{**info.__dict__, **_recorded(final)})


def _install(
    work: Path,
    final: Path,
    builds: Path,
    plan: BuildPlan,
    tree: SourceTree,
    key: str,
    settings: ForgeSettings,
) -> BinaryInfo:
    """Prove and install a llama-server build (with the RPC worker of an ``--rpc`` one)."""

    def dispatch(proof: Proof | None) -> dict[str, object]:
        passing = proof.result.passing if proof is not None and isinstance(proof.result, SelfTest) else None
        ran = gpu_run_of(plan.accel, passing, settings)
        if not plan.portable:
            return {"dispatch": None, "gpu_run": ran.to_json() if ran is not None else None}
        libraries = sorted(p.name for p in (work / "bin").glob("libggml-cpu-*.so*"))
        return {
            "dispatch": {
                "variants": libraries,
                # The variant the dispatch chose on this CPU (from the features its system_info
                # printed: the module load itself is not logged at the child's verbosity).
                "chosen": cpu_variant(passing.cpu_features) if passing else None,
                "features": list(passing.cpu_features) if passing else [],
            },
            "gpu_run": ran.to_json() if ran is not None else None,
        }

    proof = install_build(
        LLAMA,
        settings,
        builds=builds,
        key=key,
        work=work,
        plan=plan,
        tree=tree,
        names=[RPC_SERVER_TARGET] if plan.rpc else [],
        extra=dispatch,
    )
    info = probe_binary(final / "bin" / "llama-server", list_devices=False, source="cache")
    selftest = proof.result if proof is not None and isinstance(proof.result, SelfTest) else None
    return BinaryInfo(**{**info.__dict__, "selftest": selftest, **_recorded(final)})


def _recorded(final: Path) -> dict[str, object]:
    """What a BinaryInfo takes from a cache entry's build-info.json: the accel it was built for and
    whether it computed on its GPU here."""
    try:
        meta = json.loads((final / "build-info.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    return {"build_accel": str(meta.get("backend")), "gpu_run": GpuRun.from_json(meta.get("gpu_run"))}
