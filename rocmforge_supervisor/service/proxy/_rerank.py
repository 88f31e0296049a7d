"""Reranking models (``rerank = true``) and the routes they answer.

A child started with ``--reranking`` computes one relevance score per (query, document) pair:
it answers ``/v1/rerank``, ``/rerank`` (and ``/v1/reranking``, ``/reranking``) in the shapes the
pinned llama-server takes — Jina's and Cohere's ``{query, documents, top_n}``, TEI's
``{query, texts}`` — and generates no text. The gateway refuses the mismatches before a request is
queued, with a 400 that names the key: a chat or completion request to a reranker, and a rerank
request to a model that is not one (llama-server would answer the latter with its own 501 "Start
it with `--reranking`", which names a flag the user does not set under forge).
"""

from __future__ import annotations

from ..._argv import normalise_flag
from ..._errors import InvalidRequest
from ...config import ModelConfig
from ...supervisor import backend_of
from ..core._routes import FORWARDED

__all__ = ["RERANK_ROUTES", "refuse_wrong_kind", "reranks"]

#: The reranking routes, and those that generate text (Ollama's /api/chat and /api/generate
#: arrive as the first ones): the route table's.
RERANK_ROUTES = frozenset(r.path for r in FORWARDED if r.rerank)
_GENERATING = frozenset(r.path for r in FORWARDED if r.generates)


def reranks(config: ModelConfig) -> bool:
    """``rerank = true``, or the old way: ``--reranking`` in ``args``."""
    return config.rerank or any(normalise_flag(a) in ("--rerank", "--reranking") for a in config.args)


def refuse_wrong_kind(name: str, config: ModelConfig, path: str) -> None:
    """A 400 (:class:`InvalidRequest`) when route ``path`` is not what llama-server model ``name``
    does: text generation from a reranker, reranking from a model that does not rerank."""
    if not backend_of(config).has_slots:
        return  # not llama-server: a command's routes are its own (``routes``), whisper's are audio
    if path in _GENERATING and reranks(config):
        raise InvalidRequest(
            f"model {name!r} is a reranker (rerank = true in [models.{name}]): it answers "
            f"POST /v1/rerank and /rerank, not {path}",
            param="model",
            hint="send chat and completions to a model without rerank = true; rerank with "
            'POST /v1/rerank {"model", "query", "documents"}',
        )
    if path in RERANK_ROUTES and not reranks(config):
        raise InvalidRequest(
            f"model {name!r} does not rerank: [models.{name}] has no rerank = true "
            "(its llama-server runs without --reranking)",
            param="model",
            hint="name a reranker of GET /v1/models, or set rerank = true on a reranker GGUF's model",
        )
