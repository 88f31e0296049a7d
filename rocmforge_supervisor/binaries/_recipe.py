"""One recipe for every program forge builds: a :class:`Recipe` per program, the steps written once.

A program (llama-server, whisper-server) is a table entry: its pinned commit and sdist, its cache
key's prefix, its setting and PATH name, its self-test. The steps are the same for both and live
here: resolve the GPU targets, build under the key's lock (leftovers of a killed forge removed, the
cache looked at again), run the cmake plan with its compilers in their own reaped process group,
prove the result in a staging directory and install it by one ``rename`` with ``build-info.json``
written last, and locate the cached build for this CPU with GPU builds first.

Layout of the cache (``$XDG_CACHE_HOME/rocmforge/builds``)::

    <prefix><key>/bin/<program>   a finished build (``build-info.json`` beside ``bin/``: finished)
    .work/<prefix><key>/          the cmake tree (kept so an interrupted build resumes) and build.log
    <prefix><key>.lock            serialises concurrent builds of the same key
    .staging-<key>-*, .old-<key>-*  what an install in progress holds (removed under the lock)
"""

from __future__ import annotations

import collections
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
from typing import TypeVar

from filelock import FileLock

from .._errors import BinaryNotFound, BuildError, SelfTestFailed
from ..config import ForgeSettings
from ..hardware import cpu_flags
from ..process import GroupReaper, kill_process_group
from ._plan import ACCEL_PREFERENCE, Accel, BuildPlan, Program, isa_fingerprint, isa_flags, make_plan
from ._selftest import run_selftest
from ._source import LLAMA_SDIST, WHISPER_SDIST, PinnedSdist, SourceTree
from ._whisper_selftest import SELFTEST_MODEL, whisper_selftest

__all__ = [
    "LLAMA",
    "RECIPES",
    "WHISPER",
    "Job",
    "ProgressFn",
    "Proof",
    "Recipe",
    "build",
    "cached_for_this_cpu",
    "executable",
    "finished_binary",
    "install_build",
    "install_staged",
    "locate",
    "remove_leftovers",
    "run_plan",
]

T = TypeVar("T")

#: Called with (done, total, line): ``done``/``total`` from ninja's ``[n/m]`` (None when unknown).
ProgressFn = Callable[[int | None, int | None, str], None]

_PROGRESS_RE = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PROGRESS_RE = re.compile(r"^\[\s*(\d+)%\]")


@dataclass(frozen=True)
class Proof:
    """What a self-test found in the staging directory."""

    ok: bool
    detail: str  # one line: what it served, or why not (with the child's last lines)
    record: Mapping[str, object]  # what build-info.json keeps of it
    result: object = None  # the program's own richer result (llama-server's SelfTest)


#: Proves a just-built ``binary`` here, given the settings and the source tree it came from.
SelfTestFn = Callable[[Path, ForgeSettings, Path], Proof]


@dataclass(frozen=True)
class Recipe:
    """One program forge builds, finds and proves."""

    program: Program  # the cmake target, the binary's name in ``bin/`` and on PATH
    sdist: PinnedSdist  # the pinned source (and commit) when no other tree is given
    key_prefix: str  # before the cache key: ``whisper-`` keeps the two programs' entries apart
    setting: str  # the ForgeSettings field of the explicit path (``FORGE_<SETTING>``)
    build_command: str  # what builds it, for hints
    selftest: SelfTestFn
    untested: Mapping[str, object]  # build-info.json's entries with self-tests off (FORGE_SELFTEST=0)
    refused_hint: str  # what the hint of a refused build says before the log's path

    @property
    def commit(self) -> str:
        return self.sdist.commit

    @property
    def env_var(self) -> str:
        return "FORGE_" + self.setting.upper()

    def configured(self, settings: ForgeSettings) -> Path | None:
        value = getattr(settings, self.setting)
        return value if isinstance(value, Path) else None


@dataclass(frozen=True)
class Job:
    """What one ``forge build`` asks for, whichever program it builds."""

    accel: Accel
    targets: tuple[str, ...]  # GPU targets (HIP gfx names, CUDA architectures)
    jobs: int | None  # parallel compile jobs (None: the CPUs)
    progress: ProgressFn | None
    force: bool  # rebuild even when the entry is cached
    rpc: bool = False
    portable: bool = False


def finished_binary(final: Path, program: str) -> Path | None:
    """The program of a finished cache entry: ``build-info.json`` written (last) and the binary
    executable. Anything less is an entry that was never completed."""
    binary = final / "bin" / program
    if (final / "build-info.json").is_file() and binary.is_file() and os.access(binary, os.X_OK):
        return binary
    return None


def remove_leftovers(builds: Path, key: str) -> None:
    """Staging directories of this key that a killed forge left (held under the key's lock)."""
    for leftover in (*builds.glob(f".staging-{key}-*"), *builds.glob(f".old-{key}-*")):
        shutil.rmtree(leftover, ignore_errors=True)


def build(
    recipe: Recipe,
    settings: ForgeSettings,
    job: Job,
    *,
    key: str,
    tree: SourceTree,
    cached: Callable[[Path], T | None],
    install: Callable[[Path, BuildPlan], T],
) -> tuple[T, bool]:
    """Build ``recipe``'s program from ``tree`` into the cache entry ``key``: the plan made first
    (a missing toolchain fails before anything is locked or written); then under the key's lock
    what a killed forge left is removed, the cache looked at again (another process may have
    built it while this one waited), and the plan run and handed to ``install(work, plan)``.
    (result, cached)."""
    builds = settings.builds_dir
    plan = make_plan(
        accel=job.accel,
        source=tree.path,
        build_dir=builds / ".work" / key,
        commit=tree.commit,
        gpu_targets=job.targets,
        jobs=job.jobs,
        rpc=job.rpc,
        portable=job.portable,
        program=recipe.program,
    )

    builds.mkdir(parents=True, exist_ok=True)
    with FileLock(str(builds / f"{key}.lock")):
        remove_leftovers(builds, key)
        if not job.force and (hit := cached(builds / key)) is not None:
            return hit, True
        work = builds / ".work" / key
        work.mkdir(parents=True, exist_ok=True)
        run_plan(plan, work / "build.log", job.progress)
        return install(work, plan), False


def run_plan(plan: BuildPlan, log_path: Path, progress: ProgressFn | None) -> None:
    """Configure and build, the whole output into ``log_path``; the compilers run in their own
    process group, killed on an interrupt or (by a reaper) if forge itself dies."""
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
                        _report(progress, line)
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


def _report(progress: ProgressFn, line: str) -> None:
    m = _PROGRESS_RE.match(line)
    if m:
        progress(int(m[1]), int(m[2]), line)
    elif (mm := _MAKE_PROGRESS_RE.match(line)) is not None:
        progress(int(mm[1]), 100, line)
    else:
        progress(None, None, line)


def install_build(
    recipe: Recipe,
    settings: ForgeSettings,
    *,
    builds: Path,
    key: str,
    work: Path,
    plan: BuildPlan,
    tree: SourceTree,
    names: Sequence[str] = (),
    extra: Callable[[Proof | None], Mapping[str, object]] | None = None,
) -> Proof | None:
    """Install what ``plan`` built in ``work`` as ``builds/key``, proven first: the binaries
    (``recipe.program`` and ``names``; a portable build's libraries beside them) are copied into
    staging, the recipe's self-test runs there, and a refused build leaves no cache entry.
    ``extra``: the program's own build-info.json entries. The proof (None: self-tests off)."""
    programs = [recipe.program, *names]
    for name in programs:
        if not (work / "bin" / name).is_file():
            raise BuildError(
                f"the build finished but {work / 'bin' / name} is missing",
                hint=f"remove the work directory and rebuild: {recipe.build_command} --force",
                log_path=str(work / "build.log"),
            )
    proof: Proof | None = None

    def fill(staging: Path) -> dict[str, object]:
        nonlocal proof
        for name in programs:
            shutil.copy2(work / "bin" / name, staging / "bin" / name)
        libraries = sorted(p.name for p in (work / "bin").glob("*.so*")) if plan.portable else []
        for name in libraries:  # the shared libraries and the CPU variants, beside the binary
            shutil.copy2(work / "bin" / name, staging / "bin" / name, follow_symlinks=False)
        # Proven before it is installed: a build that cannot serve here never enters the cache.
        if settings.selftest:
            proof = recipe.selftest(staging / "bin" / recipe.program, settings, tree.path)
            if not proof.ok:
                raise SelfTestFailed(
                    f"the new {recipe.program} failed its self-test: {proof.detail}",
                    hint="nothing was installed; " + recipe.refused_hint + str(work / "build.log"),
                )
        flags = cpu_flags()
        return {
            "program": recipe.program,
            "commit": tree.commit,
            "source": tree.origin,
            "source_path": str(tree.path),
            # The field keeps its first name, "backend" (every cache already written has it): it
            # holds the Accel (hip, cuda, vulkan, cpu) the build computes on.
            "backend": plan.accel,
            "gpu_targets": list(plan.gpu_targets),
            "rpc": plan.rpc,
            "portable": plan.portable,
            "cpu": "portable" if plan.portable else isa_fingerprint(flags),
            "cpu_isa": [] if plan.portable else list(isa_flags(flags)),
            **(extra(proof) if extra is not None else {}),
            **(proof.record if proof is not None else recipe.untested),
            "configure": plan.configure,
            "env": plan.env,
            "built_at": time.time(),
        }

    install_staged(builds, key, builds / key, fill)
    return proof


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


def cached_for_this_cpu(
    settings: ForgeSettings,
    recipe: Recipe,
    *,
    want: Callable[[Mapping[str, object]], bool] = lambda meta: True,
    skipped: list[str] | None = None,
) -> list[tuple[Path, dict[str, object]]]:
    """The finished builds of the pinned commit that this CPU may run, best first: GPU builds
    first; of the same accel a native build before a portable one (it is tuned to this CPU), and a
    plain one before an RPC one (they behave the same without ``--rpc``). A native build for
    another CPU (a shared cache) is never handed out; ``skipped`` hears why."""
    root = settings.builds_dir
    here = isa_fingerprint(cpu_flags())
    found: list[tuple[Path, dict[str, object]]] = []
    for info_file in sorted(root.glob(f"{recipe.key_prefix}*/build-info.json")) if root.is_dir() else []:
        binary = info_file.parent / "bin" / recipe.program
        if not binary.is_file():
            continue
        try:
            meta = json.loads(info_file.read_text())
        except (OSError, ValueError):
            continue
        # The 12 digits the cache key names: another pinned commit's build is never handed out.
        if not isinstance(meta, dict) or str(meta.get("commit", ""))[:12] != recipe.commit[:12]:
            continue
        if not want(meta):
            continue
        if meta.get("cpu") not in (None, "portable", here):
            if skipped is not None:
                skipped.append(f"{binary}: built for another CPU ({meta.get('cpu')}, this one is {here})")
            continue
        found.append((binary, meta))
    found.sort(
        key=lambda bm: (
            ACCEL_PREFERENCE.get(str(bm[1].get("backend")), 9),
            bm[1].get("portable") is True,
            bm[1].get("rpc") is True,
        )
    )
    return found


#: Accepts a candidate (path, where it came from: "setting", "cache" or "path", its build-info
#: when cached) or raises BinaryNotFound / SelfTestFailed saying why not.
AcceptFn = Callable[[Path, str, Mapping[str, object] | None], T]


def locate(
    recipe: Recipe,
    settings: ForgeSettings,
    accept: AcceptFn[T],
    *,
    configured: Path | None = None,
    want: Callable[[Mapping[str, object]], bool] = lambda meta: True,
    on_path: bool = True,
    not_found: tuple[str, str] | None = None,
) -> T:
    """The program every command uses: the explicit path (``configured``, else the setting), else
    the best cached build for this CPU that ``accept`` takes, else ``<program>`` on PATH.

    An explicit choice is never silently replaced by another binary. ``not_found``: (message,
    hint) when nothing is there, instead of the recipe's own.
    """
    explicit = configured or recipe.configured(settings)
    if explicit is not None:
        return accept(explicit.expanduser(), "setting", None)
    tried: list[str] = []
    candidates: list[tuple[Path, str, Mapping[str, object] | None]] = [
        (binary, "cache", meta)
        for binary, meta in cached_for_this_cpu(settings, recipe, want=want, skipped=tried)
    ]
    found = shutil.which(recipe.program) if on_path else None
    if found:
        candidates.append((Path(found), "path", None))
    failed_selftest: SelfTestFailed | None = None
    for binary, source, meta in candidates:
        try:
            return accept(binary, source, meta)
        except SelfTestFailed as exc:
            failed_selftest = failed_selftest or exc
            tried.append(f"{binary}: {exc.message}")
        except BinaryNotFound as exc:
            tried.append(f"{binary}: {exc.message}")
    if failed_selftest is not None:
        raise SelfTestFailed(
            f"no {recipe.program} here passed its self-test: {'; '.join(tried)}", hint=failed_selftest.hint
        )
    detail = f" (skipped: {'; '.join(tried)})" if tried else ""
    message, hint = not_found or (
        f"no {recipe.program} found",
        f"run `{recipe.build_command}`, or set {recipe.env_var} to a {recipe.program} binary",
    )
    raise BinaryNotFound(message + detail, hint=hint)


def executable(recipe: Recipe) -> AcceptFn[Path]:
    """The check for a program without ``--version``: being an executable file. A wrong one fails
    at its start with its own output in the error."""

    def accept(path: Path, source: str, meta: Mapping[str, object] | None) -> Path:
        if path.is_file() and os.access(path, os.X_OK):
            return path
        if source == "setting":
            raise BinaryNotFound(
                f"{recipe.env_var}={path} is not an executable file",
                hint=f"point {recipe.env_var} at a {recipe.program} binary, or unset it and run "
                f"`{recipe.build_command}`",
            )
        raise BinaryNotFound(f"{path} is not an executable file", hint=f"run `{recipe.build_command}`")

    return accept


def _prove_llama(binary: Path, settings: ForgeSettings, source: Path) -> Proof:
    """One real completion of a tiny generated model on this CPU (:mod:`._selftest`)."""
    result = run_selftest(binary, settings.cache_dir / "selftest")
    tail = result.attempts[0].log_tail[-3:] if result.attempts and not result.ok else ()
    detail = result.detail + (f" (last lines: {' | '.join(tail)})" if tail else "")
    record = {"selftest": result.to_json(), "child_args": list(result.child_args)}
    return Proof(result.ok, detail, record, result)


def _prove_whisper(binary: Path, settings: ForgeSettings, source: Path) -> Proof:
    """whisper.cpp's own weightless test model served once (:mod:`._whisper_selftest`)."""
    ok, detail = whisper_selftest(binary, source / "models" / SELFTEST_MODEL)
    return Proof(ok, detail, {"selftest": detail})


LLAMA = Recipe(
    program="llama-server",
    sdist=LLAMA_SDIST,
    key_prefix="",
    setting="llama_server",
    build_command="forge build",
    selftest=_prove_llama,
    untested={"selftest": None, "child_args": []},
    refused_hint="`forge build --portable` builds the CPU part with run-time dispatch, "
    "and the build log is in ",
)
WHISPER = Recipe(
    program="whisper-server",
    sdist=WHISPER_SDIST,
    key_prefix="whisper-",
    setting="whisper_server",
    build_command="forge build --whisper",
    selftest=_prove_whisper,
    untested={"selftest": "self-test skipped (FORGE_SELFTEST=0)"},
    refused_hint="the build log is in ",
)
#: Every program forge builds, by name.
RECIPES: Mapping[str, Recipe] = {r.program: r for r in (LLAMA, WHISPER)}
