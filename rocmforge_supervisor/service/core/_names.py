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

An answer's length is one setting with four spellings (:data:`LENGTHS`), and llama-server reads
them in an order of its own (``n_predict`` before ``max_tokens``): a length in ``strip``,
``defaults`` or ``force`` is the length, whichever spelling the variant uses, and is written in
the route's own field (:data:`LENGTH_FIELD`: ``max_tokens`` for OpenAI's chat and completions and
Anthropic's messages, ``n_predict`` for the native ``/completion`` and ``/infill``,
``max_output_tokens`` for the Responses API). A forced length replaces every spelling the request
sent; a default applies only when it sent none. Routes that generate nothing (token counts,
embeddings, tokenize…) get no length.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ...config import AdapterConfig, ModelConfig, VariantConfig
from ._routes import FORWARDED

__all__ = [
    "LENGTHS",
    "LENGTH_FIELD",
    "ServedName",
    "length_field",
    "lengths_read",
    "rewrite",
    "sends_length",
    "served_names",
    "split_name",
]

_LATEST = ":latest"

#: Every field that bounds an answer's length, in any route's terms (llama-server reads
#: ``n_predict``, then ``max_completion_tokens``, then ``max_tokens``; its Responses API turns
#: ``max_output_tokens`` into ``max_tokens``).
LENGTHS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")

_OPENAI, _RESPONSES = "max_tokens", "max_output_tokens"
#: Each upstream route → the field its own API bounds an answer's length with; None for a route
#: that generates no text: the route table's column. The paths Ollama's requests are translated
#: to are among them.
LENGTH_FIELD: dict[str, str | None] = {r.path: r.length for r in FORWARDED}


def length_field(path: str) -> str | None:
    """The field that bounds an answer's length on upstream route ``path`` (its query ignored);
    None where the route generates no text. A route the table does not know is read as OpenAI's."""
    return LENGTH_FIELD.get(path.partition("?")[0], _OPENAI)


def lengths_read(path: str) -> tuple[str, ...]:
    """The length fields llama-server reads on route ``path``: Anthropic's Messages API only its
    ``max_tokens``; the Responses API all four; the others all but ``max_output_tokens``."""
    field = length_field(path)
    if field is None:
        return ()
    if path.partition("?")[0] == "/v1/messages":
        return (field,)
    return LENGTHS if field == _RESPONSES else tuple(k for k in LENGTHS if k != _RESPONSES)


def sends_length(payload: Mapping[str, Any], path: str) -> bool:
    """Whether the body bounds its answer in a field route ``path`` reads (null means unset)."""
    return any(payload.get(k) is not None for k in lengths_read(path))


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


def _length_of(rules: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """``rules`` without their length, and the length (None: they set none)."""
    length = next((rules[k] for k in LENGTHS if k in rules), None)
    return {k: v for k, v in rules.items() if k not in LENGTHS}, length


def rewrite(
    payload: dict[str, Any],
    served: ServedName,
    *,
    anthropic: bool = False,
    path: str = "/v1/chat/completions",
) -> bool:
    """Apply ``served``'s rules to a request body in llama-server's terms (in place), a length in
    upstream route ``path``'s own field; whether anything was done (then the body is serialized
    again)."""
    if served.plain:
        return False
    variant = served.variant
    field = length_field(path)
    if variant is not None:
        stripped = set(variant.strip)
        if stripped & set(LENGTHS):  # the length goes in every spelling
            stripped |= set(LENGTHS)
        for key in stripped:
            payload.pop(key, None)
        defaults, length = _length_of(variant.defaults)
        for key, value in defaults.items():
            payload.setdefault(key, value)
        if length is not None and field is not None and not sends_length(payload, path):
            payload[field] = length
    if served.adapter is not None:
        payload["lora"] = [
            {"id": i, "scale": a.scale if n == served.adapter else 0.0}
            for i, (n, a) in enumerate(served.adapters)
        ]
    if variant is not None:
        forced, length = _length_of(variant.force)
        payload.update(forced)
        if length is not None and field is not None:
            for key in LENGTHS:  # the request's own, in any spelling, would be read first
                payload.pop(key, None)
            payload[field] = length
        if variant.system:
            _add_system(payload, variant.system, anthropic or path == "/v1/messages")
    return True
