"""``forge service …``: run ``forge serve`` under systemd (and, later, the service's own commands)."""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .._errors import ServiceError, UsageError
from ._common import console, err_console, get_settings

if TYPE_CHECKING:
    from ..config import ForgeSettings

__all__ = ["register", "render_unit", "render_worker_unit", "service_app", "systemd_quote"]

service_app = typer.Typer(
    name="service",
    help="Install forge serve as a systemd service.",
    no_args_is_help=True,
)

SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
SYSTEM_CONFIG = Path("/etc/rocmforge/forge.toml")
_SYSTEM_ONLY = "#system: "
_TEMPLATE_NOTE = "#template:"


def systemd_quote(arg: str) -> str:
    """One ExecStart= word, quoted the way systemd.service(5) parses it.

    ``%`` starts a specifier and ``$`` an environment expansion, so both are doubled; whitespace,
    quotes and backslashes need a double-quoted word with C-style escapes.
    """
    word = arg.replace("%", "%%").replace("$", "$$")
    if word and not any(c.isspace() or c in "\"'\\;" for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(forge: Path, config: Path, *, user: bool = False, hf_cache: Path | None = None) -> str:
    """The unit text for this install. ``user``: a ``systemctl --user`` unit.

    A per-user service manager cannot set groups, device policy or mount namespaces (without
    PrivateUsers=), so the template's ``#system:`` lines only go into a system unit. A user unit
    uses ``hf_cache`` (the installing CLI's Hugging Face cache, so that a model pulled by hand is
    not downloaded again by the service); a system unit keeps its own under its CacheDirectory.
    """
    hf_env = (
        systemd_quote(f"FORGE_HF_CACHE_DIR={hf_cache}")
        if user and hf_cache is not None
        else "FORGE_HF_CACHE_DIR=%C/rocmforge/huggingface"
    )
    return _render(
        "forge.service",
        user,
        forge=systemd_quote(str(forge)),
        config=systemd_quote(str(config)),
        hf_cache=hf_env,
    )


def render_worker_unit(forge: Path, args: list[str], *, user: bool = False) -> str:
    """The unit of ``forge worker ARGS`` (llama.cpp RPC workers)."""
    return _render(
        "forge-worker.service",
        user,
        forge=systemd_quote(str(forge)),
        args="".join(" " + systemd_quote(a) for a in args),
    )


def _render(template_name: str, user: bool, **fields: str) -> str:
    # Through the top package: naming the service package would import the whole gateway.
    template = resources.files("rocmforge_supervisor").joinpath("service", template_name).read_text()
    lines = []
    for line in template.splitlines():
        if line.startswith(_TEMPLATE_NOTE):
            continue
        if line.startswith(_SYSTEM_ONLY):
            if user:
                continue
            line = line[len(_SYSTEM_ONLY) :]
        lines.append(line)
    wanted_by = "default.target" if user else "multi-user.target"
    return "\n".join(lines).format(wanted_by=wanted_by, **fields) + "\n"


def _forge_executable() -> Path:
    """The ``forge`` that is running now: the unit must start this install, not another one."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "forge" and argv0.is_file():
        return argv0.resolve()
    beside = Path(sys.executable).parent / "forge"  # the venv's (or prefix's) own script
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside.absolute()
    found = shutil.which("forge")
    if found:
        return Path(found).resolve()
    raise UsageError(
        "cannot find the forge executable to put in ExecStart=",
        hint="run this command through the installed `forge` script, or put it on PATH",
    )


def _write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory + rename: systemd never reads a half-written unit."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except PermissionError as exc:
        raise ServiceError(
            f"cannot write {path}: permission denied",
            hint="run it with sudo, or install a user unit with --user, or pass --output / --print",
        ) from exc
    except OSError as exc:
        raise ServiceError(f"cannot write {path}: {exc.strerror or exc}") from exc
    tmp_path = Path(tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        tmp_path.chmod(0o644)
        tmp_path.replace(path)
    except OSError as exc:
        tmp_path.unlink(missing_ok=True)
        raise ServiceError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _default_config(user: bool, settings: ForgeSettings) -> Path:
    return settings.config_home / "forge.toml" if user else SYSTEM_CONFIG


@service_app.command("install")
def install(
    user: bool = typer.Option(False, "--user", help="A per-user unit (systemctl --user)."),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="The config the service reads (default /etc/rocmforge/forge.toml, or with --user "
        "$XDG_CONFIG_HOME/rocmforge/forge.toml).",
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the unit here instead."),
    print_only: bool = typer.Option(False, "--print", help="Print the unit on stdout; write nothing."),
    worker: bool = typer.Option(
        False, "--worker", help="The unit of `forge worker` (RPC workers) instead: forge-worker.service."
    ),
    worker_args: str = typer.Option(
        "", "--worker-args", help="With --worker: its arguments, e.g. '--host 10.0.0.2 --allow-network'."
    ),
) -> None:
    """Write a systemd unit that runs `forge serve` (or, with --worker, `forge worker`) from this install."""
    settings = get_settings()
    config_path = (config.expanduser() if config else _default_config(user, settings)).absolute()
    if worker:
        unit = render_worker_unit(_forge_executable(), shlex.split(worker_args), user=user)
    else:
        unit = render_unit(_forge_executable(), config_path, user=user, hf_cache=_hf_cache(settings))
    unit_name = "forge-worker.service" if worker else "forge.service"
    if print_only:
        sys.stdout.write(unit)
        return
    if output is None:
        _require_systemd(user)
    if output is not None:
        target = output.expanduser().absolute()
    elif user:
        target = _user_unit_dir() / unit_name
    else:
        target = SYSTEM_UNIT_DIR / unit_name
    _write_atomically(target, unit)
    console.print(f"wrote {target}", markup=False)
    if not worker and not config_path.is_file():
        err_console.print(
            f"note: {config_path} does not exist yet; the service will not start until it does "
            "(an empty file is a valid config: every default, no preloaded models)",
            markup=False,
        )
    name = target.stem if target.suffix == ".service" else target.name
    systemctl = "systemctl --user" if user else "systemctl"
    if output is not None and target.parent not in (SYSTEM_UNIT_DIR, _user_unit_dir()):
        where = "~/.config/systemd/user/" if user else f"{SYSTEM_UNIT_DIR}/"
        console.print(f"next: copy it to {where}, then:", markup=False)
    else:
        console.print("next:")
    console.print(f"  {systemctl} daemon-reload && {systemctl} enable --now {name}", markup=False)
    if user:
        console.print(
            f"  loginctl enable-linger {_login_name()}   # keep it running after you log out", markup=False
        )


#: sd_booted(3): the system runs systemd iff this directory exists.
SYSTEMD_RUNTIME = Path("/run/systemd/system")


def _require_systemd(user: bool) -> None:
    """Refuse to install a unit that nothing would ever start, and say why."""
    if not SYSTEMD_RUNTIME.is_dir():
        raise ServiceError(
            "this machine does not run systemd (no /run/systemd/system): a unit would never start",
            hint="run `forge serve --config <forge.toml>` under your own init or supervisor, "
            "or write the unit anyway with --output FILE / --print",
        )
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if user and not (runtime and (Path(runtime) / "systemd").is_dir()):
        raise ServiceError(
            "there is no systemd user manager in this session (XDG_RUNTIME_DIR/systemd is missing), "
            "so `systemctl --user` cannot reach it",
            hint=f"log in with a full session (or, as root: loginctl enable-linger {_login_name()}), "
            "or install a system unit with sudo forge service install",
        )


def _hf_cache(settings: ForgeSettings) -> Path:
    """The Hugging Face cache this CLI uses (``forge pull`` fills it)."""
    from huggingface_hub import constants

    return settings.hf_cache_dir or Path(constants.HF_HUB_CACHE)


def _user_unit_dir() -> Path:
    return Path.home() / ".config" / "systemd" / "user"


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "$USER"


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
    app.add_typer(service_app, name="service")
