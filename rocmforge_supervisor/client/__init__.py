"""HTTP + SSE client for llama-server and OpenAI-style servers; knows nothing about processes."""

from ._textmodel import Liveness, TextModel
from ._types import GenerateOptions, Message, Token, Usage

__all__ = ["GenerateOptions", "Liveness", "Message", "TextModel", "Token", "Usage"]
