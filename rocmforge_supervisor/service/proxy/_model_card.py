"""What a model file says about the model: its card (GGUF facts) and its capabilities.

Every API that describes a model reads these: ``/v1/models`` (:mod:`._listing`), Ollama's
``/api/tags``, ``/api/show`` and ``/api/ps`` (:mod:`.ollama`), and the tools check (:mod:`._tools`),
so what a client is told up front and what a request meets are the same. Clients decide from
them whether and how to offer a model: VS Code Copilot hides a model whose ``capabilities`` lack
``"tools"`` (peers-2026-11.md §4a). So the fields are real:

* ``capabilities``: ``completion`` unless the model only embeds; ``tools`` when its chat template
  handles tools *and* llama-server runs it with jinja (without jinja, llama-server refuses tools);
  ``embedding`` for embedding models or children started with ``--embeddings``; ``insert`` when the
  vocabulary has fill-in-the-middle tokens (``/infill`` works); ``vision`` / ``audio`` when the model
  has a projector (``mmproj``) that takes them (the caller says which: :mod:`._listing`).
* ``digest``: a hash of the file's path, size and mtime — it changes when the file does, but it is
  not Ollama's content hash (hashing a multi-GB file for a listing would take minutes).

Cards and projectors are read once per file version (path, size, mtime), then cached.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..._argv import EMBEDDING_ARCHITECTURES
from ..._errors import ForgeError
from ...config import ForgeSettings, get_settings
from ...models._catalog import embedded_models, ensure_embedded
from ...models._gguf import inspect_gguf, read_gguf_keys
from ...models._projector import ProjectorInfo, inspect_projector

__all__ = ["ModelCard", "capabilities", "card_for", "local_model_path", "projector_for"]

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


def capabilities(
    card: ModelCard,
    args: list[str],
    modalities: Sequence[str] = (),
    *,
    tools: bool | None = None,
    rerank: bool = False,
) -> list[str]:
    """``tools``: what the running child's chat template says (``/props``) or the model's
    ``tools`` key; None: the GGUF's template decides. ``rerank``: a reranker, which only reranks."""
    if rerank:
        return ["rerank"]
    embedding_only = card.architecture in EMBEDDING_ARCHITECTURES
    caps = [] if embedding_only else ["completion"]
    no_jinja = "--no-jinja" in args
    from_template = bool(card.template and "tools" in card.template)
    if not embedding_only and not no_jinja and (from_template if tools is None else tools):
        caps.append("tools")
    if embedding_only or card.pooling or any(a in ("--embedding", "--embeddings") for a in args):
        caps.append("embedding")
    if card.fim and not embedding_only:
        caps.append("insert")
    if not embedding_only:
        caps += [m for m in ("vision", "audio") if m in modalities]
    return caps
