"""What the Ollama API says about a model (``/api/tags``, ``/api/show``, ``/api/ps``): Ollama's shapes.

The facts come from the neutral model modules every API shares — the GGUF card and capabilities
(:mod:`.._model_card`), the served context and modalities (:mod:`.._listing`); this module only
lays them out as Ollama's clients read them. Copilot assumes ~33k tokens of context when
``model_info.<arch>.context_length`` is missing (peers-2026-11.md §4a), so it is always filled:

* ``projector_info`` (``/api/show``): the projector's GGUF keys, as Ollama shows them.
* ``context_length``: what a request can actually use — the running child's per-slot ``n_ctx``
  when it is loaded, else the configured ``ctx_size`` (a slot's share of it with
  ``kv_unified = false``), else the GGUF's trained length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ...models import ProjectorInfo
from ..core._names import ServedName
from ..proxy._model_card import ModelCard, capabilities

__all__ = ["projector_info", "ps_entry", "show_entry", "tag_entry", "with_variant"]


def projector_info(p: ProjectorInfo) -> dict[str, Any]:
    """Ollama's ``projector_info``: the projector GGUF's keys that say what it is."""
    info: dict[str, Any] = {
        "general.architecture": "clip",
        "clip.projector_type": p.projector_type,
        "clip.has_vision_encoder": p.vision,
        "clip.has_audio_encoder": p.audio,
        "general.parameter_count": p.weights_bytes,
    }
    prefix = "clip.vision" if p.vision else "clip.audio"
    info[f"{prefix}.embedding_length"] = p.embedding_length
    info[f"{prefix}.block_count"] = p.block_count
    info[f"{prefix}.attention.head_count"] = p.head_count
    if p.vision:
        info["clip.vision.image_size"] = p.image_size
        info["clip.vision.patch_size"] = p.patch_size
    return info


def _details(card: ModelCard | None) -> dict[str, Any]:
    if card is None:
        return {
            "format": "gguf",
            "family": "",
            "families": [],
            "parameter_size": "",
            "quantization_level": "",
        }
    return {
        "parent_model": "",
        "format": "gguf",
        "family": card.architecture,
        "families": [card.architecture],
        "parameter_size": card.parameter_size,
        "quantization_level": card.quantization,
    }


def tag_entry(name: str, card: ModelCard | None, caps: list[str] | None = None) -> dict[str, Any]:
    extra = {"capabilities": caps} if caps is not None else {}
    return {
        **extra,
        "name": name,
        "model": name,
        "modified_at": card.modified_at if card else "1970-01-01T00:00:00Z",
        "size": card.size if card else 0,
        "digest": card.digest if card else "",
        "details": _details(card),
    }


def show_entry(
    card: ModelCard,
    args: list[str],
    context_length: int | None,
    modalities: Sequence[str] = (),
    projector: ProjectorInfo | None = None,
    caps: list[str] | None = None,
) -> dict[str, Any]:
    """``caps``: the capabilities as the listings report them (``ModelFacts.capabilities``: the
    ``tools`` and ``rerank`` keys, the child's template); None: from the card alone."""
    arch = card.architecture
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.parameter_count": card.parameter_count,
        "general.file_type": card.quantization,
        f"{arch}.embedding_length": card.embedding_length,
    }
    ctx = context_length or card.trained_ctx
    if ctx:
        info[f"{arch}.context_length"] = ctx
    extra = {"projector_info": projector_info(projector)} if projector is not None else {}
    return {
        **extra,
        "license": "",
        "modelfile": f"# served by forge from {card.path}\nFROM {card.path}\n",
        "parameters": "",
        "template": card.template,
        "details": _details(card),
        "model_info": info,
        "capabilities": caps if caps is not None else capabilities(card, args, modalities),
        "modified_at": card.modified_at,
    }


def ps_entry(
    name: str, card: ModelCard | None, status: dict[str, Any], context_length: int | None, ttl: float
) -> dict[str, Any]:
    memory = status.get("memory") or {}
    per_device = dict(memory.get("estimated_bytes") or {})
    if memory.get("actual_bytes"):  # its allocations, plus the GPU backend's context (no log line has it)
        context = memory.get("context_bytes") or {}
        per_device = {k: int(v) + int(context.get(k, 0)) for k, v in memory["actual_bytes"].items()}
    total = sum(int(v) for v in per_device.values())
    vram = sum(int(v) for k, v in per_device.items() if not str(k).startswith("cpu"))
    if ttl > 0:
        expires = datetime.fromtimestamp(datetime.now(UTC).timestamp() + ttl, UTC)
    else:
        expires = datetime(2318, 1, 1, tzinfo=UTC)  # what Ollama reports for "never"
    return {
        **tag_entry(name, card),
        "size": total or (card.size if card else 0),
        "size_vram": vram,
        "expires_at": expires.isoformat().replace("+00:00", "Z"),
        "context_length": context_length or (card.trained_ctx if card else None),
    }


def with_variant(entry: dict[str, Any], served: ServedName) -> dict[str, Any]:
    """``/api/show`` of a variant: its model's entry with the variant's rules as a Modelfile would
    show them (``parameters``: ``defaults`` and ``force``, one ``key value`` a line; ``system``)."""
    v = served.variant
    if v is None:
        return entry
    rules = {**v.defaults, **v.force}
    lines = [f"{k} {val if isinstance(val, str) else json.dumps(val)}" for k, val in rules.items()]
    out = {**entry, "parameters": "\n".join(lines)}
    modelfile = entry.get("modelfile", "") + "".join(f"PARAMETER {line}\n" for line in lines)
    if v.system:
        out["system"] = v.system
        modelfile += f'SYSTEM """{v.system}"""\n'
    out["modelfile"] = modelfile
    return out
