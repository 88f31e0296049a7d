"""Building and locating llama-server: plans, the cache, the locate order, and failures."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rocmforge_supervisor import BinaryNotFound, SourceError, ToolchainMissing, UsageError
from rocmforge_supervisor._errors import BuildError
from rocmforge_supervisor._version import LLAMA_CPP_COMMIT
from rocmforge_supervisor.binaries import _source as source_module
from rocmforge_supervisor.binaries import (
    build_llama_server,
    cache_key,
    choose_accel,
    locate_llama_server,
    make_plan,
    probe_binary,
)
from rocmforge_supervisor.binaries._plan import RocmToolchain
from rocmforge_supervisor.config import ForgeSettings

FORGE = [sys.executable, "-m", "rocmforge_supervisor.cli"]


def _which(*present: str):  # type: ignore[no-untyped-def]
    table = {name: f"/usr/bin/{name}" for name in present}
    return lambda name: table.get(name)


def test_hip_cmake_plan_for_given_targets(tmp_path: Path) -> None:
    rocm_root = tmp_path / "rocm"
    (rocm_root / "lib" / "cmake" / "hipblas").mkdir(parents=True)
    rocm = RocmToolchain(clang_dir=str(rocm_root / "llvm" / "bin"), rocm_path=str(rocm_root))
    plan = make_plan(
        accel="hip",
        source=Path("/src/llama.cpp"),
        build_dir=Path("/b"),
        commit=LLAMA_CPP_COMMIT,
        gpu_targets=("gfx1100", "gfx942"),
        jobs=8,
        which=_which("cmake", "c++", "ninja", "hipconfig"),
        rocm=rocm,
    )
    assert plan.configure == [
        "cmake", "-S", "/src/llama.cpp", "-B", "/b", "-G", "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_NUMBER=0",
        "-DLLAMA_BUILD_COMMIT=4df29be",
        "-DGGML_HIP=ON",
        "-DGPU_TARGETS=gfx1100;gfx942",
    ]  # fmt: skip
    assert plan.env == {
        "HIPCXX": f"{rocm.clang_dir}/clang",
        "HIP_PATH": str(rocm_root),
        "ROCM_PATH": str(rocm_root),
    }
    assert plan.build == [
        "cmake", "--build", "/b", "--config", "Release", "--target", "llama-server", "-j", "8",
    ]  # fmt: skip
    assert cache_key(LLAMA_CPP_COMMIT, "hip", ("gfx942", "gfx1100")) == "4df29be4f4c3-hip-gfx1100_gfx942"


def test_hip_without_hipblas_is_refused(tmp_path: Path) -> None:
    rocm = RocmToolchain(clang_dir="/opt/rocm/llvm/bin", rocm_path=str(tmp_path))
    with pytest.raises(ToolchainMissing, match="hipBLAS"):
        make_plan(
            accel="hip",
            source=Path("/s"),
            build_dir=Path("/b"),
            commit="abc",
            which=_which("cmake", "c++"),
            rocm=rocm,
        )


def test_missing_cmake_and_unknown_accel() -> None:
    with pytest.raises(ToolchainMissing, match="cmake"):
        make_plan(accel="cpu", source=Path("/s"), build_dir=Path("/b"), commit="abc", which=_which("c++"))
    with pytest.raises(UsageError, match="unknown accel 'rocm'"):
        choose_accel("rocm")
    assert choose_accel("auto", which=_which("cmake")) == "cpu"


def test_forge_build_hip_without_rocm_fails_clearly(tmp_path: Path) -> None:
    env = dict(os.environ, FORGE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [*FORGE, "build", "--accel", "hip"], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 1
    assert "a HIP build needs ROCm" in r.stderr and "install ROCm" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "cache" / "builds").exists() or not any(
        (p / "build-info.json").exists() for p in (tmp_path / "cache" / "builds").iterdir()
    )
    r = subprocess.run(
        [*FORGE, "build", "--accel", "nope"], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 2 and "unknown accel 'nope'" in r.stderr


def test_source_without_cmakelists_is_refused(tmp_path: Path) -> None:
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    (tmp_path / "src").mkdir()
    with pytest.raises(SourceError, match=r"not a llama\.cpp source tree"):
        build_llama_server(settings, accel="cpu", source=tmp_path / "src")


def test_failed_build_reports_the_log_and_installs_nothing(tmp_path: Path) -> None:
    """A real cmake run on a tree whose configure fails: clear error, log tail, cache unchanged."""
    src = tmp_path / "src"
    (src / "tools" / "server").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.14)\nproject(x C)\nmessage(FATAL_ERROR "broken on purpose")\n'
    )
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    with pytest.raises(BuildError) as info:
        build_llama_server(settings, accel="cpu", source=src)
    err = info.value
    assert "configure failed" in err.message
    assert any("broken on purpose" in line for line in err.log_tail)
    assert err.log_path and Path(err.log_path).is_file()
    builds = settings.builds_dir
    assert not [p for p in builds.iterdir() if (p / "build-info.json").exists()]
    assert not [p for p in builds.iterdir() if p.name.startswith(".staging")]


def test_sdist_hash_mismatch_is_a_hard_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection at the download boundary: the index serves a different archive."""
    fake = tmp_path / "llama_cpp_python-0.3.35.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        info = tarfile.TarInfo("llama_cpp_python-0.3.35/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    def download(dest: Path, *_: object) -> Path:
        target = dest / fake.name
        target.write_bytes(fake.read_bytes())
        return target

    monkeypatch.setattr(source_module, "_download_sdist", download)
    monkeypatch.setattr(source_module, "repo_root", lambda: None)  # as if the submodule were empty
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    with pytest.raises(SourceError, match="expected 1139dbb5"):
        source_module.resolve_source(settings)
    src_dir = settings.cache_dir / "src"
    assert [p.name for p in src_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_version_is_parsed_and_cache_is_hit(llama_server_bin: Path, forge_settings: ForgeSettings) -> None:
    info = probe_binary(llama_server_bin)
    assert info.version == "0.1.0-dev"
    assert info.commit == LLAMA_CPP_COMMIT[:7]
    assert "cpu" in info.accels
    if forge_settings.llama_server is None:  # the cached build `make setup` made: a second build is a no-op
        result = build_llama_server(forge_settings)
        assert result.cached
        assert result.info.path == llama_server_bin


def test_locate_order(llama_server_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llama-server").symlink_to(llama_server_bin)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FORGE_LLAMA_SERVER", raising=False)
    empty_cache = ForgeSettings(cache_dir=tmp_path / "empty")
    # No setting, empty cache: PATH.
    assert locate_llama_server(empty_cache).source == "path"
    # A finished build for the pinned commit in the cache wins over PATH.
    cached = ForgeSettings(cache_dir=tmp_path / "cache")
    entry = cached.builds_dir / cache_key(LLAMA_CPP_COMMIT, "cpu", ())
    (entry / "bin").mkdir(parents=True)
    (entry / "bin" / "llama-server").symlink_to(llama_server_bin)
    assert locate_llama_server(cached).source == "path"  # unfinished: no build-info.json yet
    (entry / "build-info.json").write_text(f'{{"commit": "{LLAMA_CPP_COMMIT}", "backend": "cpu"}}')
    found = locate_llama_server(cached)
    assert found.source == "cache" and found.build_accel == "cpu"
    # A setting wins over everything, and is never silently replaced when broken.
    explicit = ForgeSettings(cache_dir=tmp_path / "empty", llama_server=llama_server_bin)
    assert locate_llama_server(explicit).source == "setting"
    broken = tmp_path / "not-a-server"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(BinaryNotFound, match="did not answer --version"):
        locate_llama_server(ForgeSettings(cache_dir=tmp_path / "empty", llama_server=broken))
    # Nothing at all: a clear error with the fix.
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BinaryNotFound, match="forge build"):
        locate_llama_server(empty_cache)


def test_print_path_reports_the_binary(llama_server_bin: Path) -> None:
    env = dict(os.environ, FORGE_LLAMA_SERVER=str(llama_server_bin))
    r = subprocess.run(
        [*FORGE, "build", "--print-path"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(llama_server_bin)
    assert "commit 4df29be" in r.stderr and "accels: cpu" in r.stderr


def test_rpc_plan_builds_both_binaries_under_their_own_key() -> None:
    plan = make_plan(
        accel="cpu",
        source=Path("/s"),
        build_dir=Path("/b"),
        commit=LLAMA_CPP_COMMIT,
        jobs=2,
        which=_which("cmake", "c++", "ninja"),
        rpc=True,
    )
    assert plan.configure[-1] == "-DGGML_RPC=ON"
    assert plan.build == [
        "cmake", "--build", "/b", "--config", "Release", "--target", "llama-server", "ggml-rpc-server", "-j", "2",
    ]  # fmt: skip
    assert cache_key(LLAMA_CPP_COMMIT, "cpu", (), rpc=True) == "4df29be4f4c3-cpu-rpc"
    assert cache_key(LLAMA_CPP_COMMIT, "cpu", ()) == "4df29be4f4c3-cpu"  # a plain build stays valid


def test_rpc_build_is_located(rpc_server_bin: Path, rpc_llama_server_bin: Path) -> None:
    assert rpc_server_bin.name == "ggml-rpc-server"
    assert rpc_server_bin.parent == rpc_llama_server_bin.parent  # one build, one tree
    proc = subprocess.run(
        [*FORGE, "build", "--rpc", "--print-path"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(rpc_llama_server_bin)
    assert f"rpc worker: {rpc_server_bin}" in proc.stderr
