"""The names a model is served under besides its own: ``X:VARIANT`` (``[models.X.variants.*]``)
and ``X:ADAPTER`` (``[models.X.adapters.*]``), and the rules that keep each name meaning one thing.

A served name has one level: ``X:Y`` where ``X`` is a ``[models.*]`` name (which never holds a
``:``, see ``MODEL_NAME``) and ``Y`` is one of its variants *or* one of its adapters, never both.
A variant that should run with an adapter names it (``adapter = "NAME"``) instead of a second
level (``X:Y:NAME``). ``latest`` is refused as a name: Ollama clients send ``X:latest`` for ``X``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._argv import LORA_FLAGS, normalise_flag
from .._errors import ModelNotFound
from ._names import MODEL_NAME

if TYPE_CHECKING:
    from ._model_keys import ModelKeys

__all__ = ["served_names_problem", "unknown_served_name"]

#: The fields that bound an answer's length (the gateway writes one in each route's own terms).
_LENGTHS = ("max_tokens", "max_completion_tokens", "n_predict", "max_output_tokens")


def served_names_problem(model: ModelKeys) -> tuple[str, str] | None:
    """(kind, one sentence with the fix) for a variant or adapter name that cannot be served as
    ``X:NAME``, or a variant that names no adapter of the model; None when all are fine."""
    # adapters on another backend: they are LlamaKeys, which config/_backends.py refuses on another backend
    for kind, names in (("variant", model.variants), ("adapter", model.adapters)):
        for name in names:
            if not MODEL_NAME.fullmatch(name) or name == "latest":
                return "served_name", (
                    f"{kind} name {name!r} cannot be served as MODEL:{name}: use letters, digits, "
                    "'.', '_' or '-' (no ':'), and not 'latest' (Ollama's name for the model itself)"
                )
    for name, adapter in model.adapters.items():
        hub = adapter.path.startswith("hf:")  # its ':' are the reference's, not the file's
        bad = "," if "," in adapter.path else ":" if ":" in adapter.path and not hub else None
        if bad is not None:
            return "adapter_path", (
                f"adapter {name!r} has a {bad!r} in its path {adapter.path!r}: llama-server's "
                "--lora-scaled takes FILE:SCALE,FILE:SCALE; rename the file or its folder"
            )
    owned = next((a for a in model.args if normalise_flag(a) in LORA_FLAGS), None)
    if model.adapters and owned is not None:
        return "duplicate_flag", (
            f"args has {owned!r}, which [adapters.*] already set (all adapters loaded, none applied): "
            "remove it from args and list each adapter as [models.NAME.adapters.ADAPTER]"
        )
    both = sorted(set(model.variants) & set(model.adapters))
    if both:
        return "served_name", (
            f"{both[0]!r} is both a variant and an adapter of the model: MODEL:{both[0]} must mean one; "
            f'rename one (a variant can apply the adapter with adapter = "{both[0]}")'
        )
    for name, variant in model.variants.items():
        for table, rules in (("force", variant.force), ("defaults", variant.defaults)):
            lengths = [k for k in _LENGTHS if k in rules]
            if len(lengths) > 1:
                return "variant_length", (
                    f"variant {name!r} sets the answer's length twice in {table} ({', '.join(lengths)}): "
                    "keep one (it is written in each route's own field: max_tokens, n_predict…)"
                )
        if variant.adapter is not None and variant.adapter not in model.adapters:
            known = ", ".join(sorted(model.adapters)) or "none"
            return "variant_adapter", (
                f"variant {name!r} has adapter = {variant.adapter!r}, which is no [adapters.*] of the "
                f"model (adapters: {known})"
            )
    return None


def _did_you_mean(asked: str, names: list[str]) -> str:
    guess = difflib.get_close_matches(asked, names, n=1, cutoff=0.6)
    return f" — did you mean {guess[0]!r}?" if guess else ""


def unknown_served_name(asked: str, models: Mapping[str, ModelKeys]) -> ModelNotFound:
    """The 404 for a name that is no model, variant or adapter: the closest served name ("did you
    mean 'x:terse'?") and, for ``X:Y`` of a configured ``X``, the names ``X`` is served under."""
    parent, colon, sub = asked.partition(":")
    config = models.get(parent) if colon else None
    if config is None:
        names = [n for m, c in models.items() for n in (m, *(f"{m}:{v}" for v in (*c.variants, *c.adapters)))]
        known = ", ".join(sorted(models)) or "none configured"
        return ModelNotFound(
            f"model {asked!r} is not configured" + _did_you_mean(asked, names), hint=f"known models: {known}"
        )
    own = [f"{parent}:{n}" for n in (*config.variants, *config.adapters)]
    if not own:
        return ModelNotFound(
            f"model {asked!r} is not configured: {parent} has no variants or adapters",
            hint=f"serve {parent} itself, or add [models.{parent}.variants.{sub}] to the config",
        )
    listed = "; ".join(
        f"{kind}: {', '.join(f'{parent}:{n}' for n in names)}"
        for kind, names in (("variants", config.variants), ("adapters", config.adapters))
        if names
    )
    return ModelNotFound(
        f"model {asked!r} is not configured: {parent} has no variant or adapter {sub!r}"
        + _did_you_mean(asked, own),
        hint=f"{parent}'s {listed}",
    )
