"""The ``forge serve`` config file: ``forge.toml``, overridden by ``FORGE_*`` variables.

Where it comes from, first found wins: ``--config FILE`` (must exist), then
``<config_home>/forge.toml`` (``$XDG_CONFIG_HOME/rocmforge``), then ``/etc/rocmforge/forge.toml``;
none at all is an empty config with every default. On top of the file, ``FORGE_<SECTION>__<KEY>``
variables win (``FORGE_SERVER__PORT=9000``, ``FORGE_MODELS__GEMMA__CTX_SIZE=8192``; lists as JSON;
variable names are case-insensitive, so a model named there is lower-cased), and ``FORGE_API_KEY``
sets ``server.api_key`` so the secret can stay out of the file.

Typos must not pass silently: unknown sections and keys are errors, and every error names the dotted
key (``models.gemma.ctx_size``) and where to fix it (the file, or the variable that set it).

A ``conf.d/`` directory beside the file adds its ``*.toml`` files, merged in name order: tables
merge, and a key set by two files is an error naming both. Each file's relative paths are taken
relative to its own directory.

Relative paths in the file (``state_dir``, ``log_dir``, ``tls_cert``/``tls_key``, ``model_dirs``, a
model ``path`` that looks like a path) are taken relative to the file's directory, so that a unit
started from ``/`` reads the same config as a shell in the file's directory.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsError

from .._errors import ConfigError
from ._explain import CONFIG_NAME, fix_hint, translate, where
from ._names import MODEL_NAME
from ._schema import ForgeConfig, known_keys
from ._settings import ForgeSettings

__all__ = ["CONFIG_NAME", "CONF_D", "SYSTEM_CONFIG_DIR", "config_files", "config_search_path", "load_config"]

SYSTEM_CONFIG_DIR = Path("/etc/rocmforge")

# -- loading ---------------------------------------------------------------------------------------


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' env source over a given mapping (tests and reloads pass their own)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._mapping = dict(env)
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self.case_sensitive:
            return dict(self._mapping)
        return {k.lower(): v for k, v in self._mapping.items()}


def config_search_path(settings: ForgeSettings, *, system_dir: Path = SYSTEM_CONFIG_DIR) -> list[Path]:
    """Where a config file is looked for when no ``--config`` is given, in order."""
    return [settings.config_home / CONFIG_NAME, system_dir / CONFIG_NAME]


def load_config(
    path: Path | None,
    settings: ForgeSettings,
    *,
    env: Mapping[str, str] | None = None,
    system_dir: Path = SYSTEM_CONFIG_DIR,
) -> ForgeConfig:
    """Read, merge and validate the config. Every problem is a :class:`ConfigError` naming its key.

    ``env`` defaults to the process environment (read here, the one place the config reads it).
    """
    if env is None:
        env = os.environ
    source = _find_file(path, settings, system_dir)
    file_data: dict[str, Any] = {}
    origins: dict[tuple[str, ...], Path] = {}
    for part in config_files(source):
        data = _resolve_relative(_read_toml(part), part.parent)
        file_data = _merge_file(file_data, data, part, origins)
    env_data, env_keys = _env_layer(env)
    merged = _merge(file_data, env_data)
    _check_model_names(merged, source, env_keys)
    try:
        config = ForgeConfig(**merged)
    except ValidationError as exc:
        error = translate(exc, (), source=source, env_keys=env_keys, known_keys=known_keys)
        # A key a conf.d file set: the error names that file.
        key = tuple((error.key or "").split("."))
        setter = next((origins[key[:i]] for i in range(len(key), 0, -1) if key[:i] in origins), source)
        if setter != source:
            error = translate(exc, (), source=setter, env_keys=env_keys, known_keys=known_keys)
        raise error from exc
    config._source = source
    config._settings = settings
    return config


#: The directory beside the config file whose ``*.toml`` files are merged into it, in name order.
CONF_D = "conf.d"


def config_files(source: Path | None) -> list[Path]:
    """The files a config is read from: the file, then ``conf.d/*.toml`` beside it (name order).
    What ``[server] watch_config`` watches."""
    if source is None:
        return []
    conf_d = source.parent / CONF_D
    parts = sorted(p for p in conf_d.glob("*.toml") if p.is_file()) if conf_d.is_dir() else []
    return [source, *parts]


def _merge_file(
    base: dict[str, Any],
    over: Mapping[str, Any],
    part: Path,
    origins: dict[tuple[str, ...], Path],
    at: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``over`` (from file ``part``) merged into ``base``: tables merge, and a key that two files
    set is an error naming both (which one wins would depend on file names: never silently)."""
    out = dict(base)
    for key, value in over.items():
        here = (*at, key)
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge_file(out[key], value, part, origins, here)
            continue
        if key in out:
            first = origins.get(here)
            raise ConfigError(
                f"config {part}: {'.'.join(here)} is set in both {first} and {part}",
                key=".".join(here),
                hint="set it in one of the two files only",
            )
        out[key] = value
        _record(origins, here, value, part)
    return out


def _record(origins: dict[tuple[str, ...], Path], at: tuple[str, ...], value: Any, part: Path) -> None:
    """``at`` and, for a whole table, every key under it came from file ``part``."""
    origins[at] = part
    if isinstance(value, Mapping):
        for key, sub in value.items():
            _record(origins, (*at, key), sub, part)


def _find_file(path: Path | None, settings: ForgeSettings, system_dir: Path) -> Path | None:
    if path is not None:
        path = path.expanduser()
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise ConfigError(
                f"config file {path} {what}",
                hint="pass an existing TOML file to --config (an empty file is a valid config)",
            )
        return path.absolute()
    for candidate in config_search_path(settings, system_dir=system_dir):
        if candidate.is_file():
            return candidate.absolute()
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message carries "(at line L, column C)".
        raise ConfigError(f"config {path}: invalid TOML: {exc}", hint=f"fix the syntax in {path}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {path}: not UTF-8 text ({exc.reason})", hint="save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(
            f"config {path} cannot be read: {exc.strerror or exc}", hint="check the file's permissions"
        ) from exc


def _resolve_relative(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative paths in the file mean "next to the file"; ``~`` means the home directory."""

    def fix(value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        p = Path(value).expanduser()
        return str(p if p.is_absolute() else base / p)

    def looks_like_path(ref: Any) -> bool:
        return (
            isinstance(ref, str)
            and not ref.startswith("hf:")
            and "://" not in ref
            and (ref.startswith(("~", ".")) or "/" in ref or ref.endswith(".gguf"))
        )

    server = data.get("server")
    if isinstance(server, dict):
        server = dict(server)
        for key in ("state_dir", "log_dir", "tls_cert", "tls_key"):
            if key in server:
                server[key] = fix(server[key])
        if isinstance(server.get("model_dirs"), list):
            server["model_dirs"] = [fix(v) for v in server["model_dirs"]]
        data = {**data, "server": server}
    models = data.get("models")
    if isinstance(models, dict):
        fixed: dict[str, Any] = {}
        for name, model in models.items():
            # A command's path is what its ${MODEL} stands for, passed as written (a hub id
            # "org/repo" is no file): only ./, ../ and ~ are read as next to the file there.
            command = isinstance(model, dict) and model.get("backend") == "command"
            if (
                isinstance(model, dict)
                and looks_like_path(model.get("path"))
                and (not command or str(model["path"]).startswith(("~", ".")))
            ):
                model = {**model, "path": fix(model["path"])}
            if (
                isinstance(model, dict)
                and model.get("mmproj") != "auto"
                and looks_like_path(model.get("mmproj"))
            ):
                model = {**model, "mmproj": fix(model["mmproj"])}
            fixed[name] = model
        data = {**data, "models": fixed}
    return data


def _env_layer(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``FORGE_*`` overrides as nested data, and ``{lowercased var name: var name}``."""
    names = {k.lower(): k for k in env if k.upper().startswith("FORGE_")}
    try:
        data = _MappingEnvSource(ForgeConfig, env)()
    except SettingsError as exc:
        var = _bad_json_var(env)
        if var is None:
            raise ConfigError(f"config: a FORGE_* variable cannot be read: {exc}") from exc
        key = ".".join(var.lower().removeprefix("forge_").split("__"))
        raise ConfigError(
            f"config {var}: {key}: not valid JSON ({env[var]!r})",
            key=key,
            hint=f'write lists and tables as JSON in {var}, e.g. \'["a", "b"]\'',
        ) from exc
    api_key = env.get("FORGE_API_KEY")
    if api_key and "forge_server__api_key" not in names:
        server = data.get("server")
        data["server"] = {**(server if isinstance(server, dict) else {}), "api_key": api_key}
    return data, names


#: Values pydantic-settings decodes as JSON when they come from one variable: lists, and whole sections.
_JSON_VARS = re.compile(
    r"forge_(server|supervisor|models|server__(cors_origins|model_dirs)|models__(?:(?!__).)+(__args)?)",
    re.IGNORECASE,
)


def _bad_json_var(env: Mapping[str, str]) -> str | None:
    for name, value in env.items():
        if _JSON_VARS.fullmatch(name):
            try:
                json.loads(value)
            except ValueError:
                return name
    return None


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _check_model_names(data: Mapping[str, Any], source: Path | None, env_keys: Mapping[str, str]) -> None:
    models = data.get("models")
    if not isinstance(models, dict):
        return
    for name in models:
        if not MODEL_NAME.fullmatch(name):
            key = f"models.{name}"
            raise ConfigError(
                f"{where(source, env_keys, ('models', name))}: {key}: model name {name!r} may only use "
                "letters, digits, '.', '_' and '-'",
                key=key,
                hint=fix_hint(source, env_keys, ("models", name), "rename the section"),
            )
