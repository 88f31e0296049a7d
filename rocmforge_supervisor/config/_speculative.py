"""The rules of a model's speculative-decoding and reranking keys (``draft``, ``draft_max``,
``draft_min``, ``draft_gpu``, ``speculative``, ``rerank``), and the llama-server flags each key
owns, so that ``args`` cannot set the same thing a second time (which one would win is llama.cpp's
argument order, not what the config says).

The speculative types are the pinned llama-server's ``--spec-type`` values (4df29be,
``common/speculative.cpp``): a draft model is used only when a ``draft-*`` type is named — with
``--spec-draft-model`` alone (and no MTP/DFlash metadata in the draft GGUF) the pinned server loads
the draft and never drafts, so forge adds ``draft-simple`` when ``speculative`` is unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._argv import normalise_flag

if TYPE_CHECKING:
    from ._model_keys import ModelKeys

__all__ = ["DRAFT_TYPES", "KEY_FLAGS", "NGRAM_TYPES", "SPEC_TYPES", "spec_types", "speculative_problem"]

#: Types that run a second model (a draft GGUF, or ``draft-mtp``'s head inside the model itself).
DRAFT_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
#: Types that draft from the text already seen: no second model, no memory of note.
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SPEC_TYPES = DRAFT_TYPES + NGRAM_TYPES
#: Types that need a ``draft`` file (``draft-mtp`` uses the model's own layers).
_NEEDS_DRAFT_FILE = frozenset(DRAFT_TYPES) - {"draft-mtp"}

#: key → the llama-server flags (every spelling at the pin) forge sets from it.
KEY_FLAGS: Mapping[str, frozenset[str]] = {
    "draft": frozenset(
        {"--spec-draft-model", "-md", "--model-draft", "--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"}
    ),
    "draft_max": frozenset({"--spec-draft-n-max"}),
    "draft_min": frozenset({"--spec-draft-n-min"}),
    "draft_gpu": frozenset(
        {"--spec-draft-device", "-devd", "--device-draft", "--spec-draft-ngl", "-ngld", "--gpu-layers-draft"}
        | {"--n-gpu-layers-draft"}
    ),
    "speculative": frozenset({"--spec-type"}),
    "rerank": frozenset({"--rerank", "--reranking"}),
}


def spec_types(value: str | None) -> list[str]:
    """``speculative``'s comma-separated types, in order, without blanks."""
    return [t.strip() for t in (value or "").split(",") if t.strip()]


def _set(model: ModelKeys, key: str) -> bool:
    value = getattr(model, key)
    if key == "draft_gpu":
        return model.draft is not None  # forge places the draft whenever there is one
    return value not in (None, False)


def _duplicate_in_args(model: ModelKeys) -> tuple[str, str] | None:
    for arg in model.args:
        flag = normalise_flag(arg)
        for key, flags in KEY_FLAGS.items():
            if flag in flags and _set(model, key):
                return "duplicate_flag", (
                    f"args has {arg!r}, which the key {key} already sets: remove it from args (keep the key)"
                )
    return None


def speculative_problem(model: ModelKeys) -> tuple[str, str] | None:
    """(kind, one sentence with the fix) for keys that cannot work together; None when they can."""
    types = spec_types(model.speculative)
    unknown = [t for t in types if t not in SPEC_TYPES]
    if unknown or (model.speculative is not None and not types):
        return "speculative", (
            f"speculative {model.speculative!r} names {unknown[0] if unknown else 'no type'!r}: "
            f"use a comma-separated list of {', '.join(SPEC_TYPES)}"
        )
    needs_file = [t for t in types if t in _NEEDS_DRAFT_FILE]
    if needs_file and model.draft is None:
        return "speculative", (
            f"speculative {needs_file[0]!r} needs a draft model: set draft = PATH (or use draft-mtp "
            "or an ngram-* type, which need none)"
        )
    drafting = model.draft is not None or any(t in DRAFT_TYPES for t in types)
    for key in ("draft_max", "draft_min"):
        if getattr(model, key) is not None and not drafting:
            return "speculative", (
                f'{key} applies to a draft model: set draft = PATH (or speculative = "draft-mtp"), '
                f"or remove {key}"
            )
    if model.draft_gpu != "auto" and model.draft is None:
        return "speculative", "draft_gpu places a draft model: set draft = PATH, or remove draft_gpu"
    if model.draft_min is not None and model.draft_max is not None and model.draft_min > model.draft_max:
        return "speculative", (
            f"draft_min ({model.draft_min}) is above draft_max ({model.draft_max}): lower draft_min"
        )
    if model.rerank and (drafting or types):
        return "rerank", "a rerank = true model generates no text: remove draft and speculative from it"
    if model.rerank and model.embeddings:
        return "rerank", (
            "rerank = true and embeddings = true need different poolings: serve them as two models "
            "(the same path under two names)"
        )
    return _duplicate_in_args(model)
