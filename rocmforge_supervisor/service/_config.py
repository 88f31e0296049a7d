"""The ``forge serve`` config file: ``forge.toml``, overridden by ``FORGE_*`` variables.

Where it comes from, first found wins: ``--config FILE`` (must exist), then
``<config_home>/forge.toml`` (``$XDG_CONFIG_HOME/rocmforge``), then ``/etc/rocmforge/forge.toml``;
none at all is an empty config with every default. On top of the file, ``FORGE_<SECTION>__<KEY>``
variables win (``FORGE_SERVER__PORT=9000``, ``FORGE_MODELS__GEMMA__CTX_SIZE=8192``; lists as JSON;
variable names are case-insensitive, so a model named there is lower-cased), and ``FORGE_API_KEY``
sets ``server.api_key`` so the secret can stay out of the file.

Typos must not pass silently: unknown sections and keys are errors, and every error names the dotted
key (``models.gemma.ctx_size``) and where to fix it (the file, or the variable that set it).

Relative paths in the file (``state_dir``, ``log_dir``, ``model_dirs``, a model ``path`` that looks
like a path) are taken relative to the file's directory, so that a unit started from ``/`` reads
the same config as a shell in the file's directory.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from .._errors import ConfigError
from ..settings import ForgeSettings, get_settings

__all__ = [
    "CONFIG_NAME",
    "SYSTEM_CONFIG_DIR",
    "ForgeConfig",
    "ModelConfig",
    "ServerConfig",
    "SupervisorConfig",
    "WorkerConfig",
    "config_search_path",
    "load_config",
]

CONFIG_NAME = "forge.toml"
SYSTEM_CONFIG_DIR = Path("/etc/rocmforge")

#: Model names become URL path parts, metric labels and log file names.
_MODEL_NAME = re.compile(r"[A-Za-z0-9._-]+")

#: llama-server flags forge sets itself (or that would turn the child into something else: another
#: model source, a router, TLS, a log format the supervisor cannot read). Long forms are compared
#: after llama.cpp's own ``--foo_bar`` → ``--foo-bar`` normalisation.
_OWNED_FLAGS = frozenset(
    {
        "-m", "--model", "-mu", "--model-url",
        "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo",
        "--host", "--port", "--reuse-port",
        "-a", "--alias",
        "--api-key", "--api-key-file",
        "--metrics", "--no-webui", "--webui", "--ui", "--no-ui",
        "--models-dir", "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload",
        "--ssl-key-file", "--ssl-cert-file",
        "-lv", "--verbosity",
    }
)  # fmt: skip
_OWNED_PREFIXES = ("--log-",)

_SECRET_KEYS = frozenset({"api_key"})
#: Our own error kinds: their messages already quote the value.
_CUSTOM_KINDS = frozenset(
    {"gpu_layers", "gpu", "owned_flag", "insecure_bind", "backoff_order", "worker_address"}
)
#: Errors raised by a section's model validator, and the key they are about.
_VALIDATOR_FIELD = {"insecure_bind": "host", "backoff_order": "restart_backoff_max"}


def _custom(kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error whose text is exactly ``message`` (no "Value error, " prefix).

    pydantic substitutes ``{name}`` only for names in ``ctx``, so braces in ``message`` are safe.
    """
    return PydanticCustomError(kind, message, ctx or None)


# -- field shapes ----------------------------------------------------------------------------------


def _gpu_layers(value: Any) -> Any:
    """One clear error instead of pydantic's one-per-union-member for ``int | "auto" | "all"``."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("auto", "all"):
            return v
        if v.isdigit():
            return int(v)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise _custom("gpu_layers", f"{value!r} is not a number of layers (>= 0), 'auto' or 'all'")


def _gpu(value: Any) -> Any:
    """``"auto"``, ``"cpu"``, an index or a list of indices; ``"0,1"`` from the environment too."""
    bad = _custom("gpu", f"{value!r} is not 'auto', 'cpu', a GPU index (0) or a list of indices ([0, 1])")
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("auto", "cpu"):
            return v
        parts = [p.strip() for p in v.replace(";", ",").split(",")]
        if not parts or not all(p.isdigit() for p in parts):
            raise bad
        ints = [int(p) for p in parts]
        return ints[0] if len(ints) == 1 else ints
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        if value < 0:
            raise bad
        return value
    if isinstance(value, list | tuple):
        if not value or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
            raise bad
        if len(set(value)) != len(value):
            raise _custom("gpu", f"{list(value)!r} names a GPU twice")
        return list(value)
    raise bad


GpuLayers = Annotated[int | Literal["auto", "all"] | None, BeforeValidator(_gpu_layers)]
GpuChoice = Annotated[int | list[int] | Literal["auto", "cpu"], BeforeValidator(_gpu)]


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Section):
    """``[server]``: the gateway's socket, auth, limits and where it keeps state and logs."""

    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8080, ge=0, le=65535)
    """0: pick a free port (``forge serve`` prints it)."""
    api_key: Annotated[SecretStr | None, BeforeValidator(_empty_is_none)] = None
    """Clients must send ``Authorization: Bearer <key>`` (or ``X-Api-Key``). Also ``FORGE_API_KEY``."""
    allow_unauthenticated: bool = False
    """Needed to bind a non-loopback host without an api_key: an explicit "yes, open to the network"."""
    cors_origins: list[str] = Field(default_factory=list)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    log_format: Literal["text", "json"] = "text"
    state_dir: Path | None = None
    """Default: ``ForgeSettings.state_dir``; see :attr:`ForgeConfig.state_dir`."""
    log_dir: Path | None = None
    """Default: ``<state_dir>/logs``; see :attr:`ForgeConfig.log_dir`."""
    model_dirs: list[Path] = Field(default_factory=list)
    """Directories a model may be loaded from by path through the API (nothing else is)."""
    load_wait: float = Field(default=30.0, ge=0)
    """Seconds a request waits for a loading model; then 503 + Retry-After + load progress."""
    sse_keepalive: float = Field(default=5.0, ge=0)
    """Seconds between ``: keep-alive`` comments while a stream waits for its first token; 0: off."""
    ollama_port: int | None = Field(default=None, ge=0, le=65535)
    """A second listener for Ollama clients, which look on 11434 (same routes, same auth)."""

    @property
    def is_loopback(self) -> bool:
        return _is_loopback(self.host)

    @model_validator(mode="after")
    def _refuse_open_bind(self) -> ServerConfig:
        # Checked here, not in the gateway, so that no path (file, env, a CLI override through
        # ForgeConfig.with_server) can start an open, unauthenticated server by accident.
        if not self.is_loopback and self.api_key is None and not self.allow_unauthenticated:
            raise _custom(
                "insecure_bind",
                f"host {self.host!r} is reachable from the network, and there is no api_key",
            )
        return self


class SupervisorConfig(_Section):
    """``[supervisor]``: restart policy, health checks and timeouts (seconds)."""

    restart_backoff_initial: float = Field(default=1.0, gt=0)
    restart_backoff_max: float = Field(default=60.0, gt=0)
    crash_loop_max: int = Field(default=5, ge=1)
    """This many crashes within ``crash_loop_window`` → the model is marked failed."""
    crash_loop_window: float = Field(default=300.0, gt=0)
    health_interval: float = Field(default=5.0, gt=0)
    """Seconds between ``/health`` checks of a ready child."""
    health_failures: int = Field(default=3, ge=1)
    """Consecutive failed checks → the child is hung: killed and restarted."""
    load_stall_timeout: float = Field(default=300.0, gt=0)
    load_deadline_base: float = Field(default=300.0, gt=0)
    """A load's deadline: this plus ``load_deadline_per_gib`` per GiB of model file."""
    load_deadline_per_gib: float = Field(default=20.0, ge=0)
    stop_timeout: float = Field(default=10.0, gt=0)
    drain_timeout: float = Field(default=30.0, ge=0)

    @model_validator(mode="after")
    def _backoff_order(self) -> SupervisorConfig:
        if self.restart_backoff_max < self.restart_backoff_initial:
            raise _custom(
                "backoff_order",
                f"restart_backoff_max ({self.restart_backoff_max:g}) is below "
                f"restart_backoff_initial ({self.restart_backoff_initial:g})",
            )
        return self


#: ModelConfig fields that do not change the running child: a reload that only touches these
#: keeps the child (see :meth:`ForgeConfig.model_fingerprint`).
_NOT_IN_FINGERPRINT = frozenset({"ttl", "max_concurrency", "queue", "preload", "load_wait"})


class ModelConfig(_Section):
    """``[models.NAME]``: one model the service can serve under ``NAME``."""

    path: str = Field(min_length=1)
    """A GGUF path, an embedded default's name (``gemma-3-270m``) or ``hf:org/repo:QUANT``."""
    ctx_size: int | None = Field(default=None, ge=0)
    gpu_layers: GpuLayers = None
    """None: forge decides from the memory estimate; or a number, ``"auto"`` (llama-server fits),
    ``"all"``."""
    parallel: int | None = Field(default=None, ge=1)
    gpu: GpuChoice = "auto"
    preload: bool = False
    ttl: float = Field(default=0.0, ge=0)
    """Idle seconds before the model is unloaded; 0 = never."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight at the child; more wait in the queue. Default: ``parallel``, else 4."""
    queue: int = Field(default=64, ge=0)
    """Requests allowed to wait; beyond this the gateway answers 429."""
    load_wait: float | None = Field(default=None, ge=0)
    """This model's ``server.load_wait`` (seconds a request waits for its load)."""
    args: list[str] = Field(default_factory=list)
    """Extra llama-server arguments; flags forge sets itself are refused."""
    workers: Literal["auto", "never", "only", "all"] = "auto"
    """RPC workers (``[[workers]]``): ``auto`` uses the fewest that hold it when the model does not
    fit on this machine; ``only``: always on the fewest workers, never here; ``all``: a share on every
    usable worker; ``never``: this machine only."""

    @property
    def effective_max_concurrency(self) -> int:
        return self.max_concurrency or self.parallel or 4

    @field_validator("args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = _normalise_flag(arg)
            if flag is not None and (flag in _OWNED_FLAGS or flag.startswith(_OWNED_PREFIXES)):
                raise _custom(
                    "owned_flag",
                    f"{arg!r} is set by forge itself and cannot be passed in args "
                    "(use the model's own keys: path, ctx_size, gpu_layers, parallel, gpu)",
                )
        return args


def _normalise_flag(arg: str) -> str | None:
    """The flag an argument names, as llama.cpp matches it (``--foo_bar=1`` → ``--foo-bar``)."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None  # a value (negative numbers included), not a flag
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


# -- the whole file --------------------------------------------------------------------------------


class WorkerConfig(_Section):
    """``[[workers]]``: one llama.cpp RPC worker (``forge worker`` on another machine)."""

    address: str = Field(min_length=3)
    """``HOST:PORT``, as `forge worker` prints it."""

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in value:
            raise _custom("worker_address", f'{value!r} is not HOST:PORT (e.g. "10.0.0.2:50052")')
        return f"{host}:{int(port)}"


class ForgeConfig(BaseSettings):
    """The whole config. Build it with :func:`load_config`; it is immutable.

    A ``BaseSettings`` only so that pydantic-settings' env source knows its prefix and nesting;
    constructing one directly reads no environment (only :func:`load_config` feeds it).
    """

    model_config = SettingsConfigDict(
        env_prefix="FORGE_",
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = Field(default_factory=ServerConfig)
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    workers: list[WorkerConfig] = Field(default_factory=list)

    _source: Path | None = PrivateAttr(default=None)
    _default_state_dir: Path | None = PrivateAttr(default=None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    @property
    def source(self) -> Path | None:
        """The file this config was read from; None when no file was found."""
        return self._source

    @property
    def state_dir(self) -> Path:
        """``server.state_dir``, else the settings' state dir it was loaded with."""
        if self.server.state_dir is not None:
            return self.server.state_dir
        if self._default_state_dir is not None:
            return self._default_state_dir
        return get_settings().state_dir

    @property
    def log_dir(self) -> Path:
        """``server.log_dir``, else ``<state_dir>/logs``."""
        return self.server.log_dir or self.state_dir / "logs"

    def model_fingerprint(self, name: str) -> str:
        """A stable hash of what the running child of model ``name`` depends on.

        Equal fingerprints across a reload mean the child can be kept; ``ttl``, ``max_concurrency``,
        ``queue`` and ``preload`` are the gateway's business and are left out. KeyError if unknown.
        """
        model = self.models[name]
        data = model.model_dump(mode="json", exclude=set(_NOT_IN_FINGERPRINT))
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_server(self, **changes: Any) -> ForgeConfig:
        """A copy with ``[server]`` keys replaced (CLI overrides), validated like the file.

        ``model_copy(update=...)`` would skip validation, so an open bind could slip through.
        """
        data = self.server.model_dump()
        data.update(changes)
        try:
            server = ServerConfig.model_validate(data)
        except ValidationError as exc:
            raise _translate(exc, ("server",), source=self.source, env_keys={}, overrides=changes) from exc
        new = self.model_copy(update={"server": server})
        new._source = self._source
        new._default_state_dir = self._default_state_dir
        return new


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
    file_data = _read_toml(source) if source is not None else {}
    if source is not None:
        file_data = _resolve_relative(file_data, source.parent)
    env_data, env_keys = _env_layer(env)
    merged = _merge(file_data, env_data)
    _check_model_names(merged, source, env_keys)
    try:
        config = ForgeConfig(**merged)
    except ValidationError as exc:
        raise _translate(exc, (), source=source, env_keys=env_keys) from exc
    config._source = source
    config._default_state_dir = settings.state_dir
    return config


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
        for key in ("state_dir", "log_dir"):
            if key in server:
                server[key] = fix(server[key])
        if isinstance(server.get("model_dirs"), list):
            server["model_dirs"] = [fix(v) for v in server["model_dirs"]]
        data = {**data, "server": server}
    models = data.get("models")
    if isinstance(models, dict):
        fixed: dict[str, Any] = {}
        for name, model in models.items():
            if isinstance(model, dict) and looks_like_path(model.get("path")):
                model = {**model, "path": fix(model["path"])}
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
        if not _MODEL_NAME.fullmatch(name):
            key = f"models.{name}"
            raise ConfigError(
                f"{_where(source, env_keys, ('models', name))}: {key}: model name {name!r} may only use "
                "letters, digits, '.', '_' and '-'",
                key=key,
                hint=_fix_hint(source, env_keys, ("models", name), "rename the section"),
            )


def _where(source: Path | None, env_keys: Mapping[str, str], loc: tuple[str, ...]) -> str:
    var = _env_var_for(loc, env_keys)
    if var is not None:
        return f"config {var}"
    return f"config {source.name}" if source is not None else "config"


def _fix_hint(source: Path | None, env_keys: Mapping[str, str], loc: tuple[str, ...], verb: str) -> str:
    var = _env_var_for(loc, env_keys)
    if var is not None:
        return f"{verb} in the environment variable {var}"
    if source is not None:
        return f"{verb} in {source}"
    return f"{verb} in {CONFIG_NAME} or the FORGE_* environment"


def _env_var_for(loc: tuple[str, ...], env_keys: Mapping[str, str]) -> str | None:
    """The variable that set the value at ``loc``, if one did (the most specific one)."""
    for i in range(len(loc), 0, -1):
        name = "forge_" + "__".join(loc[:i]).lower()
        if name in env_keys:
            return env_keys[name]
    if loc[:2] == ("server", "api_key") and "forge_api_key" in env_keys:
        return env_keys["forge_api_key"]
    deeper = "forge_" + "__".join(loc).lower() + "__"
    return next((var for name, var in sorted(env_keys.items()) if name.startswith(deeper)), None)


def _translate(
    exc: ValidationError,
    prefix: tuple[str, ...],
    *,
    source: Path | None,
    env_keys: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
) -> ConfigError:
    """pydantic's first error → one line naming the dotted key, the reason and where to fix it."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    loc = (*prefix, *(str(p) for p in err["loc"]))
    kind = err["type"]
    reason = err["msg"]
    verb = "fix the value"
    if kind in _VALIDATOR_FIELD:  # a model validator's error: point at the key to change
        loc = (*loc, _VALIDATOR_FIELD[kind])
    if kind == "extra_forbidden":
        reason = "unknown key"
        guess = difflib.get_close_matches(loc[-1], _known_keys(loc[:-1]), n=1)
        if guess:
            reason += f" — did you mean {guess[0]!r}?"
        verb = "remove it or fix the spelling"
    elif kind == "missing":
        verb = "add it"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        reason = "Input should be a table (a [section] or {key = value} in TOML)"
    quote_input = kind not in _CUSTOM_KINDS and kind not in ("extra_forbidden", "missing")
    if quote_input and loc[-1] not in _SECRET_KEYS and _is_scalar(err.get("input")):
        reason += f" (got {err['input']!r})"
    key = ".".join(loc)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if overrides is not None and loc[1:2] and loc[1] in overrides:
        where, hint = "config", f"fix the --{loc[1].replace('_', '-')} option"
    else:
        where, hint = _where(source, env_keys, loc), _fix_hint(source, env_keys, loc, verb)
    if kind == "insecure_bind":
        hint = (
            "set server.api_key (or FORGE_API_KEY); or allow_unauthenticated = true in [server] "
            "if the network is trusted; or bind 127.0.0.1"
        )
    return ConfigError(f"{where}: {key}: {reason}{more}", key=key, hint=hint)


def _known_keys(parent: tuple[str, ...]) -> list[str]:
    section: type[BaseModel] | None = None
    if parent == ():
        section = ForgeConfig
    elif parent == ("server",):
        section = ServerConfig
    elif parent == ("supervisor",):
        section = SupervisorConfig
    elif len(parent) == 2 and parent[0] == "models":
        section = ModelConfig
    elif len(parent) == 2 and parent[0] == "workers":
        section = WorkerConfig
    return list(section.model_fields) if section is not None else []


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) and len(repr(value)) <= 80


def _is_loopback(host: str) -> bool:
    h = host.strip().strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve anywhere, so it is not trusted as loopback
