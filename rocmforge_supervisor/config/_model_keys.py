"""What the checks of a ``[models.NAME]`` entry read of it: its variant and adapter sections, and
:class:`ModelKeys`, a narrow protocol ``ModelConfig`` satisfies. The checks (``_backends``,
``_speculative``, ``_variants``) take it instead of ``ModelConfig``, whose validators call them:
so no module imports the other back, not even for its annotations.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from ._fields import _Section

__all__ = ["AdapterConfig", "ModelKeys", "VariantConfig"]


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


class ModelKeys(Protocol):
    """The keys of a ``[models.*]`` entry its checks read by name (others through ``getattr``);
    read-only, so ``ModelConfig``'s narrower types (``backend``'s literal) satisfy them."""

    @property
    def path(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def args(self) -> list[str]: ...

    @property
    def max_concurrency(self) -> int | None: ...

    @property
    def embeddings(self) -> bool: ...

    @property
    def cmd(self) -> list[str]: ...

    @property
    def health(self) -> str | None: ...

    @property
    def ready_log(self) -> str | None: ...

    @property
    def draft(self) -> str | None: ...

    @property
    def draft_max(self) -> int | None: ...

    @property
    def draft_min(self) -> int | None: ...

    @property
    def draft_gpu(self) -> str: ...

    @property
    def speculative(self) -> str | None: ...

    @property
    def rerank(self) -> bool: ...

    @property
    def variants(self) -> dict[str, VariantConfig]: ...

    @property
    def adapters(self) -> dict[str, AdapterConfig]: ...

    @property
    def command_routes(self) -> tuple[str, ...]: ...
