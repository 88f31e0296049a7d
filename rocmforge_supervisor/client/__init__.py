"""HTTP + SSE client for llama-server and OpenAI-style servers; knows nothing about processes."""

from ._sse import SSEDecoder
from ._textmodel import Liveness, TextModel
from ._transport import (
    KEEPALIVE_EXPIRY,
    RETRYABLE,
    Upstream,
    Verify,
    asend,
    async_pool,
    map_httpx_errors,
    pinned_context,
    socket_gone_as_httpx_error,
    trust_context,
    with_model,
)
from ._types import GenerateOptions, Message, Token, Usage

__all__ = [
    "KEEPALIVE_EXPIRY",
    "RETRYABLE",
    "GenerateOptions",
    "Liveness",
    "Message",
    "SSEDecoder",
    "TextModel",
    "Token",
    "Upstream",
    "Usage",
    "Verify",
    "asend",
    "async_pool",
    "map_httpx_errors",
    "pinned_context",
    "socket_gone_as_httpx_error",
    "trust_context",
    "with_model",
]
