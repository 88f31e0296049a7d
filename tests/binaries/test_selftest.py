"""A build is proven to run before it is used: the self-test, its AMX workaround, portable builds,
the RPC superset, and a killed build that leaves nothing behind.

The real llama-server (the one `make test` built) is self-tested as users' builds are. The crashes
are the FAKE llama-server's (tests/support/fake_llama_server.py): no CPU here crashes on demand, so
the fake dies of the same signal at the same moment (SIGSEGV on the first completion unless
``--no-repack`` is given, as the AMX kernels do at the pin; SIGILL always, as a build for another
CPU does) and the tests check what forge makes of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocmforge_supervisor import SelfTestFailed
from rocmforge_supervisor._version import LLAMA_CPP_COMMIT
from rocmforge_supervisor.binaries import (
    _builder,
    build_llama_server,
    cache_key,
    locate_llama_server,
    make_plan,
)
from rocmforge_supervisor.binaries._plan import isa_fingerprint
from rocmforge_supervisor.binaries._selftest import proven, run_selftest
from rocmforge_supervisor.binaries._source import SourceTree
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import cpu_flags
from rocmforge_supervisor.process import crash_advice

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "support" / "fake_llama_server.py"
FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]
AMX = "amx_int8" in cpu_flags()


def _fake(tmp_path: Path, name: str = "llama-server", **env: str) -> Path:
    """The fake llama-server as an executable, with its faults set through the environment."""
    path = tmp_path / "fake" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    exports = "".join(f"export {k}={json.dumps(v)}\n" for k, v in env.items())
    path.write_text(f'#!/bin/bash\n{exports}exec -a llama-server "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)
    return path


def _no_process_runs(path: Path) -> bool:
    needle = str(path).encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    return False
            except OSError:
                continue
    return True


# -- the real build --------------------------------------------------------------------------------


def test_the_real_build_serves_its_first_tokens(llama_server_bin: Path, tmp_path: Path) -> None:
    result = run_selftest(llama_server_bin, tmp_path)
    assert result.ok, result.detail
    passing = result.passing
    assert passing is not None and passing.buffers, "the child's model buffer lines were read"
    assert passing.cpu_features, "the CPU backend's features (system_info) were read"
    assert result.cpu == isa_fingerprint(cpu_flags())
    if not AMX:  # nothing changes where nothing crashes: children keep the default (repacked) path
        assert result.child_args == ()
        assert result.detail.startswith("served 8 tokens")
    assert result.slot_restore == "ok", result.slot_restore  # a restored slot serves the next request
    assert _no_process_runs(tmp_path), "the self-test's child is gone"


@pytest.mark.skipif(not AMX, reason="needs an Intel AMX CPU (amx_int8 in /proc/cpuinfo): this one has none")
def test_on_amx_the_default_model_answers_paris(llama_server_bin: Path, tmp_path: Path) -> None:
    """On AMX the pinned kernels crash; the located build carries the workaround into every child."""
    from rocmforge_supervisor import Message, load_model

    info = locate_llama_server(ForgeSettings(llama_server=llama_server_bin))
    assert info.selftest is not None and info.selftest.ok
    with load_model("smollm2-135m", ctx_size=1024) as model:
        text = "".join(
            t.text
            for t in model.chat(
                [Message("user", "What is the capital of France? Answer in one word.")],
                max_tokens=16,
                temperature=0,
            )
        )
    assert "paris" in text.lower()


def test_located_binary_is_tested_once_per_file(llama_server_bin: Path, tmp_path: Path) -> None:
    settings = ForgeSettings(cache_dir=tmp_path / "cache", llama_server=llama_server_bin)
    first = locate_llama_server(settings)
    assert first.selftest is not None and first.selftest.ok
    again = locate_llama_server(settings)
    assert again.selftest is not None and again.selftest.seconds == first.selftest.seconds


def test_build_info_records_the_selftest(llama_server_bin: Path) -> None:
    info_file = llama_server_bin.resolve().parents[1] / "build-info.json"
    meta = json.loads(info_file.read_text())
    if "selftest" not in meta:
        pytest.skip(f"{info_file} was written before builds were self-tested")
    assert meta["selftest"]["ok"] is True
    assert meta["cpu"] in ("portable", isa_fingerprint(cpu_flags()))
    assert meta["selftest"]["cpu_isa"] and meta["selftest"]["buffers"]
    assert meta["child_args"] == meta["selftest"]["child_args"]


# -- the crashes, through the fake -------------------------------------------------------------------


def test_a_restore_that_is_a_no_op_is_found(tmp_path: Path) -> None:
    """llama.cpp #26676's shape, through the fake: the restore answers its tokens, the slot stays
    empty. The self-test says so and still passes (serving works); what the tier does with it:
    tests/gateway_fast/test_conversation_slots.py."""
    fake = _fake(tmp_path, FAKE_LLAMA_RESTORE_NOOP="1")
    result = run_selftest(fake, tmp_path / "work")
    assert result.ok and result.slot_restore.startswith("no-op"), result.slot_restore
    assert "#26676" in result.slot_restore
    assert run_selftest(_fake(tmp_path, "honest"), tmp_path / "work2").slot_restore == "ok"


def test_a_crash_on_the_first_token_takes_the_workaround(tmp_path: Path) -> None:
    fake = _fake(tmp_path, FAKE_LLAMA_DIE_ON_REQUEST="SIGSEGV", FAKE_LLAMA_WORKS_WITH="--no-repack")
    result = run_selftest(fake, tmp_path / "work")
    assert result.ok
    assert result.child_args == ("--no-repack",)
    first = result.attempts[0]
    assert first.returncode == -signal.SIGSEGV and first.crashed_in == "completion"
    assert "killed by SIGSEGV on its first completion" in result.detail
    assert "every child gets --no-repack" in result.detail


def test_a_binary_that_dies_of_sigill_is_refused_with_the_fix(tmp_path: Path) -> None:
    fake = _fake(tmp_path, FAKE_LLAMA_DIE_ON_REQUEST="SIGILL")
    settings = ForgeSettings(cache_dir=tmp_path / "cache", llama_server=fake)
    with pytest.raises(SelfTestFailed) as info:
        locate_llama_server(settings)
    err = info.value
    assert "killed by SIGILL on its first completion" in err.message
    assert "refused an instruction" in err.message
    assert err.hint is not None and "--portable" in err.hint
    # Nothing recorded as good: the next locate tests it again (and refuses it again).
    assert not list((tmp_path / "cache" / "selftest").glob("*.json"))
    proc = subprocess.run(
        [*FORGE, "build", "--print-path"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FORGE_LLAMA_SERVER": str(fake), "FORGE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "SIGILL" in proc.stderr and "Traceback" not in proc.stderr
    assert len(lines) <= 3, proc.stderr


def test_selftest_can_be_turned_off(tmp_path: Path) -> None:
    fake = _fake(tmp_path, FAKE_LLAMA_DIE_ON_REQUEST="SIGILL")
    assert proven(fake, ForgeSettings(cache_dir=tmp_path, selftest=False)) is None


def _tree(tmp_path: Path) -> SourceTree:
    return SourceTree(tmp_path / "src", LLAMA_CPP_COMMIT, "submodule")


def _work_dir(tmp_path: Path, fake: Path, libraries: tuple[str, ...] = ()) -> Path:
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "llama-server").write_text(fake.read_text())
    (work / "bin" / "llama-server").chmod(0o755)
    for name in libraries:
        (work / "bin" / name).write_bytes(b"\x7fELF (a stand-in)")
    return work


def test_a_build_that_fails_its_selftest_is_not_installed(tmp_path: Path) -> None:
    fake = _fake(tmp_path, FAKE_LLAMA_DIE_ON_REQUEST="SIGILL")
    work = _work_dir(tmp_path, fake)
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    builds = settings.builds_dir
    builds.mkdir(parents=True)
    plan = make_plan(accel="cpu", source=tmp_path / "src", build_dir=work, commit=LLAMA_CPP_COMMIT)
    key = cache_key(LLAMA_CPP_COMMIT, "cpu", (), cpu=isa_fingerprint(cpu_flags()))
    with pytest.raises(SelfTestFailed, match="failed its self-test: killed by SIGILL"):
        _builder._install(work, builds / key, builds, plan, _tree(tmp_path), key, settings)
    assert sorted(p.name for p in builds.iterdir()) == [], "no entry, no staging directory"


def test_a_portable_build_records_its_dispatch(tmp_path: Path) -> None:
    variants = ("libggml-cpu-haswell.so", "libggml-cpu-sapphirerapids.so", "libggml-cpu-x64.so")
    fake = _fake(
        tmp_path,
        FAKE_LLAMA_LOG="common_param: system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 "
        "| SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 | OPENMP = 1 | REPACK = 1 |"
        "\\nload_tensors:   CPU_REPACK model buffer size =     1.00 MiB",
    )
    work = _work_dir(tmp_path, fake, (*variants, "libggml-base.so", "libllama.so"))
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    settings.builds_dir.mkdir(parents=True)
    plan = make_plan(
        accel="cpu", source=tmp_path / "src", build_dir=work, commit=LLAMA_CPP_COMMIT, portable=True
    )
    for flag in (
        "-DGGML_NATIVE=OFF",
        "-DGGML_BACKEND_DL=ON",
        "-DGGML_CPU_ALL_VARIANTS=ON",
        "-DBUILD_SHARED_LIBS=ON",
    ):
        assert flag in plan.configure
    assert "-DBUILD_SHARED_LIBS=OFF" not in plan.configure
    key = cache_key(LLAMA_CPP_COMMIT, "cpu", (), cpu="portable")
    assert key == "4df29be4f4c3-cpu-portable"  # one key on every machine
    final = settings.builds_dir / key
    info = _builder._install(work, final, settings.builds_dir, plan, _tree(tmp_path), key, settings)
    meta = json.loads((final / "build-info.json").read_text())
    assert meta["portable"] is True and meta["cpu"] == "portable"
    assert meta["dispatch"]["variants"] == list(variants)
    assert meta["dispatch"]["chosen"] == "haswell"  # AVX2, FMA, F16C, BMI2 and no AVX-512
    assert "AVX2" in meta["dispatch"]["features"] and "AVX512" not in meta["dispatch"]["features"]
    assert meta["selftest"]["buffers"] == ["CPU_REPACK"]
    assert {p.name for p in (final / "bin").iterdir()} >= {*variants, "libllama.so", "llama-server"}
    assert info.selftest is not None and info.selftest.ok


def test_native_cache_keys_name_the_cpu() -> None:
    base = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
    assert isa_fingerprint(base) == isa_fingerprint(base | {"ht", "lm", "nx"})  # only ISA flags count
    assert isa_fingerprint(base) != isa_fingerprint(base | {"avx512f"})
    assert isa_fingerprint(base) != isa_fingerprint(base | {"amx_int8", "amx_tile"})
    key = cache_key(LLAMA_CPP_COMMIT, "cpu", (), cpu=isa_fingerprint(base), rpc=True)
    assert re.fullmatch(r"4df29be4f4c3-cpu-n[0-9a-f]{8}-rpc", key)


def test_a_native_build_for_another_cpu_is_never_located(llama_server_bin: Path, tmp_path: Path) -> None:
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    entry = settings.builds_dir / "4df29be4f4c3-cpu-n00000000"
    (entry / "bin").mkdir(parents=True)
    (entry / "bin" / "llama-server").symlink_to(llama_server_bin)
    (entry / "build-info.json").write_text(
        json.dumps({"commit": LLAMA_CPP_COMMIT, "backend": "cpu", "cpu": "n00000000"})
    )
    env_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = "/nonexistent"
        with pytest.raises(Exception, match="built for another CPU"):
            locate_llama_server(settings)
    finally:
        os.environ["PATH"] = env_path


def test_an_rpc_build_satisfies_a_plain_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake(tmp_path)
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    key = cache_key(LLAMA_CPP_COMMIT, "cpu", (), cpu=isa_fingerprint(cpu_flags()), rpc=True)
    entry = settings.builds_dir / key
    (entry / "bin").mkdir(parents=True)
    for name in ("llama-server", "ggml-rpc-server"):
        (entry / "bin" / name).write_text(fake.read_text())
        (entry / "bin" / name).chmod(0o755)
    (entry / "build-info.json").write_text(
        json.dumps({"commit": LLAMA_CPP_COMMIT, "backend": "cpu", "rpc": True})
    )

    def no_source(*args: object, **kwargs: object) -> None:
        raise AssertionError("a plain build was started although an RPC build is cached")

    monkeypatch.setattr(_builder, "resolve_source", no_source)
    result = build_llama_server(settings, accel="cpu")
    assert result.cached and result.key == key
    assert result.info.selftest is not None and result.info.selftest.ok


def test_every_containerfile_builds_portable() -> None:
    files = sorted((REPO / "deploy" / "containers").glob("Containerfile.*"))
    assert files
    for f in files:
        builds = [line for line in f.read_text().splitlines() if "forge build" in line]
        assert builds, f"{f.name} runs no forge build"
        assert all("--portable" in line for line in builds), f"{f.name}: {builds}"


def test_crash_advice_names_cause_and_fix() -> None:
    sigill = crash_advice(-signal.SIGILL, computed=True)
    assert sigill is not None and "--portable" in sigill and "SIGILL" in sigill
    first = crash_advice(-signal.SIGSEGV, computed=False, amx=True)
    assert first is not None and "AMX" in first and "--no-repack" in first
    assert crash_advice(-signal.SIGSEGV, computed=True) is None  # a later crash is no build fault
    assert crash_advice(-signal.SIGKILL, computed=False) is None


# -- a killed build -------------------------------------------------------------------------------------


def _fake_toolchain(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A FAKE cmake on PATH: configure succeeds, the build step starts a long-running "compiler"
    (a ``sleep`` named cc1plus) in its process group and waits, as ninja waits for its jobs."""
    tools = tmp_path / "tools"
    tools.mkdir()
    marker = tmp_path / "compiler-started"
    (tools / "cmake").write_text(
        "#!/bin/bash\n"
        'if [ "$1" != "--build" ]; then echo "-- Configuring done"; exit 0; fi\n'
        'echo "[1/10] Building CXX object ggml.o"\n'
        f'(exec -a cc1plus sleep 300) & echo $! > "{marker}"\n'
        "wait\n"
    )
    (tools / "cmake").chmod(0o755)
    src = tmp_path / "llama-src"
    (src / "tools" / "server").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("# a stand-in tree\n")
    return tools, src, marker


def _wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie awaiting its reaper is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_build_leaves_no_compiler_and_no_cache_entry(tmp_path: Path, sig: int) -> None:
    tools, src, marker = _fake_toolchain(tmp_path)
    cache = tmp_path / "cache"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "FORGE_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(
        [*FORGE, "build", "--accel", "cpu", "--source", str(src)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own group: a real signal to forge alone
    )
    try:
        assert _wait_for(lambda: marker.is_file() and marker.read_text().strip(), 60), (
            "the build never started"
        )
        compiler = int(marker.read_text())
        assert _pid_alive(compiler)
        os.kill(proc.pid, sig)
        rc = proc.wait(timeout=30)
        assert rc == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
        assert _wait_for(lambda: not _pid_alive(compiler), 15), "the compiler outlived the build"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if marker.is_file() and marker.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
        assert proc.stderr is not None
        proc.stderr.close()
    builds = cache / "builds"
    assert not [
        p for p in builds.iterdir() if (p / "build-info.json").exists() or p.name.startswith(".staging")
    ]


def test_cuda_targets_come_from_the_gpus_nvml_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's compute capabilities (8.9, 8.6) become CMAKE_CUDA_ARCHITECTURES 86;89, as the gfx
    targets of the AMD GPUs do for HIP; FORGE_GPU_TARGETS still wins."""
    from rocmforge_supervisor.hardware import detect
    from tests.hardware.conftest import FIXTURES, machine_settings
    from tests.hardware.test_libraries import FakeNvml

    settings = machine_settings(FIXTURES / "no_gpu", use_nvml=True)
    monkeypatch.setattr(_builder, "detect", lambda s: detect(s, nvml_module=FakeNvml()))
    assert _builder.detected_gpu_targets(settings, "cuda") == ("86", "89")
    assert _builder.detected_gpu_targets(settings, "hip") == ()
    pinned = machine_settings(FIXTURES / "no_gpu", use_nvml=True, gpu_targets="90")
    assert _builder.detected_gpu_targets(pinned, "cuda") == ("90",)


def test_doctor_shows_the_workaround_the_selftest_chose(tmp_path: Path) -> None:
    fake = _fake(tmp_path, FAKE_LLAMA_DIE_ON_REQUEST="SIGSEGV", FAKE_LLAMA_WORKS_WITH="--no-repack")
    env = {**os.environ, "FORGE_LLAMA_SERVER": str(fake), "FORGE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([*FORGE, "doctor"], capture_output=True, text=True, timeout=180, env=env)
    line = next((x for x in (proc.stdout + proc.stderr).splitlines() if "self-test" in x), "")
    assert line.startswith("warn self-test"), proc.stdout + proc.stderr
    assert "killed by SIGSEGV on its first completion" in line and "every child gets --no-repack" in line
