"""Which accelerator to build for, and the exact cmake commands for it.

``Accel`` (hip, cuda, vulkan, cpu) is what ggml computes on, and the user's word for it too
(``forge build --accel``); ``backend`` in config/ and supervisor/ names the kind of model (llama,
whisper, command, peer). Only build-info.json keeps the field's first name, ``"backend"``, so the
caches already written stay readable.

Kept free of side effects (apart from asking ``hipconfig``/``nvcc`` where they are) so the command
lines are unit-tested for a given set of gfx targets without ROCm being installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._errors import ToolchainMissing, UsageError

__all__ = [
    "ACCELS",
    "ACCEL_PREFERENCE",
    "RPC_SERVER_TARGET",
    "Accel",
    "BuildPlan",
    "Program",
    "RocmToolchain",
    "cache_key",
    "check_accel",
    "choose_accel",
    "find_cuda",
    "find_rocm",
    "isa_fingerprint",
    "isa_flags",
    "make_plan",
]

Accel = Literal["hip", "cuda", "vulkan", "cpu"]
#: The programs forge builds (cmake targets and binary names): one recipe each (``_recipe.RECIPES``).
Program = Literal["llama-server", "whisper-server"]
ACCELS: tuple[str, ...] = ("auto", "hip", "cuda", "vulkan", "cpu")
#: Which cached build ``locate`` hands out first: GPU builds before the CPU one.
ACCEL_PREFERENCE: dict[str, int] = {"hip": 0, "cuda": 1, "vulkan": 2, "cpu": 3}

Which = Callable[[str], str | None]

#: The cmake target and binary name of llama.cpp's RPC worker at the pinned commit
#: (``tools/rpc/CMakeLists.txt``; older trees called it ``rpc-server``).
RPC_SERVER_TARGET = "ggml-rpc-server"


@dataclass(frozen=True)
class RocmToolchain:
    clang_dir: str  # `hipconfig -l`: the directory holding ROCm's clang
    rocm_path: str  # `hipconfig -R`


@dataclass(frozen=True)
class BuildPlan:
    accel: Accel
    gpu_targets: tuple[str, ...]
    configure: list[str]
    build: list[str]
    env: dict[str, str] = field(default_factory=dict)
    rpc: bool = False
    portable: bool = False
    program: Program = "llama-server"  # the cmake target (and binary) it builds


#: The CPU features that decide which instructions a native (``-march=native``) ggml uses: a
#: build is only handed to a CPU with the same set (x86 ``flags`` and Arm ``Features`` names).
_ISA_FLAGS = frozenset(
    {
        "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2",
        "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vbmi", "avx512_vnni",
        "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
        "asimd", "asimddp", "asimdhp", "fphp", "sve", "sve2", "i8mm", "bf16", "sme",
    }
)  # fmt: skip


def isa_flags(flags: frozenset[str] | set[str]) -> tuple[str, ...]:
    """The flags of ``flags`` that matter to a native build, sorted."""
    return tuple(sorted(_ISA_FLAGS & set(flags)))


def isa_fingerprint(flags: frozenset[str] | set[str]) -> str:
    """A short name for the instruction sets a native build may use: ``n`` + 8 hex digits.

    A cache shared between machines (an NFS home, a copied image) then keeps one native build per
    kind of CPU, and never hands one compiled for AVX-512 or AMX to a CPU without them.
    """
    isa = isa_flags(flags)
    return "n" + hashlib.sha256(" ".join(isa).encode()).hexdigest()[:8]


def cache_key(
    commit: str,
    accel: Accel,
    gpu_targets: Sequence[str],
    *,
    rpc: bool = False,
    cpu: str | None = None,
) -> str:
    """Builds are cached per (commit, accel, targets, CPU, rpc): the same inputs never build twice.

    ``cpu``: ``"portable"`` (one key on every machine: run-time ISA dispatch) or the
    :func:`isa_fingerprint` of the CPU a native build is compiled for.

    An RPC build gets its own key (``…-rpc``) rather than replacing the plain one: ``GGML_USE_RPC``
    is a PUBLIC definition of ggml, so turning it on in an existing tree recompiles llama, common
    and the server anyway (most of a build), and a plain build already in a cache stays valid.
    A plain request is satisfied by an RPC build (a superset) when one is there.
    """
    key = f"{commit[:12]}-{accel}"
    if gpu_targets:
        key += "-" + "_".join(sorted(gpu_targets))
    if cpu:
        key += f"-{cpu}"
    if rpc:
        key += "-rpc"
    return key


def find_rocm(which: Which = shutil.which) -> RocmToolchain | None:
    hipconfig = which("hipconfig")
    if hipconfig is None:
        return None
    try:
        clang_dir = subprocess.run([hipconfig, "-l"], capture_output=True, text=True, timeout=30).stdout
        rocm_path = subprocess.run([hipconfig, "-R"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if not clang_dir.strip() or not rocm_path.strip():
        return None
    return RocmToolchain(clang_dir.strip(), rocm_path.strip())


def _has_hipblas(rocm: RocmToolchain) -> bool:
    """hipBLAS's CMake package under the ROCm root: ``lib/`` (AMD's /opt/rocm), ``lib64/``
    (Fedora), or a Debian multiarch ``lib/<triplet>/`` (Debian and Ubuntu ship ROCm under /usr:
    ``/usr/lib/x86_64-linux-gnu/cmake/hipblas``, ``aarch64-linux-gnu`` on Arm)."""
    root = Path(rocm.rocm_path)
    if any((root / d / "cmake" / "hipblas").is_dir() for d in ("lib", "lib64")):
        return True
    return any(p.is_dir() for p in root.glob("lib/*-linux-gnu*/cmake/hipblas"))


def _device_libs(rocm: RocmToolchain) -> Path | None:
    """Where clang must be told the device bitcode is, or None when ROCM_PATH says it.

    AMD's layout keeps it at ``<rocm>/amdgcn/bitcode``, which clang finds from ROCM_PATH. Debian
    ships it in clang's resource directory (``/usr/lib/llvm-21/lib/clang/21/amdgcn/bitcode``),
    which clang looks in only when ROCM_PATH is unset: with ROCM_PATH=/usr every HIP object
    fails with "cannot find ROCm device library" unless HIP_DEVICE_LIB_PATH names it."""
    root = Path(rocm.rocm_path)
    if (root / "amdgcn" / "bitcode").is_dir():
        return None
    llvm = Path(rocm.clang_dir).parent
    for found in (
        *sorted(llvm.glob("lib/clang/*/amdgcn/bitcode")),
        *sorted(root.glob("lib/llvm-*/lib/clang/*/amdgcn/bitcode")),
    ):
        if found.is_dir():
            return found
    return None


def _cuda_roots(which: Which) -> list[Path]:
    roots = [Path("/usr/local/cuda")]
    nvcc = which("nvcc")
    if nvcc:
        roots.insert(0, Path(nvcc).resolve().parent.parent)
    return roots


def find_cuda(which: Which = shutil.which) -> Path | None:
    """The CUDA toolkit root with nvcc *and* cuBLAS (llama.cpp's CUDA backend needs both)."""
    has_nvcc = which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()
    if not has_nvcc:
        return None
    for root in _cuda_roots(which):
        for lib in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            if any((root / lib).glob("libcublas.so*")):
                return root
    if any(Path("/usr/lib/x86_64-linux-gnu").glob("libcublas.so*")):
        return Path("/usr")
    return None


def check_accel(requested: str) -> None:
    """A name ``--accel`` takes (``auto`` included), or the usage error naming them: checked before
    anything else, also where the accel is not used (``forge build --print-path``)."""
    if requested not in ACCELS:
        raise UsageError(f"unknown accel {requested!r}", hint=f"use --accel with one of: {', '.join(ACCELS)}")


def choose_accel(requested: str, which: Which = shutil.which) -> Accel:
    """``auto``: HIP when ROCm (with hipBLAS) is there, CUDA when nvcc and cuBLAS are, else CPU.

    A half-installed toolkit (nvcc without cuBLAS is common in containers) would fail the build
    minutes in, so ``auto`` checks completeness; a forced one is checked in :func:`make_plan` and
    fails with the missing piece named. The messages name the option, ``--accel``.
    """
    check_accel(requested)
    if requested == "auto":
        rocm = find_rocm(which)
        if rocm is not None and _has_hipblas(rocm):
            return "hip"
        if find_cuda(which) is not None:
            return "cuda"
        return "cpu"
    return requested  # type: ignore[return-value]  # checked against ACCELS above


def _require_common(which: Which) -> None:
    if which("cmake") is None:
        raise ToolchainMissing(
            "cmake is not installed", hint="install it (Debian/Ubuntu: sudo apt-get install cmake)"
        )
    if which("c++") is None and which("g++") is None and which("clang++") is None:
        raise ToolchainMissing(
            "no C++ compiler found", hint="install one (Debian/Ubuntu: sudo apt-get install build-essential)"
        )


#: whisper.cpp's own options for a ``whisper-server`` build (the ggml part is the same as llama's):
#: the examples directory holds the server; no tests, no SDL2 (microphone examples), no curl.
_WHISPER_OPTIONS = [
    "-DWHISPER_BUILD_TESTS=OFF",
    "-DWHISPER_BUILD_EXAMPLES=ON",
    "-DWHISPER_BUILD_SERVER=ON",
    "-DWHISPER_SDL2=OFF",
    "-DWHISPER_CURL=OFF",
]


def make_plan(
    *,
    accel: Accel,
    source: Path,
    build_dir: Path,
    commit: str,
    gpu_targets: Sequence[str] = (),
    jobs: int | None = None,
    which: Which = shutil.which,
    rocm: RocmToolchain | None = None,
    rpc: bool = False,
    portable: bool = False,
    program: Program = "llama-server",
) -> BuildPlan:
    """The cmake configure and build commands for ``accel``, following llama.cpp's docs/build.md.

    ``rpc``: also ``GGML_RPC=ON`` and the ``ggml-rpc-server`` target. Both binaries come from the
    one tree: a llama-server only accepts ``--rpc`` when it was built with the RPC backend too.

    ``portable``: the CPU part as llama.cpp's own release images build it (``GGML_NATIVE=OFF``,
    one ``libggml-cpu-<level>.so`` per ISA level chosen at run time: ``GGML_BACKEND_DL``,
    ``GGML_CPU_ALL_VARIANTS``), so one image runs on any x86-64 node. Backends as modules need
    shared libraries; ``$ORIGIN`` lets the binary find them beside itself once moved into the cache.
    """
    _require_common(which)
    generator = ["-G", "Ninja"] if which("ninja") else []
    configure = [
        "cmake", "-S", str(source), "-B", str(build_dir), *generator,
        "-DCMAKE_BUILD_TYPE=Release",
    ]  # fmt: skip
    if portable:
        configure += [
            "-DBUILD_SHARED_LIBS=ON",
            "-DGGML_NATIVE=OFF",
            "-DGGML_BACKEND_DL=ON",
            "-DGGML_CPU_ALL_VARIANTS=ON",
            "-DCMAKE_BUILD_RPATH=$ORIGIN",
        ]
    else:
        # One self-contained binary: it can be moved into the cache atomically.
        configure.append("-DBUILD_SHARED_LIBS=OFF")
    configure += _WHISPER_OPTIONS if program == "whisper-server" else [
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_UI=OFF",  # children run with --no-webui: no npm build, no download
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",  # children listen on loopback only: no TLS, no libssl-dev needed
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_NUMBER=0",
        f"-DLLAMA_BUILD_COMMIT={commit[:7]}",
    ]  # fmt: skip
    env: dict[str, str] = {}
    targets = tuple(gpu_targets)
    if accel == "hip":
        rocm = rocm or find_rocm(which)
        if rocm is None:
            raise ToolchainMissing(
                "a HIP build needs ROCm, but hipconfig was not found",
                hint="install ROCm >= 6.1 with hipBLAS (https://rocm.docs.amd.com), "
                "or build for another accelerator with --accel cpu|cuda|vulkan",
            )
        if not _has_hipblas(rocm):
            raise ToolchainMissing(
                f"ROCm at {rocm.rocm_path} has no hipBLAS",
                hint="install hipblas-dev and rocblas-dev (or your distribution's hipBLAS package)",
            )
        # ROCM_PATH too: ggml-hip looks in /opt/rocm when it is unset and /opt/rocm exists, so a
        # host with Debian's ROCm under /usr and a stray /opt/rocm would mix two installs.
        env = {"HIPCXX": f"{rocm.clang_dir}/clang", "HIP_PATH": rocm.rocm_path, "ROCM_PATH": rocm.rocm_path}
        device_libs = _device_libs(rocm)
        if device_libs is not None:
            env["HIP_DEVICE_LIB_PATH"] = str(device_libs)
        configure.append("-DGGML_HIP=ON")
        if targets:
            configure.append(f"-DGPU_TARGETS={';'.join(targets)}")
    elif accel == "cuda":
        if which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
            raise ToolchainMissing(
                "a CUDA build needs nvcc, which was not found",
                hint="install the CUDA toolkit (or put /usr/local/cuda/bin on PATH)",
            )
        if find_cuda(which) is None:
            raise ToolchainMissing(
                "the CUDA toolkit has nvcc but no cuBLAS",
                hint="install cuBLAS (e.g. the libcublas-dev / cuda-libraries-dev package of your CUDA version)",
            )
        configure.append("-DGGML_CUDA=ON")
        if which("nvcc") is None:
            configure.append("-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc")
        if targets:
            configure.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(targets)}")
    elif accel == "vulkan":
        if which("glslc") is None:
            raise ToolchainMissing(
                "a Vulkan build needs glslc and the Vulkan headers",
                hint="install them (Debian/Ubuntu: sudo apt-get install libvulkan-dev glslc)",
            )
        configure.append("-DGGML_VULKAN=ON")
    if rpc:
        configure.append("-DGGML_RPC=ON")
    build = [
        "cmake", "--build", str(build_dir), "--config", "Release",
        "--target", program, *([RPC_SERVER_TARGET] if rpc else []),
        "-j", str(jobs or os.cpu_count() or 1),
    ]  # fmt: skip
    return BuildPlan(
        accel=accel,
        gpu_targets=targets,
        configure=configure,
        build=build,
        env=env,
        rpc=rpc,
        portable=portable,
        program=program,
    )
