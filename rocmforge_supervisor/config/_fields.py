"""The value shapes every section's keys share: one parser each, one clear error each, and the
base of every section (frozen, unknown keys refused).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
)

from ._explain import custom
from ._values import (
    CtxSize,
    GpuChoice,
    GpuLayers,
    Reserve,
    parse_bytes,
    parse_ctx_size,
    parse_gpu,
    parse_gpu_layers,
    parse_reserve,
)

__all__ = [
    "_HF_FILE_RE",
    "CtxSizeField",
    "GpuChoiceField",
    "GpuLayersField",
    "ReserveField",
    "_Section",
    "_bytes_or_none",
    "_empty_is_none",
]

# -- field shapes ----------------------------------------------------------------------------------


def _gpu_layers(value: Any) -> Any:
    """One clear error instead of pydantic's one-per-union-member for ``int | "auto" | "all"``."""
    try:
        return parse_gpu_layers(value)
    except ValueError as exc:
        raise custom("gpu_layers", str(exc)) from None


def _ctx_size(value: Any) -> Any:
    """One clear error instead of pydantic's one-per-union-member for ``int | "auto"``."""
    try:
        return parse_ctx_size(value)
    except ValueError as exc:
        raise custom("ctx_size", str(exc)) from None


def _bytes_or_none(value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise custom("bytes", str(exc)) from None


def _gpu(value: Any) -> Any:
    try:
        return parse_gpu(value)
    except ValueError as exc:
        raise custom("gpu", str(exc)) from None


def _reserve(value: Any) -> Any:
    try:
        return parse_reserve(value)
    except ValueError as exc:
        raise custom("vram_reserve", str(exc)) from None


GpuLayersField = Annotated[GpuLayers, BeforeValidator(_gpu_layers)]
CtxSizeField = Annotated[CtxSize, BeforeValidator(_ctx_size)]
GpuChoiceField = Annotated[GpuChoice, BeforeValidator(_gpu)]
ReserveField = Annotated[Reserve, BeforeValidator(_reserve)]


#: ``org/repo:FILE.gguf`` or ``org/repo/FILE.gguf`` (a file inside a Hugging Face repo).
_HF_FILE_RE = re.compile(
    r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(?:@[\w./-]+?)?[:/][\w./-]+\.gguf$", re.IGNORECASE
)


def _empty_is_none(value: Any) -> Any:
    return None if value == "" else value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
