"""The forge.toml schema as one file: ``[supervisor]``, ``[[workers]]``, ``[groups.*]`` and the
whole file (:class:`ForgeConfig`), with ``[server]`` (``_server``), ``[models.*]`` (``_model``)
and ``[peers.*]`` (``_peers``) from their own modules.

Immutable pydantic models; :func:`~._file.load_config` builds them from the file and the
environment. Typos do not pass silently: unknown keys are errors (``extra="forbid"``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ._backends import (
    WITH_CONTEXT,
)
from ._explain import custom, translate
from ._fields import (
    CtxSizeField,
    ReserveField,
    _Section,
)
from ._model import NOT_IN_FINGERPRINT as _NOT_IN_FINGERPRINT
from ._model import AdapterConfig, ModelConfig, VariantConfig
from ._names import MODEL_NAME
from ._peers import PeerConfig, PeerTimeouts, fallback_problem
from ._server import KeyConfig, ServerConfig
from ._settings import ForgeSettings
from ._values import (
    CtxSize,
    reserve_bytes,
)

__all__ = [
    "AdapterConfig",
    "ForgeConfig",
    "GroupConfig",
    "KeyConfig",
    "ModelConfig",
    "ServerConfig",
    "SupervisorConfig",
    "VariantConfig",
    "WorkerConfig",
    "known_keys",
]


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
    """No answer for ``health_interval × health_failures`` seconds → hung: killed and restarted."""
    load_stall_timeout: float = Field(default=300.0, gt=0)
    stall_timeout: float = Field(default=120.0, ge=0)
    """A ready child with requests in flight whose slots make no progress (no token, no prompt
    batch) for this long is stalled: killed and restarted (0: off). Must exceed the slowest single
    decode step (one prompt batch at --threads 1 on a slow CPU): a model's own ``stall_timeout``
    overrides it."""
    load_deadline_base: float = Field(default=300.0, gt=0)
    """A load's deadline: this plus ``load_deadline_per_gib`` per GiB of model file."""
    load_deadline_per_gib: float = Field(default=20.0, ge=0)
    stop_timeout: float = Field(default=10.0, gt=0)
    drain_timeout: float = Field(default=30.0, ge=0)
    vram_reserve: ReserveField = 0.05
    """Memory to keep free for other programs on each device a model runs on: a fraction (``"5%"``,
    ``0.05``) or bytes (``"2GiB"``). When others' use grows until less is free, idle models there
    are evicted (best score first; never busy or ``pinned`` ones) until it holds again. 0: off."""
    pressure_interval: float = Field(default=2.0, ge=0)
    """Seconds between looks at device memory for ``vram_reserve`` (0: off)."""
    priority_aging: float = Field(default=30.0, ge=0)
    """Seconds after which a waiting ``batch``/``background`` request is served before fresher
    requests of any class (the bound on its wait under constant interactive load; 0: off)."""
    ctx_size: CtxSizeField = None
    """The ``ctx_size`` of every llama-server model that sets none: a number of tokens, or
    ``"auto"`` (the largest context that fits where the model is placed, chosen at each load).
    None: each such model gets its trained context."""
    ctx_min: int = Field(default=2048, ge=256)
    """With ``ctx_size = "auto"``: the fewest tokens one request must be able to use; a load that
    cannot have that much is refused with the numbers. A model's own ``ctx_min`` wins."""

    def ctx_size_of(self, model: ModelConfig) -> CtxSize:
        """The model's ``ctx_size``, else this section's default (a model with a context)."""
        if model.ctx_size is not None or model.backend not in WITH_CONTEXT:
            return model.ctx_size
        return self.ctx_size

    def per_request_of(self, model: ModelConfig) -> int | None:
        """Tokens one request of ``model`` can use as configured (:meth:`ctx_size_of`): None when
        that is its trained context, or ``auto`` (both known only at load)."""
        ctx = self.ctx_size_of(model)
        if not isinstance(ctx, int) or not ctx:
            return None
        return ctx if model.unified_kv else ctx // (model.parallel or 4)

    def ctx_min_of(self, model: ModelConfig) -> int:
        """The model's ``ctx_min``, else this section's."""
        return model.ctx_min if model.ctx_min is not None else self.ctx_min

    def reserve_for(self, total_bytes: int) -> int:
        """``vram_reserve`` in bytes on a device of ``total_bytes``."""
        return reserve_bytes(self.vram_reserve, total_bytes)

    def load_deadline(self, size_bytes: int) -> float:
        """The whole load's deadline: base + per GiB of model file (LocalAI: 5 min + 20 s/GiB), so
        that big models on slow disks do not hit a fixed timeout (lemonade#674, #1594, #3386)."""
        return self.load_deadline_base + self.load_deadline_per_gib * size_bytes / 2**30

    @model_validator(mode="after")
    def _backoff_order(self) -> SupervisorConfig:
        if self.restart_backoff_max < self.restart_backoff_initial:
            raise custom(
                "backoff_order",
                f"restart_backoff_max ({self.restart_backoff_max:g}) is below "
                f"restart_backoff_initial ({self.restart_backoff_initial:g})",
            )
        return self


#: ModelConfig fields that do not change the running child: a reload that only touches these
#: keeps the child (see :meth:`ForgeConfig.model_fingerprint`).
class WorkerConfig(_Section):
    """``[[workers]]``: one llama.cpp RPC worker (``forge worker`` on another machine)."""

    address: str = Field(min_length=3)
    """``HOST:PORT``, as `forge worker` prints it."""

    @field_validator("address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in value:
            raise custom("worker_address", f'{value!r} is not HOST:PORT (e.g. "10.0.0.2:50052")')
        if ":" in host or "[" in host:  # llama.cpp's RPC client splits at the first ':', IPv4 only
            raise custom("worker_address", f"{value!r}: llama.cpp's RPC client reaches IPv4 addresses only")
        return f"{host}:{int(port)}"


class GroupConfig(_Section):
    """``[groups.NAME]``: models that share residency rules. A model is in at most one group."""

    members: list[str] = Field(min_length=1)
    """The ``[models.*]`` names in the group."""
    max_loaded: int | None = Field(default=None, ge=1)
    """At most this many members loaded at once: loading another unloads the least valuable
    idle member (by ``evict_cost``); a pinned or never-swap member is never that one."""
    exclusive: bool = False
    """Loading a member first unloads every model outside the group except pinned and
    never-swap ones (their requests in flight finish first)."""


# -- the whole file --------------------------------------------------------------------------------


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
    groups: dict[str, GroupConfig] = Field(default_factory=dict)
    peers: dict[str, PeerConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _peers_and_fallbacks(self) -> ForgeConfig:
        """Peer names make served names (``PEER/ID``); fallbacks name what exists."""
        for name in self.peers:
            if not MODEL_NAME.fullmatch(name):
                raise custom(
                    "peer_name",
                    f"peer name {name!r} may use only letters, digits, '.', '_' and '-'",
                    at=f"peers.{name}",
                )
        for name, m in self.models.items():
            for i, entry in enumerate(m.fallback):
                problem = fallback_problem(entry, set(self.models), dict(self.peers))
                if problem is None and entry == name:
                    problem = f"fallback {entry!r} is the model itself"
                if problem is not None:
                    raise custom("fallback", problem, at=f"models.{name}.fallback.{i}")
        return self

    @model_validator(mode="after")
    def _residency_rules(self) -> ForgeConfig:
        """Groups name configured models, each model in one group at most; one warm default,
        which is never idle-unloaded (it would be loaded back at once)."""
        member_of: dict[str, str] = {}
        for group, rule in self.groups.items():
            for i, member in enumerate(rule.members):
                if member not in self.models:
                    known = ", ".join(sorted(self.models)) or "none"
                    raise custom(
                        "residency",
                        f"group {group!r} names {member!r}, which is no [models.*] entry (models: {known})",
                        at=f"groups.{group}.members.{i}",
                    )
                if member in member_of:
                    raise custom(
                        "residency",
                        f"{member!r} is in groups {member_of[member]!r} and {group!r}: "
                        "a model may be in one group only",
                        at=f"groups.{group}.members.{i}",
                    )
                member_of[member] = group
        defaults = [name for name, m in self.models.items() if m.default]
        if len(defaults) > 1:
            raise custom(
                "residency",
                f"models {', '.join(repr(d) for d in defaults)} all set default = true: "
                "at most one model is the warm default",
                at=f"models.{defaults[1]}.default",
            )
        for name in defaults:
            if self.models[name].ttl:
                raise custom(
                    "residency",
                    f"model {name!r} is the warm default and has ttl = {self.models[name].ttl:g}: "
                    "it would be loaded back as soon as it is unloaded; remove ttl or default",
                    at=f"models.{name}.ttl",
                )
        return self

    @model_validator(mode="after")
    def _ctx_min_needs_auto(self) -> ForgeConfig:
        """``ctx_min`` on a model whose context is fixed would do nothing, silently."""
        for name, m in self.models.items():
            ctx = self.supervisor.ctx_size_of(m)
            if m.ctx_min is not None and ctx != "auto":  # (other backends: refused as a key)
                has = "no ctx_size" if ctx is None else f"ctx_size = {ctx}"
                raise custom(
                    "ctx_min",
                    f'ctx_min applies only with ctx_size = "auto" (model {name!r} has {has}): '
                    'remove ctx_min, or set ctx_size = "auto"',
                    at=f"models.{name}.ctx_min",
                )
        return self

    def group_of(self, name: str) -> str | None:
        """The group model ``name`` is in, if any."""
        return next((g for g, rule in self.groups.items() if name in rule.members), None)

    @field_validator("workers")
    @classmethod
    def _one_entry_per_worker(cls, value: list[WorkerConfig]) -> list[WorkerConfig]:
        # A worker listed twice would be split to twice (rpc-server serves one client at a time).
        seen: set[str] = set()
        for w in value:
            if w.address in seen:
                raise custom("duplicate_worker", f"{w.address} is listed twice: list each worker once")
            seen.add(w.address)
        return value

    @model_validator(mode="after")
    def _rpc_is_ours_with_workers(self) -> ForgeConfig:
        # forge's own --rpc comes after `args`: a user's --rpc would shift llama-server's device
        # numbering under forge's --tensor-split.
        if self.workers:
            for name, m in self.models.items():
                if any(a == "--rpc" or a.startswith("--rpc=") for a in m.args):
                    raise custom(
                        "rpc_owned",
                        "--rpc is set by forge when [[workers]] are listed "
                        '(use workers = "only" or "all" to place this model on them)',
                        model=name,
                    )
        return self

    _source: Path | None = PrivateAttr(default=None)
    _settings: ForgeSettings | None = PrivateAttr(default=None)

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
    def settings(self) -> ForgeSettings:
        """The process-wide settings this config was loaded with (``FORGE_STATE_DIR``, …).

        A config built directly (tests) has the defaults, without reading ``FORGE_*`` again.
        """
        return self._settings if self._settings is not None else ForgeSettings.model_construct()

    @property
    def state_dir(self) -> Path:
        """``server.state_dir`` (file or ``FORGE_SERVER__STATE_DIR``), else ``FORGE_STATE_DIR`` /
        the XDG default: the one place the two knobs are resolved."""
        return self.server.state_dir or self.settings.state_dir

    @property
    def model_dirs(self) -> list[Path]:
        """``server.model_dirs`` and ``FORGE_MODEL_DIRS`` together (both are "may load from")."""
        dirs = [*self.server.model_dirs, *self.settings.model_dirs]
        return list(dict.fromkeys(dirs))

    @property
    def context_dir(self) -> Path:
        """``server.context_dir``, else ``<state_dir>/contexts``."""
        return self.server.context_dir or self.state_dir / "contexts"

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
        if model.backend in WITH_CONTEXT:  # [supervisor]'s context defaults change the child too
            data["ctx_size"] = self.supervisor.ctx_size_of(model)
            if data["ctx_size"] == "auto":
                data["ctx_min"] = self.supervisor.ctx_min_of(model)
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
            raise translate(
                exc, ("server",), source=self.source, env_keys={}, overrides=changes, known_keys=known_keys
            ) from exc
        new = self.model_copy(update={"server": server})
        new._source = self._source
        new._settings = self._settings
        return new


def known_keys(parent: tuple[str, ...]) -> list[str]:
    section: type[BaseModel] | None = None
    if parent == ():
        section = ForgeConfig
    elif parent == ("server",):
        section = ServerConfig
    elif len(parent) == 3 and parent[:2] == ("server", "keys"):
        section = KeyConfig
    elif parent == ("supervisor",):
        section = SupervisorConfig
    elif len(parent) == 2 and parent[0] == "models":
        section = ModelConfig
    elif len(parent) == 4 and parent[0] == "models" and parent[2] == "variants":
        section = VariantConfig
    elif len(parent) == 4 and parent[0] == "models" and parent[2] == "adapters":
        section = AdapterConfig
    elif len(parent) == 2 and parent[0] == "workers":
        section = WorkerConfig
    elif len(parent) == 2 and parent[0] == "groups":
        section = GroupConfig
    elif len(parent) == 2 and parent[0] == "peers":
        section = PeerConfig
    elif len(parent) == 3 and parent[0] == "peers" and parent[2] == "timeouts":
        section = PeerTimeouts
    return list(section.model_fields) if section is not None else []
