"""The one recipe's steps (:mod:`rocmforge_supervisor.binaries._recipe`) on a fake build.

A fake, named as one: ``cmake`` here is a shell script on PATH that "compiles" by writing a tiny
shell-script binary into the work tree (a real compile of llama.cpp or whisper.cpp takes minutes),
and the recipe's self-test runs that binary. Everything else is real: the lock, the staging
directory, the one ``rename``, build-info.json, the locate order over a real cache directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import BinaryNotFound, SelfTestFailed
from rocmforge_supervisor._version import WHISPER_CPP_COMMIT
from rocmforge_supervisor.binaries import RECIPES, locate_whisper_server
from rocmforge_supervisor.binaries._plan import BuildPlan, isa_fingerprint
from rocmforge_supervisor.binaries._recipe import WHISPER, Job, Proof, Recipe, build, install_build
from rocmforge_supervisor.binaries._source import SourceTree
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import cpu_flags

FAKE_CMAKE = """#!/bin/sh
# A fake cmake: counts its runs; `--build DIR` writes DIR/bin/$FAKE_PROGRAM, a shell script.
echo "$*" >> "$FAKE_CMAKE_RUNS"
if [ "$1" = "--build" ]; then
    mkdir -p "$2/bin"
    printf '#!/bin/sh\\necho "%s %s"\\n' "$FAKE_PROGRAM" "$FAKE_SAYS" > "$2/bin/$FAKE_PROGRAM"
    chmod +x "$2/bin/$FAKE_PROGRAM"
    echo "[1/1] Linking CXX executable bin/$FAKE_PROGRAM"
fi
"""


def _runs_and_says(binary: Path, settings: ForgeSettings, source: Path) -> Proof:
    """The fake recipe's self-test: the built script runs and says "serves"."""
    import subprocess

    out = subprocess.run([binary], capture_output=True, text=True, timeout=30).stdout.strip()
    ok = out.endswith("serves")
    return Proof(ok, "said " + out if ok else f"said {out!r} instead of serving", {"selftest": out})


FAKE = dataclasses.replace(WHISPER, key_prefix="fake-", selftest=_runs_and_says)
HERE = isa_fingerprint(cpu_flags())


@pytest.fixture
def toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake cmake first on PATH; returns the file that records its runs."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "cmake").write_text(FAKE_CMAKE)
    (tools / "cmake").chmod(0o755)
    runs = tmp_path / "cmake-runs"
    runs.touch()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CMAKE_RUNS", str(runs))
    monkeypatch.setenv("FAKE_PROGRAM", FAKE.program)
    monkeypatch.setenv("FAKE_SAYS", "serves")
    return runs


def _build(
    settings: ForgeSettings, key: str, recipe: Recipe = FAKE, force: bool = False
) -> tuple[Path, bool]:
    tree = SourceTree(settings.cache_dir / "src", recipe.commit, "sdist")

    def install(work: Path, plan: BuildPlan) -> Path:
        install_build(recipe, settings, builds=settings.builds_dir, key=key, work=work, plan=plan, tree=tree)
        return settings.builds_dir / key / "bin" / recipe.program

    def cached(final: Path) -> Path | None:
        binary = final / "bin" / recipe.program
        return binary if (final / "build-info.json").is_file() else None

    job = Job("cpu", (), jobs=1, progress=None, force=force)
    return build(recipe, settings, job, key=key, tree=tree, cached=cached, install=install)


def test_both_programs_are_table_entries() -> None:
    assert set(RECIPES) == {"llama-server", "whisper-server"}
    assert RECIPES["whisper-server"].key_prefix == "whisper-" and RECIPES["llama-server"].key_prefix == ""
    assert RECIPES["whisper-server"].env_var == "FORGE_WHISPER_SERVER"
    assert RECIPES["llama-server"].env_var == "FORGE_LLAMA_SERVER"


def test_a_build_is_proven_installed_and_then_a_cache_hit(tmp_path: Path, toolchain: Path) -> None:
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    key = f"fake-abc-cpu-{HERE}"
    binary, cached = _build(settings, key)
    assert not cached and binary == settings.builds_dir / key / "bin" / "whisper-server"
    meta = json.loads((settings.builds_dir / key / "build-info.json").read_text())
    assert meta["program"] == "whisper-server" and meta["backend"] == "cpu" and meta["cpu"] == HERE
    assert meta["selftest"] == "whisper-server serves"  # the recipe's own record of its proof
    assert len(toolchain.read_text().splitlines()) == 2  # configure and build
    assert sorted(p.name for p in settings.builds_dir.iterdir()) == [".work", key, f"{key}.lock"]

    again, cached = _build(settings, key)
    assert cached and again == binary
    assert len(toolchain.read_text().splitlines()) == 2, "a cache hit ran cmake"


def test_leftovers_of_a_killed_forge_are_removed_under_the_lock(tmp_path: Path, toolchain: Path) -> None:
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    key = f"fake-abc-cpu-{HERE}"
    other = f"fake-def-cpu-{HERE}"
    for name in (f".staging-{key}-x1", f".old-{key}-x2", f".staging-{other}-x3"):
        (settings.builds_dir / name / "bin").mkdir(parents=True)
    _build(settings, key)
    left = sorted(p.name for p in settings.builds_dir.iterdir())
    # This key's leftovers are gone; another key's (maybe a build in progress) are not touched.
    assert left == [f".staging-{other}-x3", ".work", key, f"{key}.lock"]


def test_a_failed_selftest_leaves_no_cache_entry(
    tmp_path: Path, toolchain: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SAYS", "crashes")
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    key = f"fake-abc-cpu-{HERE}"
    with pytest.raises(SelfTestFailed) as err:
        _build(settings, key)
    assert "the new whisper-server failed its self-test: said 'whisper-server crashes'" in err.value.message
    assert "nothing was installed" in (err.value.hint or "")
    assert sorted(p.name for p in settings.builds_dir.iterdir()) == [".work", f"{key}.lock"]

    # Self-tests off (FORGE_SELFTEST=0): installed, and build-info.json says it was not proven.
    untested = ForgeSettings(cache_dir=tmp_path / "cache", selftest=False)
    _build(untested, key)
    meta = json.loads((untested.builds_dir / key / "build-info.json").read_text())
    assert meta["selftest"] == "self-test skipped (FORGE_SELFTEST=0)"


def test_a_missing_binary_after_the_build_is_a_build_error(tmp_path: Path, toolchain: Path) -> None:
    from rocmforge_supervisor._errors import BuildError

    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    missing = dataclasses.replace(FAKE, program="llama-server")  # the fake cmake writes whisper-server
    with pytest.raises(BuildError, match=r"the build finished but .*/bin/llama-server is missing"):
        _build(settings, f"fake-abc-cpu-{HERE}", recipe=missing)


def _entry(settings: ForgeSettings, name: str, **meta: object) -> Path:
    binary = settings.builds_dir / name / "bin" / "whisper-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    (binary.parent.parent / "build-info.json").write_text(json.dumps({"commit": WHISPER_CPP_COMMIT, **meta}))
    return binary


def test_locate_prefers_a_gpu_build_and_ignores_another_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.delenv("FORGE_WHISPER_SERVER", raising=False)
    settings = ForgeSettings(cache_dir=tmp_path / "cache")
    elsewhere = _entry(settings, "whisper-f24588a272ae-cuda-n00000000", backend="cuda", cpu="n00000000")
    with pytest.raises(BinaryNotFound) as err:
        locate_whisper_server(settings)
    assert f"{elsewhere}: built for another CPU (n00000000, this one is {HERE})" in err.value.message
    assert "forge build --whisper" in (err.value.hint or "")

    cpu = _entry(settings, f"whisper-f24588a272ae-cpu-{HERE}", backend="cpu", cpu=HERE)
    _entry(settings, f"whisper-0000000000aa-hip-{HERE}", backend="hip", cpu=HERE, commit="0000000000aa")
    assert locate_whisper_server(settings) == cpu  # another commit's GPU build is not this one
    hip = _entry(settings, f"whisper-f24588a272ae-hip-gfx1100-{HERE}", backend="hip", cpu=HERE)
    assert locate_whisper_server(settings) == hip  # GPU builds first
    (hip.parent.parent / "build-info.json").unlink()
    assert locate_whisper_server(settings) == cpu  # an unfinished entry is never handed out

    explicit = ForgeSettings(cache_dir=tmp_path / "cache", whisper_server=tmp_path / "nope")
    with pytest.raises(BinaryNotFound, match=r"FORGE_WHISPER_SERVER=.*/nope is not an executable file"):
        locate_whisper_server(explicit)  # an explicit choice is never replaced by the cache's
