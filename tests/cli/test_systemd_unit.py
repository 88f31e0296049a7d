"""The systemd unit: systemd itself accepts what we render, and ``forge service install`` writes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocmforge_supervisor.cli._service import render_unit, systemd_quote

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
FORGE = Path(sys.executable).parent / "forge"
needs_forge = pytest.mark.skipif(not FORGE.is_file(), reason=f"no installed forge script at {FORGE}")


def verify(unit: Path, *, user: bool = False, runtime_dir: Path | None = None) -> list[str]:
    """``systemd-analyze verify``; returns its complaints about ``unit`` (it exits 0 on mere warnings)."""
    assert SYSTEMD_ANALYZE is not None
    env = dict(os.environ)
    if runtime_dir is not None:
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    cmd = [SYSTEMD_ANALYZE, *(["--user"] if user else []), "verify", str(unit)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=False)
    out = proc.stdout + proc.stderr
    if user and "Failed to initialize manager" in out:
        pytest.skip(f"no user manager can be simulated here: {out.strip()}")
    complaints = [line for line in out.splitlines() if unit.name in line or str(unit) in line]
    if proc.returncode != 0:
        complaints.append(f"exit {proc.returncode}: {out.strip()}")
    return complaints


def unit_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@needs_analyze
@needs_forge
def test_systemd_accepts_the_system_unit(tmp_path: Path) -> None:
    unit = tmp_path / "forge.service"
    unit.write_text(render_unit(FORGE, tmp_path / "forge.toml"))
    assert verify(unit) == []


@needs_analyze
@needs_forge
def test_systemd_accepts_the_user_unit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    unit = tmp_path / "forge.service"
    unit.write_text(render_unit(FORGE, tmp_path / "forge.toml", user=True))
    assert verify(unit, user=True, runtime_dir=run) == []


@needs_analyze
@needs_forge
def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a typo or a missing binary is reported."""
    good = render_unit(FORGE, tmp_path / "forge.toml")
    typo = tmp_path / "typo.service"
    typo.write_text(good.replace("KillMode=mixed", "KillMode=mixd"))
    assert verify(typo)
    missing = tmp_path / "missing.service"
    missing.write_text(render_unit(tmp_path / "no-such-forge", tmp_path / "forge.toml"))
    assert verify(missing)


@needs_analyze
@needs_forge
def test_paths_with_spaces_and_specifiers_survive(tmp_path: Path) -> None:
    odd = tmp_path / "my tools %n"
    odd.mkdir()
    (odd / "forge").symlink_to(FORGE)
    unit = tmp_path / "forge.service"
    text = render_unit(odd / "forge", tmp_path / "cfg $HOME" / "forge.toml")
    unit.write_text(text)
    assert (
        f'ExecStart="{tmp_path}/my tools %%n/forge" serve --config "{tmp_path}/cfg $$HOME/forge.toml"' in text
    )
    assert verify(unit) == []


def test_systemd_quote() -> None:
    assert systemd_quote("/usr/bin/forge") == "/usr/bin/forge"
    assert systemd_quote("/a b") == '"/a b"'
    assert systemd_quote('/a"b') == '"/a\\"b"'
    assert systemd_quote("/a\\b") == '"/a\\\\b"'
    assert systemd_quote("50%") == "50%%"
    assert systemd_quote("$X") == "$$X"


def test_system_unit_has_the_required_settings(tmp_path: Path) -> None:
    text = render_unit(Path("/opt/forge/bin/forge"), Path("/etc/rocmforge/forge.toml"))
    lines = unit_lines(text)
    for want in [
        "Type=notify",
        "ExecStart=/opt/forge/bin/forge serve --config /etc/rocmforge/forge.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "WatchdogSec=30",
        "Restart=on-failure",
        "RestartSec=2",
        "KillMode=mixed",
        "TimeoutStopSec=30",
        "NotifyAccess=main",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "StateDirectory=rocmforge",
        "CacheDirectory=rocmforge",
        "LogsDirectory=rocmforge",
        "ConfigurationDirectory=rocmforge",
        "SupplementaryGroups=render video",
        "DevicePolicy=closed",
        "DeviceAllow=char-kfd rw",
        "DeviceAllow=char-drm rw",
        "DeviceAllow=char-nvidia* rw",
        "WantedBy=multi-user.target",
    ]:
        assert want in lines, want
    env = next(line for line in lines if line.startswith("Environment="))
    assert "FORGE_CACHE_DIR=%C/rocmforge" in env and "FORGE_STATE_DIR=%S/rocmforge" in env
    assert "{" not in text and "#system" not in text and "#template" not in text


def test_user_unit_leaves_out_what_a_user_manager_cannot_do() -> None:
    lines = unit_lines(
        render_unit(Path("/opt/forge"), Path("/home/u/.config/rocmforge/forge.toml"), user=True)
    )
    assert "WantedBy=default.target" in lines
    assert "Type=notify" in lines and "NoNewPrivileges=yes" in lines
    for absent in ("SupplementaryGroups", "DevicePolicy", "DeviceAllow", "ProtectSystem", "modprobe@"):
        assert not any(absent in line for line in lines), absent


# -- forge service install (the real installed script) --------------------------------------------


def forge(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORGE_", "XDG_"))}
    env |= {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [str(FORGE), "service", "install", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@needs_forge
def test_install_writes_the_unit_atomically(tmp_path: Path) -> None:
    target = tmp_path / "units" / "forge.service"
    target.parent.mkdir()
    target.write_text("old contents\n")
    old_inode = target.stat().st_ino
    config = tmp_path / "forge.toml"
    config.write_text("")
    proc = forge("--output", str(target), "--config", str(config), home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = target.read_text()
    assert f"ExecStart={FORGE.resolve()} serve --config {config}" in text.splitlines()
    assert target.stat().st_ino != old_inode  # replaced by a rename, not rewritten in place
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in target.parent.iterdir()) == ["forge.service"]  # no temp file left
    assert "systemctl daemon-reload && systemctl enable --now forge" in proc.stdout
    assert "does not exist" not in proc.stderr


@needs_forge
def test_install_warns_when_the_config_is_missing(tmp_path: Path) -> None:
    proc = forge("--output", str(tmp_path / "f.service"), "--config", "rel/forge.toml", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "does not exist yet" in proc.stderr
    # A relative --config becomes absolute: the unit does not run from this directory.
    assert f"--config {Path.cwd() / 'rel' / 'forge.toml'}" in (tmp_path / "f.service").read_text()
    assert "systemctl enable --now f" in proc.stdout


@needs_forge
def test_print_only_prints(tmp_path: Path) -> None:
    proc = forge("--print", "--config", str(tmp_path / "forge.toml"), home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == render_unit(FORGE.resolve(), tmp_path / "forge.toml")
    assert list(tmp_path.iterdir()) == []


_SYSTEMD = Path("/run/systemd/system").is_dir() and bool(os.environ.get("XDG_RUNTIME_DIR"))


@needs_forge
@pytest.mark.skipif(Path("/run/systemd/system").is_dir(), reason="this machine runs systemd")
@pytest.mark.parametrize("user", [True, False])
def test_install_without_systemd_says_so(tmp_path: Path, user: bool) -> None:
    """A machine (container) without systemd: no unit that nothing would start, one line, exit 1;
    --output still writes one on purpose."""
    proc = forge(*(["--user"] if user else []), home=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: this machine does not run systemd"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / ".config" / "systemd").exists()
    out = forge(*(["--user"] if user else []), "--output", str(tmp_path / "f.service"), home=tmp_path)
    assert out.returncode == 0 and (tmp_path / "f.service").is_file(), out.stderr


def test_user_unit_uses_the_cli_hf_cache(tmp_path: Path) -> None:
    """One Hugging Face cache: a user unit's service finds what `forge pull` put there."""
    cache = tmp_path / "hf cache%"
    env_line = next(
        line
        for line in unit_lines(render_unit(FORGE, tmp_path / "forge.toml", user=True, hf_cache=cache))
        if "FORGE_HF_CACHE_DIR" in line
    )
    assert env_line == f'Environment="FORGE_HF_CACHE_DIR={tmp_path}/hf cache%%"'
    system = unit_lines(render_unit(FORGE, tmp_path / "forge.toml", hf_cache=cache))
    assert "Environment=FORGE_HF_CACHE_DIR=%C/rocmforge/huggingface" in system


@needs_forge
def test_user_install_unit_names_the_cli_cache(tmp_path: Path) -> None:
    proc = forge("--user", "--print", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # huggingface-hub's default under this HOME: what `forge pull` run by this user fills
    assert f"Environment=FORGE_HF_CACHE_DIR={tmp_path}/.cache/huggingface/hub" in proc.stdout.splitlines()


@needs_forge
@pytest.mark.skipif(not _SYSTEMD, reason="needs a machine running systemd with a user manager")
def test_user_install_goes_to_the_user_unit_dir(tmp_path: Path) -> None:
    proc = forge("--user", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    unit = tmp_path / ".config" / "systemd" / "user" / "forge.service"
    lines = unit.read_text().splitlines()
    config = tmp_path / ".config" / "rocmforge" / "forge.toml"
    assert f"ExecStart={FORGE.resolve()} serve --config {config}" in lines
    assert "WantedBy=default.target" in lines
    assert "systemctl --user daemon-reload && systemctl --user enable --now forge" in proc.stdout


@needs_forge
def test_unwritable_target_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = forge("--output", str(blocker / "forge.service"), home=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: cannot write ")
    assert "Traceback" not in proc.stderr


@needs_analyze
@needs_forge
def test_systemd_accepts_the_worker_unit(tmp_path: Path) -> None:
    from rocmforge_supervisor.cli._service import render_worker_unit

    unit = tmp_path / "forge-worker.service"
    text = render_worker_unit(FORGE, ["--host", "10.0.0.2", "--allow-network"])
    unit.write_text(text)
    assert verify(unit) == []
    [exec_start] = [line for line in unit_lines(text) if line.startswith("ExecStart=")]
    assert exec_start == f"ExecStart={FORGE} worker --host 10.0.0.2 --allow-network"


@needs_forge
def test_install_worker_writes_its_own_unit(tmp_path: Path) -> None:
    out = tmp_path / "forge-worker.service"
    proc = subprocess.run(
        [str(FORGE), "service", "install", "--worker", "--worker-args", "--port 50060", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "worker --port 50060" in text and "serve" not in "".join(unit_lines(text))
