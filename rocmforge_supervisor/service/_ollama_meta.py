"""What the Ollama API says about a model (``/api/tags``, ``/api/show``, ``/api/ps``), from its GGUF.

Clients decide from these fields whether and how to offer a model: VS Code Copilot hides a model
whose ``/api/show`` lacks ``"tools"`` in ``capabilities`` and assumes ~33k tokens of context when
``model_info.<arch>.context_length`` is missing (peers-2026-11.md §4a). So the fields are real:

* ``capabilities``: ``completion`` unless the model only embeds; ``tools`` when its chat template
  handles tools *and* llama-server runs it with jinja (without jinja, llama-server refuses tools);
  ``embedding`` for embedding models or children started with ``--embeddings``; ``insert`` when the
  vocabulary has fill-in-the-middle tokens (``/infill`` works); ``vision`` / ``audio`` when the model
  has a projector (``mmproj``) that takes them: the running child's ``/props.modalities``, else the
  projector file's own encoders (Copilot and Open WebUI offer image input only then).
* ``projector_info`` (``/api/show``): the projector's GGUF keys, as Ollama shows them.
* ``context_length``: what a request can actually use — the running child's per-slot ``n_ctx``
  when it is loaded, else the configured ``ctx_size`` (divided by ``parallel``), else the GGUF's
  trained length.
* ``digest``: a hash of the file's path, size and mtime — it changes when the file does, but it is
  not Ollama's content hash (hashing a multi-GB file for a listing would take minutes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._argv import EMBEDDING_ARCHITECTURES
from .._errors import ForgeError
from ..config import ForgeSettings, get_settings
from ..models._catalog import embedded_models, ensure_embedded
from ..models._gguf import inspect_gguf, read_gguf_keys
from ..models._projector import ProjectorInfo, inspect_projector

__all__ = [
    "ModelCard",
    "capabilities",
    "card_for",
    "local_model_path",
    "projector_for",
    "projector_info",
    "ps_entry",
    "show_entry",
    "tag_entry",
]

_FIM_KEYS = ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id")
_TEMPLATE_KEY = "tokenizer.chat_template"


@dataclass(frozen=True)
class ModelCard:
    """GGUF facts about one model file (read once per file version, then cached)."""

    path: Path
    size: int
    modified_at: str
    digest: str
    architecture: str
    parameter_count: int
    parameter_size: str
    quantization: str
    trained_ctx: int | None
    embedding_length: int
    template: str
    fim: bool
    pooling: bool


_CACHE: dict[tuple[str, int, int], ModelCard] = {}


def _param_size(n: int, label: str | None) -> str:
    if label:
        return label
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def local_model_path(ref: str, settings: ForgeSettings | None) -> Path | None:
    """A configured model's file when it is on disk (an existing path or an embedded model);
    None for a hub reference not fetched yet — a listing must never start a download."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path.absolute()
    if ref in embedded_models():
        try:
            return ensure_embedded(ref, settings or get_settings())
        except ForgeError:
            return None
    return None


def card_for(path: Path) -> ModelCard:
    """The card of a local GGUF (blocking: call in a thread). Raises like :func:`inspect_gguf`."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    info = inspect_gguf(path)
    arch = info.architecture
    extra = read_gguf_keys(path, (_TEMPLATE_KEY, *_FIM_KEYS, f"{arch}.pooling_type"))
    card = ModelCard(
        path=path,
        size=info.file_size_bytes,
        modified_at=datetime.fromtimestamp(st.st_mtime, UTC).isoformat().replace("+00:00", "Z"),
        digest=hashlib.sha256(repr(key).encode()).hexdigest(),
        architecture=arch,
        parameter_count=info.parameter_count,
        parameter_size=_param_size(info.parameter_count, info.size_label),
        quantization=info.file_type,
        trained_ctx=info.context_length,
        embedding_length=info.embedding_length,
        template=str(extra.get(_TEMPLATE_KEY) or ""),
        fim=any(k in extra for k in _FIM_KEYS),
        pooling=bool(extra.get(f"{arch}.pooling_type")),
    )
    _CACHE[key] = card
    return card


_PROJECTORS: dict[tuple[str, int, int], ProjectorInfo] = {}


def projector_for(path: Path) -> ProjectorInfo:
    """The projector at ``path``, read once per file version (blocking: call in a thread)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _PROJECTORS:
        _PROJECTORS[key] = inspect_projector(path)
    return _PROJECTORS[key]


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


def capabilities(card: ModelCard, args: list[str], modalities: Sequence[str] = ()) -> list[str]:
    embedding_only = card.architecture in EMBEDDING_ARCHITECTURES
    caps = [] if embedding_only else ["completion"]
    no_jinja = "--no-jinja" in args
    if not embedding_only and card.template and "tools" in card.template and not no_jinja:
        caps.append("tools")
    if embedding_only or card.pooling or any(a in ("--embedding", "--embeddings") for a in args):
        caps.append("embedding")
    if card.fim and not embedding_only:
        caps.append("insert")
    if not embedding_only:
        caps += [m for m in ("vision", "audio") if m in modalities]
    return caps


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
) -> dict[str, Any]:
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
        "capabilities": capabilities(card, args, modalities),
        "modified_at": card.modified_at,
    }


def ps_entry(
    name: str, card: ModelCard | None, status: dict[str, Any], context_length: int | None, ttl: float
) -> dict[str, Any]:
    memory = status.get("memory") or {}
    per_device = memory.get("actual_bytes") or memory.get("estimated_bytes") or {}
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
