"""``[models.NAME]`` with its variants and adapters: one model the service serves. Its keys are
the ones every backend reads and, each in its own class, llama-server's (``_llama_keys``) and a
command's (``_command_keys``); ``_backends.key_problem`` refuses a key on a backend that lacks it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .._argv import OWNED_BY_KEY, is_owned_flag, normalise_flag, resolve_kv_unified
from ._backends import (
    BACKEND_NAMES,
    CONFIGURABLE,
    DEFAULT_COMMAND_ROUTES,
    ONE_AT_A_TIME,
    BackendName,
    key_problem,
    path_problem,
)
from ._command_keys import CommandKeys
from ._explain import custom
from ._fields import (
    GpuChoiceField,
    _Section,
)
from ._llama_keys import LlamaKeys
from ._model_keys import AdapterConfig, VariantConfig
from ._speculative import speculative_problem
from ._variants import served_names_problem

__all__ = ["NOT_IN_FINGERPRINT", "AdapterConfig", "ModelConfig", "VariantConfig"]

NOT_IN_FINGERPRINT = frozenset(
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


def _backend(value: Any) -> Any:
    """The backends a ``[models.*]`` entry may name, listed in the error (a peer's models come
    from ``[peers.*]``: ``backend = "peer"`` gets its own error, naming that)."""
    if value not in BACKEND_NAMES:
        choices = ", ".join(repr(b) for b in CONFIGURABLE[:-1]) + f" or {CONFIGURABLE[-1]!r}"
        raise custom("backend", f"Input should be {choices}")
    return value


class _Identity(_Section):
    """What the model is and which server runs it: first, as a ``[models.*]`` entry reads."""

    path: str = Field(default="", min_length=1)
    """A GGUF path, an embedded default's name (``gemma-3-270m``) or ``hf:org/repo:QUANT``; for
    ``backend = "command"`` what ``${MODEL}`` stands for (empty when ``cmd`` does not use it)."""
    backend: Annotated[BackendName, BeforeValidator(_backend)] = "llama"
    """The server that runs it: ``llama`` (llama-server), ``whisper`` (whisper.cpp's
    whisper-server, for a whisper GGML model: speech to text on ``/v1/audio/transcriptions`` and
    ``/v1/audio/translations``; it serves one request at a time, so ``max_concurrency`` is 1), or
    ``command``: any OpenAI-compatible server, started as ``cmd`` (vLLM, SGLang, koboldcpp,
    another llama-server build…); then ``path`` is what ``${MODEL}`` stands for."""


class ModelConfig(CommandKeys, LlamaKeys, _Identity):
    """``[models.NAME]``: one model the service can serve under ``NAME``. The keys every backend
    reads are here; llama-server's own are :class:`LlamaKeys`, a command's :class:`CommandKeys`
    (``_backends.key_problem`` refuses them on another backend's model)."""

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
    capture: bool | None = None
    """This model's ``server.capture`` (keep request and response bodies in the activity log)."""
    args: list[str] = Field(default_factory=list)
    """Extra llama-server arguments; flags forge sets itself are refused."""
    tools: bool | None = None
    """The ``tools`` capability in ``/v1/models`` and ``/api/show``: None from the chat template
    (the running child's ``/props``), false hides it (and tool requests get a 400), true shows it."""
    variants: dict[str, VariantConfig] = Field(default_factory=dict)
    """``[models.X.variants.Y]``: ``X:Y``, the same child with request rules of its own."""

    @model_validator(mode="after")
    def _backend_keys(self) -> ModelConfig:
        """A key that means nothing to the model's server would be silently ignored: refused by
        name, before any rule among the keys of one backend (the rules per backend are
        ``config/_backends.py``'s)."""
        problem = key_problem(self) or path_problem(self)
        if problem is not None:
            raise custom(*problem)
        return self

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
