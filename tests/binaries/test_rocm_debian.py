"""Debian's ROCm (sid: ROCm 6.4 under /usr) and Debian's packaged llama-server, from outputs recorded
in a real sid userland (tests/fixtures/rocm-debian/, made by scripts/rocm/sid-root.sh; its
README says how). Nothing here needs ROCm or the sid root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rocmforge_supervisor._version import LLAMA_CPP_COMMIT
from rocmforge_supervisor.binaries import cache_key, make_plan, probe_binary
from rocmforge_supervisor.binaries._builder import _recorded, gpu_run_of
from rocmforge_supervisor.binaries._gpurun import GpuRun, gpu_run
from rocmforge_supervisor.binaries._locate import BinaryInfo, parse_backend_log
from rocmforge_supervisor.binaries._plan import RocmToolchain, _has_hipblas, choose_accel, find_rocm
from rocmforge_supervisor.binaries._selftest import Attempt, _Seen
from rocmforge_supervisor.doctor import _doctor
from rocmforge_supervisor.hardware._amdsmi import read_amdsmi
from tests.hardware.conftest import FIXTURES as SYSFS_MACHINES
from tests.hardware.conftest import machine_settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rocm-debian"
BACKENDS0 = "/usr/lib/x86_64-linux-gnu/ggml/backends0"
FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _fake_hipconfig(tmp_path: Path, rocm_path: str | None = None) -> Path:
    """A hipconfig that answers -R, -l, -P and --version with the recorded outputs (no newline,
    as Debian's prints them); ``rocm_path`` replaces -R's answer (a copy of the layout)."""
    script = tmp_path / "bin" / "hipconfig"
    script.parent.mkdir(parents=True, exist_ok=True)
    r_file = FIXTURES / "hipconfig-R.txt"
    if rocm_path is not None:
        r_file = tmp_path / "hipconfig-R.txt"
        r_file.write_text(rocm_path)
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  -R) cat "{r_file}" ;;\n'
        f'  -l) cat "{FIXTURES / "hipconfig-l.txt"}" ;;\n'
        f'  -P) cat "{FIXTURES / "hipconfig-P.txt"}" ;;\n'
        f'  --version) cat "{FIXTURES / "hipconfig--version.txt"}" ;;\n'
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return script


def _debian_usr(tmp_path: Path, triplet: str = "x86_64-linux-gnu") -> Path:
    """A copy of sid's /usr as far as discovery looks: the recorded CMake package directories."""
    usr = tmp_path / "usr"
    for line in _text("cmake-packages.txt").split():
        (usr / line.replace("x86_64-linux-gnu", triplet)).mkdir(parents=True)
    return usr


def _which(tmp_path: Path, hipconfig: Path):  # type: ignore[no-untyped-def]
    table = {name: f"/usr/bin/{name}" for name in ("cmake", "c++", "ninja")} | {"hipconfig": str(hipconfig)}
    return table.get


def test_hipconfig_on_debian_names_usr_and_llvm(tmp_path: Path) -> None:
    rocm = find_rocm(_which(tmp_path, _fake_hipconfig(tmp_path)))
    assert rocm == RocmToolchain(clang_dir="/usr/lib/llvm-21/bin", rocm_path="/usr")


@pytest.mark.parametrize("triplet", ["x86_64-linux-gnu", "aarch64-linux-gnu"])
def test_hipblas_found_in_the_multiarch_layout(tmp_path: Path, triplet: str) -> None:
    usr = _debian_usr(tmp_path, triplet)
    rocm = RocmToolchain(clang_dir="/usr/lib/llvm-21/bin", rocm_path=str(usr))
    assert _has_hipblas(rocm)
    (usr / "lib" / triplet / "cmake" / "hipblas").rmdir()
    assert not _has_hipblas(rocm)


def test_debian_rocm_is_chosen_and_planned_as_built_in_sid(tmp_path: Path) -> None:
    """The plan that compiles in sid: HIPCXX is Debian's clang (not /opt/rocm/llvm), HIP_PATH /usr,
    and the device bitcode named (Debian keeps it in clang's resource directory, where clang does
    not look once ROCM_PATH is set)."""
    usr = _debian_usr(tmp_path)
    bitcode = usr / "lib/llvm-21/lib/clang/21/amdgcn/bitcode"
    bitcode.mkdir(parents=True)
    which = _which(tmp_path, _fake_hipconfig(tmp_path, rocm_path=str(usr)))
    assert choose_accel("auto", which=which) == "hip"
    plan = make_plan(
        accel="hip",
        source=Path("/src"),
        build_dir=Path("/b"),
        commit=LLAMA_CPP_COMMIT,
        gpu_targets=("gfx1100",),
        jobs=2,
        which=which,
    )
    assert plan.env == {
        "HIPCXX": "/usr/lib/llvm-21/bin/clang",
        "HIP_PATH": str(usr),
        "ROCM_PATH": str(usr),
        "HIP_DEVICE_LIB_PATH": str(bitcode),
    }
    assert plan.configure[-2:] == ["-DGGML_HIP=ON", "-DGPU_TARGETS=gfx1100"]
    assert (
        cache_key(LLAMA_CPP_COMMIT, "hip", ("gfx1100",), cpu="n08c02493")
        == "4df29be4f4c3-hip-gfx1100-n08c02493"
    )


def _fake_debian_server(tmp_path: Path) -> Path:
    """Debian's llama-server as recorded: --version, and --list-devices whose backend-loading info
    lines come only when the verbosity is raised before it (as the real one does)."""
    lib_dir = tmp_path / "backends0"
    lib_dir.mkdir()
    for name in _text("backends0.txt").split():
        (lib_dir / name).write_bytes(b"")
    stderr = tmp_path / "list-devices.stderr"
    stderr.write_text(_text("llama-server--list-devices.stderr").replace(BACKENDS0, str(lib_dir)))
    errors_only = tmp_path / "list-devices.errors"
    errors_only.write_text("".join(line for line in stderr.read_text().splitlines(True) if " E " in line))
    script = tmp_path / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then cat "{FIXTURES / "llama-server--version.txt"}" >&2; exit 0; fi\n'
        f'if [ "$1" = --log-verbosity ] && [ "$3" = --list-devices ]; then cat "{stderr}" >&2;\n'
        f'else cat "{errors_only}" >&2; fi\n'
        f'cat "{FIXTURES / "llama-server--list-devices.stdout"}"\n'
    )
    script.chmod(0o755)
    return script


def test_debian_llama_server_is_probed(tmp_path: Path) -> None:
    info = probe_binary(_fake_debian_server(tmp_path))
    # A distribution's build names itself where a commit would be.
    assert (info.version, info.build, info.commit) == ("0.7.0", 11669, "Debian")
    assert info.accels == ("cpu",) and info.devices == ()
    log = info.backend_log
    assert [name for name, _ in log.loaded] == ["ROCm", "CPU"]
    assert [Path(p).name for _, p in log.loaded] == ["libggml-hip.so", "libggml-cpu-sapphirerapids.so"]
    assert len(log.installed) == 15 and any(p.endswith("/libggml-hip.so") for p in log.installed)
    assert info.unused_gpu_backends == ("ROCm: no ROCm-capable device is detected",)
    assert info.to_json()["unused_gpu_backends"] == ["ROCm: no ROCm-capable device is detected"]
    # `forge build --print-path --json`: "accels", and its first name "backends" for older readers.
    assert info.to_json()["accels"] == info.to_json()["backends"] == ["cpu"]


def test_backend_log_of_a_self_contained_build_is_empty() -> None:
    log = parse_backend_log("Available devices:\n  (none)\n")
    assert log.loaded == () and log.installed == () and log.init_failures == ()


def test_debian_start_log_says_why_hip_is_unused() -> None:
    """The recorded start of Debian's llama-server on forge's self-test model, on a machine
    without an AMD GPU: the ROCm backend loads, finds no device, and the model goes to the CPU."""
    seen = _Seen()
    for line in _text("llama-server-start.log").splitlines():
        seen.feed(line)
    assert seen.gpu_init == ["ROCm: no ROCm-capable device is detected"]
    assert seen.loaded == ["libggml-hip.so", "libggml-cpu-sapphirerapids.so"]
    assert seen.buffers == ["AMX", "CPU_Mapped"]
    ran = gpu_run("hip", tested=True, buffers=seen.buffers, init_failures=seen.gpu_init, gpus_here=())
    assert ran == GpuRun(
        False,
        "compiled, not run here (no AMD GPU): ROCm: no ROCm-capable device is detected; "
        "its self-test served on the CPU",
    )


def test_gpu_run_is_only_claimed_from_a_gpu_buffer() -> None:
    assert gpu_run("cpu", tested=True, buffers=("CPU",), init_failures=(), gpus_here=()) is None
    ran = gpu_run("hip", tested=True, buffers=("ROCm0", "CPU_Mapped"), init_failures=(), gpus_here=("amd",))
    assert ran is not None and ran.ran and "ROCm0" in ran.detail
    # An AMD GPU is there but the self-test still served on the CPU: said, not hidden.
    ran = gpu_run("hip", tested=True, buffers=("CPU",), init_failures=(), gpus_here=("amd",))
    assert ran is not None and not ran.ran and "CPU only" in ran.detail
    ran = gpu_run("hip", tested=False, buffers=(), init_failures=(), gpus_here=())
    assert ran == GpuRun(False, "compiled, not run (no self-test)")
    assert GpuRun.from_json(ran.to_json()) == ran and GpuRun.from_json(None) is None


def test_build_info_records_gpu_run_and_locate_reads_it(tmp_path: Path) -> None:
    settings = machine_settings(SYSFS_MACHINES / "no_gpu")
    attempt = Attempt(
        args=(),
        ok=True,
        outcome="served",
        buffers=("CPU",),
        gpu_init=("ROCm: no ROCm-capable device is detected",),
    )
    ran = gpu_run_of("hip", attempt, settings)
    assert ran is not None and ran.detail.startswith("compiled, not run here (no AMD GPU)")
    entry = tmp_path / "entry"
    entry.mkdir()
    (entry / "build-info.json").write_text(json.dumps({"backend": "hip", "gpu_run": ran.to_json()}))
    assert _recorded(entry) == {"build_accel": "hip", "gpu_run": ran}


def test_print_path_and_doctor_say_a_hip_build_is_not_proven(tmp_path: Path) -> None:
    """A HIP build compiled where no AMD GPU is: `forge build --print-path` and `forge doctor`
    name it compiled, not run, and say why its ROCm backend is unused."""
    server = _fake_debian_server(tmp_path)
    cache = tmp_path / "cache"
    entry = cache / "builds" / cache_key(LLAMA_CPP_COMMIT, "hip", ("gfx1100",))
    (entry / "bin").mkdir(parents=True)
    shutil.copy2(server, entry / "bin" / "llama-server")
    ran = GpuRun(False, "compiled, not run here (no AMD GPU): ROCm: no ROCm-capable device is detected")
    (entry / "build-info.json").write_text(
        json.dumps({"commit": LLAMA_CPP_COMMIT, "backend": "hip", "gpu_run": ran.to_json()})
    )
    env = dict(
        os.environ,
        FORGE_CACHE_DIR=str(cache),
        FORGE_LLAMA_SERVER=str(entry / "bin" / "llama-server"),
        FORGE_SELFTEST="0",
    )
    r = subprocess.run(
        [*FORGE, "build", "--print-path"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "gpu: compiled, not run here (no AMD GPU)" in r.stderr
    assert "gpu backend unused, serving on the CPU: ROCm: no ROCm-capable device is detected" in r.stderr
    info = BinaryInfo(
        path=server, version="0.7.0", build=1, commit="Debian", accels=("cpu",), gpu_run=ran,
        backend_log=probe_binary(server).backend_log,
    )  # fmt: skip
    checks = {c.name: c for c in _doctor._gpu_run_checks(info)}
    assert checks["gpu run"].status == "warn" and "not proven on a GPU" in checks["gpu run"].message
    assert "libggml-hip.so, libggml-cpu-*.so (14 variants)" in checks["backend libraries"].message
    assert (
        "loaded: ROCm (libggml-hip.so), CPU (libggml-cpu-sapphirerapids.so)"
        in checks["backend libraries"].message
    )
    assert checks["backends"].message.endswith("ROCm: no ROCm-capable device is detected")


def test_doctor_rocminfo_line_has_no_colour_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _text("rocminfo.txt").rsplit("exit ", 1)[0]
    monkeypatch.setattr(_doctor, "_find_tool", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(
        _doctor,
        "_run",
        lambda argv, timeout: (
            (0, _text("hipconfig--version.txt")) if "hipconfig" in argv[0] else (1, recorded)
        ),
    )
    checks = {c.name: c for c in _doctor._rocm_checks([])}
    assert checks["rocm"].message == "hipconfig 6.4.43484-9999"
    assert checks["rocminfo"].message == "rocminfo failed: ROCk module is NOT loaded, possibly no GPU devices"
    assert checks["rocminfo"].status == "pass"  # no AMD GPU: nothing needs it


def test_amdsmi_driver_not_loaded_is_one_line() -> None:
    """Debian's amd-smi (10.1) Python bindings, imported for real in sid without the amdgpu driver:
    amdsmi_init raises this; the probe says so on one line."""
    kind, message = _text("amdsmi_init-error.txt").split("\n", 1)

    class AmdSmiLibraryException(Exception):
        pass

    def init() -> None:
        raise AmdSmiLibraryException(message)

    module = SimpleNamespace(amdsmi_init=init)
    probe, gpus = read_amdsmi(True, module)
    assert kind == "AmdSmiLibraryException" and gpus == []
    assert probe.detail == (
        "amdsmi_init failed: AmdSmiLibraryException: Error code: 34 | AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded"
    )
