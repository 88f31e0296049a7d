"""The keys of a ``[models.NAME]`` entry that only llama-server reads: its context, slots and
layers, what it keeps across loads, its projector, workers, speculative decoding, reranking and
LoRA adapters.

Their own class so that the backend a key belongs to is said once, where the key is: a key of
this class set on a whisper or command model is refused by name (``_backends.key_problem`` walks
this class's fields), and a key added here is covered the day it is added.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator

from ._explain import custom
from ._fields import _HF_FILE_RE, CtxSizeField, GpuLayersField, _empty_is_none, _Section
from ._model_keys import AdapterConfig

__all__ = ["LlamaKeys"]


class LlamaKeys(_Section):
    """llama-server's keys of ``[models.NAME]`` (``backend = "llama"``, the default)."""

    ctx_size: CtxSizeField = None
    """Tokens of KV cache (shared by the slots, or split among them with ``kv_unified = false``);
    0: the model's trained context; ``"auto"``: the largest context that fits the devices the
    model is placed on, beside what stays loaded, capped by the trained context and chosen again
    at each load. None: ``[supervisor] ctx_size``, else the trained context."""
    ctx_min: int | None = Field(default=None, ge=256)
    """With ``ctx_size = "auto"``: the fewest tokens one request must be able to use (default
    ``[supervisor] ctx_min``, 2048); below it the load is refused, saying what it needs."""
    gpu_layers: GpuLayersField = None
    """None: forge decides from the memory estimate; or a number, ``"auto"`` (llama-server fits),
    ``"all"``."""
    parallel: int | None = Field(default=None, ge=1)
    kv_unified: bool | None = None
    """One KV cache of ``ctx_size`` tokens shared by all ``parallel`` slots (``--kv-unified``), so
    that one request can use the whole context: forge's default (None), as it is llama-server's
    with automatic slots. ``false``: each slot gets ``ctx_size / parallel`` tokens of its own, so
    concurrent requests can never crowd each other out of the cache, but none can be longer."""
    sleep_idle: int | None = Field(default=None, ge=1)
    """Idle seconds after which the child frees its model, context and projector but keeps running
    (llama-server's ``--sleep-idle-seconds``); the next request reloads them. None: never."""
    embeddings: bool = False
    """Serve ``/v1/embeddings``: starts llama-server with ``--embeddings`` and, unless ``args``
    choose one, ``--pooling mean`` (OpenAI-shaped embeddings need a pooled vector)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Default ``max_tokens`` for chat/completions requests that send none (None: to the end of
    the slot's context)."""
    keep_context: bool = False
    """Save the child's KV-cache slots when forge stops it on purpose (ttl, unload, eviction, a
    restarting reload, shutdown) and restore them into its next child before the first request:
    a resumed conversation skips its prefill. Off by default: the files are big and hold prompts."""
    keep_conversations: bool = False
    """With ``keep_context``: also save each long chat turn's state per conversation (and API key)
    and restore it into a free slot at the conversation's next turn when the child lost it."""
    mmproj: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """A multimodal (vision/audio) projector for this model: a GGUF path, ``"hf:org/repo:FILE"``, or
    ``"auto"``: the ``mmproj*.gguf`` beside the model in its Hugging Face repo or folder. The child
    gets ``--mmproj``; requests may then carry images (or audio)."""
    mmproj_offload: bool | None = None
    """The projector on the GPU (``--mmproj-offload``, llama-server's default) or in system RAM
    (false: ``--no-mmproj-offload``). None: on the GPU when the model is on one, else off."""
    workers: Literal["auto", "never", "only", "all"] = "auto"
    """RPC workers (``[[workers]]``): ``auto`` uses the fewest that hold it when the model does not
    fit on this machine; ``only``: always on the fewest workers, never here; ``all``: a share on every
    usable worker; ``never``: this machine only."""
    draft: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """A draft model for speculative decoding: a GGUF path, an embedded name or
    ``hf:org/repo:QUANT``. It must share the model's vocabulary (refused at config check when it
    does not). Its weights and KV cache (the model's context, ``f16``) count in placement."""
    draft_max: int | None = Field(default=None, ge=1)
    """Tokens the draft proposes per step (``--spec-draft-n-max``; llama-server's default 3)."""
    draft_min: int | None = Field(default=None, ge=0)
    """The fewest draft tokens worth checking (``--spec-draft-n-min``; default 0)."""
    draft_gpu: Literal["auto", "cpu"] = "auto"
    """Where the draft sits: ``auto``, on the model's GPUs (split as the model is) or in RAM when
    the model is; ``cpu``: always in system RAM (saves GPU memory, drafts slower)."""
    speculative: Annotated[str | None, BeforeValidator(_empty_is_none)] = None
    """llama-server's ``--spec-type``, comma-separated: ``draft-simple`` (the default with a
    ``draft``), ``draft-eagle3``, ``draft-mtp`` (the model's own MTP head), ``draft-dflash``,
    ``draft-dspark``, or a draft-free n-gram mode: ``ngram-simple``, ``ngram-map-k``,
    ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``."""
    rerank: bool = False
    """A reranker (``--reranking``): served on ``/v1/rerank`` and ``/rerank`` only; a chat or
    completion request to it is a 400."""
    adapters: dict[str, AdapterConfig] = Field(default_factory=dict)
    """``[models.X.adapters.NAME]``: LoRA adapters, loaded with the child and served as ``X:NAME``."""

    @field_validator("mmproj")
    @classmethod
    def _mmproj_reference(cls, value: str | None) -> str | None:
        if value is None or value == "auto" or not value.startswith("hf:"):
            return value
        if not _HF_FILE_RE.match(value[3:]):
            raise custom(
                "mmproj_reference",
                f"mmproj {value!r} is not hf:org/repo:FILE (e.g. "
                '"hf:ggml-org/SmolVLM-500M-Instruct-GGUF:mmproj-SmolVLM-500M-Instruct-f16.gguf")',
            )
        return value
