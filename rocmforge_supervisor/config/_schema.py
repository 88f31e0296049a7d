"""The forge.toml schema: ``[server]``, ``[supervisor]``, ``[models.NAME]``, and the whole file.

Immutable pydantic models; :func:`~._file.load_config` builds them from the file and the
environment. Typos do not pass silently: unknown keys are errors (``extra="forbid"``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .._argv import OWNED_BY_KEY, is_owned_flag, normalise_flag, resolve_kv_unified
from ._backends import (
    DEFAULT_COMMAND_ROUTES,
    ONE_AT_A_TIME,
    WITH_CONTEXT,
    BackendName,
    key_problem,
    path_problem,
)
from ._explain import custom, translate
from ._names import MODEL_NAME, is_loopback
from ._peers import PeerConfig, PeerTimeouts, fallback_problem
from ._settings import ForgeSettings
from ._speculative import speculative_problem
from ._tls import tls_pair_problem
from ._values import (
    CtxSize,
    GpuChoice,
    GpuLayers,
    Reserve,
    parse_bytes,
    parse_ctx_size,
    parse_gpu,
    parse_gpu_layers,
    parse_reserve,
    reserve_bytes,
)
from ._variants import served_names_problem

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

# -- field shapes ----------------------------------------------------------------------------------


def _gpu_layers(value: Any) -> Any:
    """One clear error instead of pydantic's one-per-union-member for ``int | "auto" | "all"``."""
    try:
        return parse_gpu_layers(value)
    except ValueError as exc:
        raise custom("gpu_layers", str(exc)) from None


def _ctx_size(value: Any) -> Any:
    """One clear error instead of pydantic's one-per-union-member for ``int | "auto"``."""
    try:
        return parse_ctx_size(value)
    except ValueError as exc:
        raise custom("ctx_size", str(exc)) from None


def _bytes_or_none(value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise custom("bytes", str(exc)) from None


def _gpu(value: Any) -> Any:
    try:
        return parse_gpu(value)
    except ValueError as exc:
        raise custom("gpu", str(exc)) from None


def _reserve(value: Any) -> Any:
    try:
        return parse_reserve(value)
    except ValueError as exc:
        raise custom("vram_reserve", str(exc)) from None


GpuLayersField = Annotated[GpuLayers, BeforeValidator(_gpu_layers)]
CtxSizeField = Annotated[CtxSize, BeforeValidator(_ctx_size)]
GpuChoiceField = Annotated[GpuChoice, BeforeValidator(_gpu)]
ReserveField = Annotated[Reserve, BeforeValidator(_reserve)]


#: ``org/repo:FILE.gguf`` or ``org/repo/FILE.gguf`` (a file inside a Hugging Face repo).
_HF_FILE_RE = re.compile(
    r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(?:@[\w./-]+?)?[:/][\w./-]+\.gguf$", re.IGNORECASE
)


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyConfig(_Section):
    """``[[server.keys]]``: one client's API key, the models it may use, and its limits.

    The key itself comes from exactly one of ``key``, ``key_file`` (its first line) or ``env``
    (an environment variable's name), so that it can stay out of the file; it is read here, once
    per load or reload, and only :attr:`secret` gives it out. Logs and errors name ``name``.
    """

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")
    key: Annotated[SecretStr | None, BeforeValidator(_empty_is_none)] = None
    key_file: Path | None = None
    env: str | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])
    """Model names or globs (``qwen*``) this key may use; default all."""
    admin: bool = False
    """Control routes (load, unload, add, reload, pull), the page's controls and captured bodies."""
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None
    """Prompt + completion tokens in the last 24 hours."""
    priority: Literal["interactive", "batch", "background"] = "interactive"
    """Its requests' admission class; an ``X-Priority`` header may lower it (an admin key's may
    also raise it)."""

    _secret: str = PrivateAttr(default="")

    @property
    def secret(self) -> str:
        return self._secret

    @model_validator(mode="after")
    def _resolve(self) -> KeyConfig:
        entry = f"[[server.keys]] entry {self.name!r}"
        sources = [s for s in ("key", "key_file", "env") if getattr(self, s) is not None]
        if len(sources) != 1:
            raise custom(
                "key_entry",
                f"{entry} needs exactly one of key, key_file or env"
                + (f" (it has {', '.join(sources)})" if sources else ""),
            )
        if not self.models:
            raise custom(
                "key_entry",
                f'{entry}: models is empty (leave it out for all models, or list names or globs like "qwen*")',
            )
        for limit in ("requests_per_minute", "tokens_per_day"):
            value = getattr(self, limit)
            if value is not None and value <= 0:
                raise custom(
                    "key_entry", f"{entry}: {limit} must be above 0 (got {value}; leave it out for no limit)"
                )
        if self.key is not None:
            secret = self.key.get_secret_value()
        elif self.key_file is not None:
            try:
                lines = self.key_file.expanduser().read_text().splitlines()
            except OSError as exc:
                raise custom(
                    "key_entry",
                    f"{entry}: key_file {str(self.key_file)!r} cannot be read: {exc.strerror or exc}",
                ) from None
            secret = lines[0].strip() if lines else ""
            if not secret:
                raise custom("key_entry", f"{entry}: key_file {str(self.key_file)!r} is empty")
        else:
            secret = os.environ.get(str(self.env), "").strip()
            if not secret:
                raise custom("key_entry", f"{entry}: the environment variable {self.env} is not set or empty")
        self._secret = secret
        return self


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
    audio_max_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    """The largest audio file a whisper model takes on ``/v1/audio/transcriptions`` and
    ``/v1/audio/translations`` (OpenAI's limit is 25 MB); these uploads may exceed max_body_bytes."""
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
    keep_alive_streams: bool = False
    """Keep the client's connection open after a streamed answer (SSE). Off by default, as
    llama-server and its router do: a client that pools its connections (httpx, so the OpenAI and
    Anthropic SDKs) scans every idle one it holds for each request it sends, so a burst of N streams
    on kept connections took it O(N^2) work before the requests left (issue 21: 32 streams through
    one shared httpx client, ``bench_gateway.py --pin --shared-client [--keep-alive-streams]``: first
    token p50 +109 ms over direct kept, +30 ms closed). Closing costs a client a new loopback
    connection per stream (~1 ms at c=1 here).
    Non-streamed answers always keep the connection."""
    ollama_port: int | None = Field(default=None, ge=0, le=65535)
    """A second listener for Ollama clients, which look on 11434 (same routes, same auth)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """A listener that serves ``/metrics`` alone, without the API key (every other path: 404), for
    scrapers that cannot send one (an inference router's endpoint picker, a plain Prometheus)."""
    metrics_host: str = "127.0.0.1"
    """Where ``metrics_port`` listens: loopback unless set (a pod's scraper needs ``0.0.0.0``)."""
    metrics_public: bool = False
    """``/metrics`` on the main port without the key too (the Gateway API Inference Extension's
    endpoint picker scrapes the pool's target port and cannot send a key)."""
    context_dir: Path | None = None
    """Where ``keep_context`` models' saved KV-cache slots go. Default: ``<state_dir>/contexts``;
    see :attr:`ForgeConfig.context_dir`. The files hold users' prompts: forge keeps it 0700."""
    context_max_bytes: int = Field(default=16 * 2**30, ge=0)
    """Disk budget of all saved contexts together; past it the least recently used go first."""
    keys: list[KeyConfig] = Field(default_factory=list)
    """Client keys with their models and limits (``api_key``, when set, is one more admin key)."""
    activity: bool = True
    """Keep one record per request in ``<state_dir>/activity.db`` (``/api/activity``, ``/api/usage``)."""
    activity_keep_days: float = Field(default=30.0, gt=0)
    activity_max_rows: int = Field(default=100_000, gt=0)
    capture: bool = False
    """Keep each request's body and its response in the activity log (a model's ``capture`` wins)."""
    capture_max_bytes: int = Field(default=64 * 1024, gt=0)
    allow_remote_media: bool = False
    """Let requests name ``http(s)`` image URLs, which the model server then downloads itself from
    any address (loopback and private ones included). Off: such requests get a 400 (send base64)."""
    watch_config: bool = False
    """Reload when the config file or a ``conf.d/*.toml`` beside it changes (as SIGHUP does:
    unchanged models keep their children); a file that fails validation keeps the old config."""
    tls_cert: Path | None = None
    """A PEM certificate (chain): every listener serves HTTPS with it (``tls_key`` too, or neither)."""
    tls_key: Path | None = None
    """The certificate's private key, PEM, without a passphrase."""
    batch_max_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    """The largest file ``POST /v1/files`` takes (OpenAI's limit: 200 MB)."""
    batch_max_lines: int = Field(default=50_000, gt=0)
    """The most requests one batch's input file may hold (OpenAI's limit: 50 000)."""
    batch_concurrency: int = Field(default=4, ge=1)
    """Lines of the batches the service sends at once (each in the ``background`` class)."""

    @property
    def tls(self) -> bool:
        """The listeners speak HTTPS (``tls_cert`` and ``tls_key`` set: the validator makes it both)."""
        return self.tls_cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)

    @model_validator(mode="after")
    def _one_entry_per_key(self) -> ServerConfig:
        names: set[str] = set()
        secrets = {self.api_key.get_secret_value(): "api_key"} if self.api_key is not None else {}
        for k in self.keys:
            entry = f"[[server.keys]] entry {k.name!r}"
            if k.name in names:
                raise custom(
                    "duplicate_key", f"{entry}: the name {k.name!r} is used twice: give each key its own name"
                )
            if k.secret in secrets:
                raise custom(
                    "duplicate_key",
                    f"{entry}: its key is the same as {secrets[k.secret]!r}'s: give each client its own key",
                )
            names.add(k.name)
            secrets[k.secret] = k.name
        return self

    @field_validator("tls_cert", "tls_key", mode="after")
    @classmethod
    def _expand(cls, path: Path | None) -> Path | None:
        return path.expanduser() if path is not None else None

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            has, lacks = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise custom(
                lacks, f"{has} is set but {lacks} is not: set both (the certificate and its key) or neither"
            )
        if self.tls_cert is not None and self.tls_key is not None:
            problem = tls_pair_problem(self.tls_cert, self.tls_key)
            if problem is not None:
                raise custom(*problem)
        return self

    @model_validator(mode="after")
    def _refuse_open_bind(self) -> ServerConfig:
        # Checked here, not in the gateway, so that no path (file, env, a CLI override through
        # ForgeConfig.with_server) can start an open, unauthenticated server by accident.
        if not self.is_loopback and self.api_key is None and not self.keys and not self.allow_unauthenticated:
            raise custom(
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
_NOT_IN_FINGERPRINT = frozenset(
    {
        "ttl",
        "max_concurrency",
        "queue",
        "interactive_slots",
        "preload",
        "load_wait",
        "max_tokens",
        "pinned",
        "swap",
        "evict_cost",
        "default",
        "capture",
        "stall_timeout",
        "routes",  # the gateway's side: which requests it sends, not how the child runs
        "tools",  # what the listings show, not how the child runs
        "variants",  # request rules the gateway applies; the child is the same
        "fallback",  # where the gateway sends a request this model cannot take
    }
)


class VariantConfig(_Section):
    """``[models.X.variants.Y]``: model ``X`` served again as ``X:Y`` with its own request rules
    (the same child: no second load). Keys are the request fields llama-server reads (OpenAI's
    ``temperature``, ``max_tokens``, ``response_format``…, and its own ``top_k``, ``n_predict``…)."""

    defaults: dict[str, Any] = Field(default_factory=dict)
    """Set when the request does not send them."""
    force: dict[str, Any] = Field(default_factory=dict)
    """Always set, over what the request sends."""
    strip: list[str] = Field(default_factory=list)
    """Removed from the request before ``defaults`` and ``force`` apply."""
    system: str | None = None
    """A system prompt, put first unless the request has its own (chat routes)."""
    adapter: str | None = None
    """One of ``X``'s ``[models.X.adapters.NAME]``, applied to every request of the variant."""


class AdapterConfig(_Section):
    """``[models.X.adapters.NAME]``: a LoRA adapter of model ``X``, served as ``X:NAME``. The child
    loads every adapter of ``X`` at start, none applied; a request to ``X:NAME`` applies this one."""

    path: str = Field(min_length=1)
    """A LoRA GGUF path or ``hf:org/repo:FILE``."""
    scale: float = 1.0
    """How strongly it applies (llama-server's per-request ``lora`` scale)."""


class ModelConfig(_Section):
    """``[models.NAME]``: one model the service can serve under ``NAME``."""

    path: str = Field(default="", min_length=1)
    """A GGUF path, an embedded default's name (``gemma-3-270m``) or ``hf:org/repo:QUANT``; for
    ``backend = "command"`` what ``${MODEL}`` stands for (empty when ``cmd`` does not use it)."""
    backend: BackendName = "llama"
    """The server that runs it: ``llama`` (llama-server), ``whisper`` (whisper.cpp's
    whisper-server, for a whisper GGML model: speech to text on ``/v1/audio/transcriptions`` and
    ``/v1/audio/translations``; it serves one request at a time, so ``max_concurrency`` is 1), or
    ``command``: any OpenAI-compatible server, started as ``cmd`` (vLLM, SGLang, koboldcpp,
    another llama-server build…); then ``path`` is what ``${MODEL}`` stands for."""
    ctx_size: CtxSizeField = None
    """Tokens of KV cache (shared by the slots, or split among them with ``kv_unified = false``);
    0: the model's trained context; ``"auto"``: the largest context that fits the devices the
    model is placed on, beside what stays loaded, capped by the trained context and chosen again
    at each load. None: ``[supervisor] ctx_size``, else the trained context."""
    ctx_min: int | None = Field(default=None, ge=256)
    """With ``ctx_size = "auto"``: the fewest tokens one request must be able to use (default
    ``[supervisor] ctx_min``, 2048); below it the load is refused, saying what it needs."""
    gpu_layers: GpuLayersField = None
    """None: forge decides from the memory estimate; or a number, ``"auto"`` (llama-server fits),
    ``"all"``."""
    parallel: int | None = Field(default=None, ge=1)
    kv_unified: bool | None = None
    """One KV cache of ``ctx_size`` tokens shared by all ``parallel`` slots (``--kv-unified``), so
    that one request can use the whole context: forge's default (None), as it is llama-server's
    with automatic slots. ``false``: each slot gets ``ctx_size / parallel`` tokens of its own, so
    concurrent requests can never crowd each other out of the cache, but none can be longer."""
    gpu: GpuChoiceField = "auto"
    preload: bool = False
    ttl: float = Field(default=0.0, ge=0)
    """Idle seconds before the model is unloaded; 0 = never."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight at the child; more wait in the queue. Default: ``parallel``, else 4."""
    queue: int = Field(default=64, ge=0)
    """Requests allowed to wait beyond ``max_concurrency`` (0: none); past it the gateway answers 429."""
    interactive_slots: int = Field(default=0, ge=0)
    """Of ``max_concurrency``, slots kept for the ``interactive`` class: ``batch`` and
    ``background`` requests never hold more than the rest (at least one)."""
    load_wait: float | None = Field(default=None, ge=0)
    """This model's ``server.load_wait`` (seconds a request waits for its load)."""
    fallback: list[str] = Field(default_factory=list)
    """Where a request goes when this model cannot take it (failed, refused by a residency rule,
    its queue full, its peer cooling down), in order, before a byte was sent to the client:
    another ``[models.*]`` name or ``PEER/MODEL`` of a ``[peers.*]`` entry."""
    stall_timeout: float | None = Field(default=None, ge=0)
    """This model's ``supervisor.stall_timeout`` (seconds busy without progress; 0: off)."""
    pinned: bool = False
    """Never evicted: not to make room for another model (a load that would need it gone is
    refused with 409), not by a group's rules, not to yield memory to other programs."""
    swap: Literal["auto", "never"] = "auto"
    """``never``: once loaded, placement never unloads it (a load that would need it gone gets
    409); its ``ttl``, an explicit unload and memory pressure still may (llama-swap's
    ``swappable: false``)."""
    evict_cost: float = Field(default=1.0, gt=0)
    """Weight against eviction: among idle models the one idle longest per unit of cost goes
    first (score = idle seconds / evict_cost), so a model slow to load can be made the last."""
    default: bool = False
    """The warm default (at most one): loaded at start and, whenever it is not loaded and its
    memory is free again, loaded back without a request (it never evicts anything to get there)."""
    sleep_idle: int | None = Field(default=None, ge=1)
    """Idle seconds after which the child frees its model, context and projector but keeps running
    (llama-server's ``--sleep-idle-seconds``); the next request reloads them. None: never."""
    embeddings: bool = False
    """Serve ``/v1/embeddings``: starts llama-server with ``--embeddings`` and, unless ``args``
    choose one, ``--pooling mean`` (OpenAI-shaped embeddings need a pooled vector)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Default ``max_tokens`` for chat/completions requests that send none (None: to the end of
    the slot's context)."""
    capture: bool | None = None
    """This model's ``server.capture`` (keep request and response bodies in the activity log)."""
    args: list[str] = Field(default_factory=list)
    """Extra llama-server arguments; flags forge sets itself are refused."""
    keep_context: bool = False
    """Save the child's KV-cache slots when forge stops it on purpose (ttl, unload, eviction, a
    restarting reload, shutdown) and restore them into its next child before the first request:
    a resumed conversation skips its prefill. Off by default: the files are big and hold prompts."""
    keep_conversations: bool = False
    """With ``keep_context``: also save each long chat turn's state per conversation (and API key)
    and restore it into a free slot at the conversation's next turn when the child lost it."""
    mmproj: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """A multimodal (vision/audio) projector for this model: a GGUF path, ``"hf:org/repo:FILE"``, or
    ``"auto"``: the ``mmproj*.gguf`` beside the model in its Hugging Face repo or folder. The child
    gets ``--mmproj``; requests may then carry images (or audio)."""
    mmproj_offload: bool | None = None
    """The projector on the GPU (``--mmproj-offload``, llama-server's default) or in system RAM
    (false: ``--no-mmproj-offload``). None: on the GPU when the model is on one, else off."""
    workers: Literal["auto", "never", "only", "all"] = "auto"
    """RPC workers (``[[workers]]``): ``auto`` uses the fewest that hold it when the model does not
    fit on this machine; ``only``: always on the fewest workers, never here; ``all``: a share on every
    usable worker; ``never``: this machine only."""
    cmd: list[str] = Field(default_factory=list)
    """``backend = "command"``: the server's command line; ``${PORT}`` (required), ``${HOST}``,
    ``${MODEL}`` (``path``) and ``${NAME}`` are filled in at each start, ``args`` appended."""
    health: str | None = None
    """``backend = "command"``: the path that answers 200 once it is ready (default ``/health``)."""
    ready_log: str | None = None
    """``backend = "command"``: ready when it prints a line matching this regular expression
    (instead of ``health``)."""
    routes: list[str] | None = None
    """``backend = "command"``: the OpenAI routes it serves (default: chat/completions,
    completions, embeddings); a request on another route is refused before it is queued."""
    memory: Annotated[int | None, BeforeValidator(_bytes_or_none)] = None
    """``backend = "command"``: the device memory it takes on each device it is placed on
    (``"12GiB"``), for placement; None: placed without a memory check."""
    env: dict[str, str] = Field(default_factory=dict)
    """``backend = "command"``: extra environment for the command (the device mask is forge's)."""

    # -- speculative decoding, reranking, tools (issue 34): checked by config/_speculative.py --
    draft: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """A draft model for speculative decoding: a GGUF path, an embedded name or
    ``hf:org/repo:QUANT``. It must share the model's vocabulary (refused at config check when it
    does not). Its weights and KV cache (the model's context, ``f16``) count in placement."""
    draft_max: int | None = Field(default=None, ge=1)
    """Tokens the draft proposes per step (``--spec-draft-n-max``; llama-server's default 3)."""
    draft_min: int | None = Field(default=None, ge=0)
    """The fewest draft tokens worth checking (``--spec-draft-n-min``; default 0)."""
    draft_gpu: Literal["auto", "cpu"] = "auto"
    """Where the draft sits: ``auto``, on the model's GPUs (split as the model is) or in RAM when
    the model is; ``cpu``: always in system RAM (saves GPU memory, drafts slower)."""
    speculative: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """llama-server's ``--spec-type``, comma-separated: ``draft-simple`` (the default with a
    ``draft``), ``draft-eagle3``, ``draft-mtp`` (the model's own MTP head), ``draft-dflash``,
    ``draft-dspark``, or a draft-free n-gram mode: ``ngram-simple``, ``ngram-map-k``,
    ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``."""
    rerank: bool = False
    """A reranker (``--reranking``): served on ``/v1/rerank`` and ``/rerank`` only; a chat or
    completion request to it is a 400."""
    tools: bool | None = None
    """The ``tools`` capability in ``/v1/models`` and ``/api/show``: None from the chat template
    (the running child's ``/props``), false hides it (and tool requests get a 400), true shows it."""

    # -- variants and LoRA adapters (issue 34): served as NAME:VARIANT / NAME:ADAPTER (service/_names.py) --
    variants: dict[str, VariantConfig] = Field(default_factory=dict)
    """``[models.X.variants.Y]``: ``X:Y``, the same child with request rules of its own."""
    adapters: dict[str, AdapterConfig] = Field(default_factory=dict)
    """``[models.X.adapters.NAME]``: LoRA adapters, loaded with the child and served as ``X:NAME``."""

    @model_validator(mode="after")
    def _served_names(self) -> ModelConfig:
        problem = served_names_problem(self)
        if problem is not None:
            raise custom(*problem)
        return self

    @model_validator(mode="after")
    def _conversations_need_context(self) -> ModelConfig:
        """The tier saves into the context directory through the child's ``--slot-save-path``,
        which only ``keep_context`` gives it: without it the key would do nothing, silently."""
        if self.keep_conversations and not self.keep_context:
            raise custom(
                "keep_conversations",
                "keep_conversations = true needs keep_context = true (the conversations are kept "
                "through its saved slots): add keep_context = true, or remove keep_conversations",
            )
        return self

    @model_validator(mode="after")
    def _speculative_keys(self) -> ModelConfig:
        problem = speculative_problem(self)
        if problem is not None:
            raise custom(*problem)
        return self

    @property
    def unified_kv(self) -> bool:
        """Whether its child shares one KV cache across slots: ``args``' own ``-kvu``/``-no-kvu``,
        else ``kv_unified``, else yes (forge's default)."""
        return resolve_kv_unified(self.kv_unified, self.args)

    @property
    def context_per_request(self) -> int | None:
        """Tokens one request can use as configured: the whole ``ctx_size`` with a unified KV
        cache, else one slot's share. None: ``ctx_size`` unset (the model's trained context,
        known only from its GGUF)."""
        if not self.ctx_size or self.ctx_size == "auto":
            return None  # the trained context, or chosen at load
        return self.ctx_size if self.unified_kv else self.ctx_size // (self.parallel or 4)

    @property
    def effective_max_concurrency(self) -> int:
        if self.backend in ONE_AT_A_TIME:
            return 1  # whisper-server serves one request at a time (a global mutex): the rest queue
        return self.max_concurrency or self.parallel or 4

    @property
    def command_routes(self) -> tuple[str, ...]:
        """What a ``backend = "command"`` model serves (its ``routes``, else the OpenAI ones)."""
        return tuple(self.routes) if self.routes is not None else DEFAULT_COMMAND_ROUTES

    @model_validator(mode="after")
    def _backend_keys(self) -> ModelConfig:
        """A key that means nothing to the model's server would be silently ignored: refused by
        name (the rules per backend are ``config/_backends.py``'s)."""
        problem = key_problem(self) or path_problem(self)
        if problem is not None:
            raise custom(*problem)
        return self

    @field_validator("mmproj")
    @classmethod
    def _mmproj_reference(cls, value: str | None) -> str | None:
        if value is None or value == "auto" or not value.startswith("hf:"):
            return value
        if not _HF_FILE_RE.match(value[3:]):
            raise custom(
                "mmproj_reference",
                f"mmproj {value!r} is not hf:org/repo:FILE (e.g. "
                '"hf:ggml-org/SmolVLM-500M-Instruct-GGUF:mmproj-SmolVLM-500M-Instruct-f16.gguf")',
            )
        return value

    @field_validator("args")
    @classmethod
    def _no_owned_flags(cls, args: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("backend") == "command":
            return args  # the user's own command line: forge owns none of its flags
        for arg in args:
            if arg.partition("=")[0].replace("_", "-") == "--slot-save-path":
                raise custom(
                    "owned_flag",
                    f"{arg!r} is set by forge itself and cannot be passed in args "
                    "(use keep_context = true, and [server] context_dir for where)",
                )
            key = OWNED_BY_KEY.get(normalise_flag(arg) or "")
            if key is not None:
                raise custom(
                    "owned_flag", f"{arg!r} is set by forge itself: use the model's key {key} instead"
                )
            if normalise_flag(arg) == "--media-path":
                raise custom(
                    "owned_flag",
                    f"{arg!r} is refused: file:// media would let any request read the server's files "
                    "(send images as base64 data URLs)",
                )
            if is_owned_flag(arg):
                raise custom(
                    "owned_flag",
                    f"{arg!r} is set by forge itself and cannot be passed in args "
                    "(use the model's own keys: path, ctx_size, gpu_layers, parallel, gpu)",
                )
        return args


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
