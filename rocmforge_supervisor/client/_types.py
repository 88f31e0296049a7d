"""The values the client hands out: messages in, tokens out, and the options in between."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import InvalidArgument

__all__ = ["GenerateOptions", "Message", "Token", "Usage"]


@dataclass(frozen=True)
class Message:
    """A chat message (go-rocm's ``Message{Role, Content}``)."""

    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Token:
    """One streamed piece of text. The last token of a stream carries ``finish_reason``.

    ``id`` is the token id when the endpoint reports it (OpenAI-style streams do not).
    ``reasoning`` is set for models that stream ``reasoning_content`` separately from the answer.
    """

    text: str
    finish_reason: str | None = None
    id: int | None = None
    reasoning: bool = False


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int | None = None

    @classmethod
    def from_json(cls, u: Mapping[str, Any]) -> Usage:
        details = u.get("prompt_tokens_details") or {}
        return cls(
            prompt_tokens=int(u.get("prompt_tokens", 0)),
            completion_tokens=int(u.get("completion_tokens", 0)),
            total_tokens=int(u.get("total_tokens", 0)),
            cached_tokens=details.get("cached_tokens") if isinstance(details, Mapping) else None,
        )


@dataclass(frozen=True)
class GenerateOptions:
    """Sampling options. Names follow go-inference's where they overlap (MaxTokens, Temperature,
    TopK, TopP, StopTokens → ``stop``, RepeatPenalty); defaults too: 256 tokens, greedy."""

    max_tokens: int | None = 256
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: Sequence[str] = ()
    seed: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    grammar: str | None = None
    json_schema: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": self.temperature}
        if self.max_tokens is not None:
            if self.max_tokens < 0:
                raise InvalidArgument(
                    f"max_tokens must be >= 0, got {self.max_tokens}", hint="use 0 or more (None: no limit)"
                )
            body["max_tokens"] = self.max_tokens
        for name in (
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "repeat_penalty",
            "presence_penalty",
            "frequency_penalty",
            "grammar",
        ):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        if self.stop:
            body["stop"] = list(self.stop)
        if self.json_schema is not None:
            body["json_schema"] = dict(self.json_schema)  # llama-server's own field, both endpoints
        body.update(self.extra)
        return body
