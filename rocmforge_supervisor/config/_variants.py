"""The names a model is served under besides its own: ``X:VARIANT`` (``[models.X.variants.*]``)
and ``X:ADAPTER`` (``[models.X.adapters.*]``), and the rules that keep each name meaning one thing.

A served name has one level: ``X:Y`` where ``X`` is a ``[models.*]`` name (which never holds a
``:``, see ``MODEL_NAME``) and ``Y`` is one of its variants *or* one of its adapters, never both.
A variant that should run with an adapter names it (``adapter = "NAME"``) instead of a second
level (``X:Y:NAME``). ``latest`` is refused as a name: Ollama clients send ``X:latest`` for ``X``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._argv import LORA_FLAGS, normalise_flag
from ._names import MODEL_NAME

if TYPE_CHECKING:
    from ._schema import ModelConfig

__all__ = ["served_names_problem"]


def served_names_problem(model: ModelConfig) -> tuple[str, str] | None:
    """(kind, one sentence with the fix) for a variant or adapter name that cannot be served as
    ``X:NAME``, or a variant that names no adapter of the model; None when all are fine."""
    # adapters on another backend: config/_backends.py's LLAMA_ONLY refuses them (one table)
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
        if variant.adapter is not None and variant.adapter not in model.adapters:
            known = ", ".join(sorted(model.adapters)) or "none"
            return "variant_adapter", (
                f"variant {name!r} has adapter = {variant.adapter!r}, which is no [adapters.*] of the "
                f"model (adapters: {known})"
            )
    return None
