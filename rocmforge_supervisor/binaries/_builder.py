"""``forge build``: configure and build llama-server once per (commit, backend, targets).

Layout of the cache (``$XDG_CACHE_HOME/rocmforge/builds``)::

    <key>/bin/llama-server       a finished build (native: self-contained, static ggml/llama)
    <key>/bin/*.so               a portable build's libraries and CPU variants (``--portable``)
    <key>-rpc/bin/ggml-rpc-server  an RPC build (``--rpc``): both binaries with ``GGML_RPC=ON``
    <key>/build-info.json        written last, inside the staging dir: its presence means "finished"
    .work/<key>/                 the cmake tree (kept so an interrupted build resumes incrementally)
    .work/<key>/build.log        the full configure + build log
    <key>.lock                   serialises concurrent builds of the same key

``<key>`` names the CPU too: ``n`` + a fingerprint of the instruction sets a native build was
compiled for, or ``portable``. The finished directory appears by one ``rename`` of a complete
staging directory that has passed its self-test (one real completion on this machine), so an
interrupted, failed or crashing build leaves nothing that ``locate`` would pick up. The compilers
run in their own process group, watched by a small reaper process that kills the group if forge
dies without cleaning up (SIGKILL): no ``cc1plus`` outlives the build that started it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from .._errors import BuildError, ForgeError, SelfTestFailed
from .._version import LLAMA_CPP_COMMIT
from ..config import ForgeSettings
from ..hardware import cpu_flags, detect
from ..process import GroupReaper, kill_process_group
from ._locate import BinaryInfo, probe_binary
from ._plan import (
    RPC_SERVER_TARGET,
    Backend,
    BuildPlan,
    cache_key,
    choose_backend,
    isa_fingerprint,
    isa_flags,
    make_plan,
)
from ._selftest import SelfTest, cpu_variant, run_selftest
from ._source import SourceTree, resolve_source

__all__ = ["BuildResult", "ProgressFn", "build_llama_server", "detected_gpu_targets", "install_staged"]

#: Called with (done, total, line): ``done``/``total`` from ninja's ``[n/m]`` (None when unknown).
ProgressFn = Callable[[int | None, int | None, str], None]

_PROGRESS_RE = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PROGRESS_RE = re.compile(r"^\[\s*(\d+)%\]")


@dataclass(frozen=True)
class BuildResult:
    info: BinaryInfo
    key: str
    cached: bool  # True: it was already built, nothing ran
    seconds: float
    source: SourceTree | None


def detected_gpu_targets(settings: ForgeSettings, backend: Backend = "hip") -> tuple[str, ...]:
    """GPU targets: ``FORGE_GPU_TARGETS``, else what discovery sees: the AMD GPUs' gfx targets for
    HIP, the NVIDIA GPUs' compute capabilities for CUDA (NVML's ``9.0`` → ``90``: one architecture
    compiled instead of the toolkit's whole default list)."""
    if settings.gpu_targets:
        return tuple(t for t in re.split(r"[;,\s]+", settings.gpu_targets) if t)
    try:
        inventory = detect(settings)
    except Exception:  # discovery never blocks a build; cmake then targets what it finds itself
        return ()
    if backend == "cuda":
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


def build_llama_server(
    settings: ForgeSettings,
    *,
    backend: str = "auto",
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
    chosen: Backend = choose_backend(backend)
    targets: tuple[str, ...] = ()
    if chosen in ("hip", "cuda"):
        targets = tuple(gpu_targets) if gpu_targets is not None else detected_gpu_targets(settings, chosen)
    elif gpu_targets:
        targets = tuple(gpu_targets)
    # The cache is checked before sources are resolved: a cache hit must not download anything.
    pinned = source is None and settings.llama_cpp_source is None
    if pinned and not force:
        # An RPC build is a superset of a plain one: it satisfies a plain request (`make setup`
        # builds --rpc; a later `forge build` must not compile a second tree for 5 minutes).
        for with_rpc in (rpc,) if rpc else (False, True):
            key = cache_key(LLAMA_CPP_COMMIT, chosen, targets, rpc=with_rpc, cpu=cpu)
            hit = _finished(settings.builds_dir / key, with_rpc, settings)
            if hit is not None:
                return BuildResult(hit, key, True, time.monotonic() - started, None)
    tree = resolve_source(settings, source)
    key = cache_key(tree.commit, chosen, targets, rpc=rpc, cpu=cpu)
    if tree.origin == "explicit":
        # Trees without git all report commit "unknown": the path keeps them apart.
        key += "-src" + hashlib.sha256(str(tree.path).encode()).hexdigest()[:8]
    builds = settings.builds_dir
    final = builds / key
    work = builds / ".work" / key
    plan = make_plan(
        backend=chosen,
        source=tree.path,
        build_dir=work,
        commit=tree.commit,
        gpu_targets=targets,
        jobs=jobs,
        rpc=rpc,
        portable=portable,
    )
    builds.mkdir(parents=True, exist_ok=True)
    with FileLock(str(builds / f"{key}.lock")):
        _remove_leftovers(builds, key)
        if not force:
            hit = _finished(final, rpc, settings)
            if hit is not None:
                return BuildResult(hit, key, True, time.monotonic() - started, tree)
        work.mkdir(parents=True, exist_ok=True)
        log_path = work / "build.log"
        _run_plan(plan, log_path, progress)
        info = _install(work, final, builds, plan, tree, key, settings)
    return BuildResult(info, key, False, time.monotonic() - started, tree)


def _remove_leftovers(builds: Path, key: str) -> None:
    """Staging directories of this key that a killed forge left (held under the key's lock)."""
    for leftover in (*builds.glob(f".staging-{key}-*"), *builds.glob(f".old-{key}-*")):
        shutil.rmtree(leftover, ignore_errors=True)


def _finished(final: Path, rpc: bool, settings: ForgeSettings) -> BinaryInfo | None:
    binary = final / "bin" / "llama-server"
    if not (final / "build-info.json").is_file() or not binary.is_file():
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
    return info.with_selftest(settings, meta if isinstance(meta, dict) else None)


def _run_plan(plan: BuildPlan, log_path: Path, progress: ProgressFn | None) -> None:
    env = {**os.environ, **plan.env}
    if plan.portable:
        env.pop("CFLAGS", None)  # a user's -march=native would undo the portability
        env.pop("CXXFLAGS", None)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with log_path.open("w", encoding="utf-8", errors="replace") as log:
        for step in (plan.configure, plan.build):
            log.write("$ " + " ".join(step) + "\n")
            log.flush()
            try:
                proc = subprocess.Popen(
                    step,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise BuildError(
                    f"could not run {step[0]}: {exc.strerror or exc}",
                    hint="install cmake and a C++ compiler",
                    log_path=str(log_path),
                ) from exc
            assert proc.stdout is not None
            reaper = GroupReaper(proc.pid)  # kills the compilers if forge itself is SIGKILLed
            try:
                for line in proc.stdout:
                    log.write(line)
                    line = line.rstrip("\n")
                    tail.append(line)
                    if progress is not None:
                        m = _PROGRESS_RE.match(line)
                        if m:
                            progress(int(m[1]), int(m[2]), line)
                        elif (mm := _MAKE_PROGRESS_RE.match(line)) is not None:
                            progress(int(mm[1]), 100, line)
                        else:
                            progress(None, None, line)
                rc = proc.wait()
            except BaseException:
                # Interrupted (Ctrl-C, SIGTERM): stop the whole compiler group; the cmake tree
                # stays for a resume.
                kill_process_group(proc)
                raise
            finally:
                reaper.release()
                proc.stdout.close()
            if rc != 0:
                what = "configure" if step is plan.configure else "build"
                raise BuildError(
                    f"{plan.program} {what} failed (cmake exited {rc})",
                    hint=f"see the log for the first error; retry with `forge build -v`: {log_path}",
                    log_path=str(log_path),
                    log_tail=list(tail)[-15:],
                )


def _install(
    work: Path,
    final: Path,
    builds: Path,
    plan: BuildPlan,
    tree: SourceTree,
    key: str,
    settings: ForgeSettings,
) -> BinaryInfo:
    names = ["llama-server", *([RPC_SERVER_TARGET] if plan.rpc else [])]
    for name in names:
        if not (work / "bin" / name).is_file():
            raise BuildError(
                f"the build finished but {work / 'bin' / name} is missing",
                hint="remove the work directory and rebuild: forge build --force",
                log_path=str(work / "build.log"),
            )
    selftest: SelfTest | None = None

    def fill(staging: Path) -> dict[str, object]:
        nonlocal selftest
        for name in names:
            shutil.copy2(work / "bin" / name, staging / "bin" / name)
        libraries = sorted(p.name for p in (work / "bin").glob("*.so*")) if plan.portable else []
        for name in libraries:  # the shared libraries and the CPU variants, beside the binary
            shutil.copy2(work / "bin" / name, staging / "bin" / name, follow_symlinks=False)
        # Proven before it is installed: a build that cannot serve here never enters the cache.
        selftest = (
            run_selftest(staging / "bin" / "llama-server", settings.cache_dir / "selftest")
            if settings.selftest
            else None
        )
        if selftest is not None and not selftest.ok:
            tail = selftest.attempts[0].log_tail[-3:] if selftest.attempts else ()
            raise SelfTestFailed(
                f"the new llama-server failed its self-test: {selftest.detail}"
                + (f" (last lines: {' | '.join(tail)})" if tail else ""),
                hint="nothing was installed; `forge build --portable` builds the CPU part with "
                "run-time dispatch, and the build log is in " + str(work / "build.log"),
            )
        flags = cpu_flags()
        meta = {
            "commit": tree.commit,
            "source": tree.origin,
            "source_path": str(tree.path),
            "backend": plan.backend,
            "gpu_targets": list(plan.gpu_targets),
            "rpc": plan.rpc,
            "portable": plan.portable,
            "cpu": "portable" if plan.portable else isa_fingerprint(flags),
            "cpu_isa": [] if plan.portable else list(isa_flags(flags)),
            "dispatch": {
                "variants": [n for n in libraries if n.startswith("libggml-cpu-")],
                # The variant the dispatch chose on this CPU (from the features its system_info
                # printed: the module load itself is not logged at the child's verbosity).
                "chosen": cpu_variant(selftest.passing.cpu_features)
                if selftest and selftest.passing
                else None,
                "features": list(selftest.passing.cpu_features) if selftest and selftest.passing else [],
            }
            if plan.portable
            else None,
            "selftest": selftest.to_json() if selftest is not None else None,
            "child_args": list(selftest.child_args) if selftest is not None else [],
            "configure": plan.configure,
            "env": plan.env,
            "built_at": time.time(),
        }
        return meta

    install_staged(builds, key, final, fill)
    info = probe_binary(final / "bin" / "llama-server", list_devices=False, source="cache")
    return BinaryInfo(**{**info.__dict__, "selftest": selftest})


def install_staged(builds: Path, key: str, final: Path, fill: Callable[[Path], Mapping[str, object]]) -> None:
    """Install a build into ``final`` by one ``rename``: ``fill`` puts the files into a staging
    directory (and proves them: a self-test raises to refuse them) and returns the metadata, which
    is written last as ``build-info.json``. Any failure leaves no cache entry and no staging
    directory; an existing entry (a forced rebuild) is replaced whole."""
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{key}-", dir=builds))
    staging.chmod(0o755)  # mkdtemp makes it 0700: a service user must be able to run the build
    try:
        (staging / "bin").mkdir()
        meta = fill(staging)
        (staging / "build-info.json").write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():  # an older or forced build: replace it whole
            old = Path(tempfile.mkdtemp(prefix=f".old-{key}-", dir=builds))
            final.rename(old / "tree")
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(final)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise BuildError(
            f"could not install the build into {final}: {exc.strerror or exc}",
            hint="free disk space in the cache directory (FORGE_CACHE_DIR) and retry",
        ) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
