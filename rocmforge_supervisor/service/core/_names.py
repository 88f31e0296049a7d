"""The name a request asks for → the configured model that serves it, and what that name changes
in the request: the one place every dialect (OpenAI, Anthropic, Ollama, native) resolves a name.

``X`` is ``[models.X]``; ``X:latest`` is ``X`` (Ollama clients add the tag); ``X:Y`` is X's variant
or LoRA adapter ``Y`` (``config/_variants.py`` keeps the two apart). A variant or an adapter is no
model of its own: it is served by X's child, through X's queue, TTL and placement; only the body
sent to the child differs (:func:`rewrite`).

The rewrite, in order: ``strip`` (the variant's fields removed from the request), ``defaults``
(set where the request has none), the adapter (``lora`` set to every adapter of X, the named one
at its ``scale`` and the others at 0 — over a ``lora`` the request brought, since the name already
says which adapter), ``force`` (set over anything before it, so a variant's ``force`` may even set
``lora`` itself), then ``system`` (put first unless the request brings a system prompt). A request
to plain ``X`` goes unchanged (its own ``lora`` too). A variant with ``adapter = "NAME"`` applies
both. The keys are request fields in llama-server's terms: an Ollama request is translated first
(``options.num_predict`` is ``max_tokens`` by then), so one variant means the same on every route.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...config import AdapterConfig, ModelConfig, VariantConfig

__all__ = ["ServedName", "rewrite", "served_names", "split_name"]

_LATEST = ":latest"


@dataclass(frozen=True)
class ServedName:
    """What an asked name means: the model that serves it and the rules its requests get."""

    asked: str
    """The name as served (``X``, ``X:json``; an Ollama ``:latest`` dropped)."""
    model: str
    """The ``[models.*]`` entry whose child answers."""
    variant: VariantConfig | None = None
    adapter: str | None = None
    """The adapter applied (``X:ADAPTER``, or the variant's ``adapter``)."""
    adapters: tuple[tuple[str, AdapterConfig], ...] = ()
    """All of the model's adapters, in the child's ``--lora`` order (their ids)."""

    @property
    def plain(self) -> bool:
        """The model itself: nothing to rewrite."""
        return self.variant is None and self.adapter is None


def split_name(asked: str, known: Collection[str], config_of: Callable[[str], ModelConfig]) -> ServedName:
    """The model and view ``asked`` names. A name that is no model, variant or adapter comes back
    as itself (the model lookup then gives the 404 naming the known models)."""
    if asked in known:
        return ServedName(asked, asked)
    name = asked[: -len(_LATEST)] if asked.endswith(_LATEST) else asked
    if name in known:
        return ServedName(name, name)
    parent, colon, sub = name.partition(":")
    if not colon or parent not in known:
        return ServedName(asked, asked)
    config = config_of(parent)
    adapters = tuple(config.adapters.items())
    if sub in config.variants:
        variant = config.variants[sub]
        return ServedName(name, parent, variant, variant.adapter, adapters)
    if sub in config.adapters:
        return ServedName(name, parent, None, sub, adapters)
    return ServedName(asked, asked)


def served_names(name: str, config: ModelConfig) -> list[str]:
    """The names model ``name`` is also served under, in config order: variants, then adapters."""
    return [f"{name}:{v}" for v in config.variants] + [f"{name}:{a}" for a in config.adapters]


def _has_system(payload: Mapping[str, Any]) -> bool:
    if payload.get("system") or payload.get("instructions"):
        return True
    for key in ("messages", "input"):
        items = payload.get(key)
        if isinstance(items, list) and any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in items
        ):
            return True
    return False


def _add_system(payload: dict[str, Any], system: str, anthropic: bool) -> None:
    """The variant's system prompt, where the route's shape keeps one: Anthropic's ``system``,
    the Responses API's ``instructions``, a chat's first message. A plain completion (``prompt``)
    has no place for one and is left as it is."""
    if _has_system(payload):
        return
    if anthropic:
        payload["system"] = system
    elif isinstance(payload.get("messages"), list):
        payload["messages"] = [{"role": "system", "content": system}, *payload["messages"]]
    elif "input" in payload:
        payload["instructions"] = system


def rewrite(payload: dict[str, Any], served: ServedName, *, anthropic: bool = False) -> bool:
    """Apply ``served``'s rules to a request body in llama-server's terms (in place); whether
    anything was done (then the body is serialized again)."""
    if served.plain:
        return False
    variant = served.variant
    if variant is not None:
        for key in variant.strip:
            payload.pop(key, None)
        for key, value in variant.defaults.items():
            payload.setdefault(key, value)
    if served.adapter is not None:
        payload["lora"] = [
            {"id": i, "scale": a.scale if n == served.adapter else 0.0}
            for i, (n, a) in enumerate(served.adapters)
        ]
    if variant is not None:
        payload.update(variant.force)
        if variant.system:
            _add_system(payload, variant.system, anthropic)
    return True
