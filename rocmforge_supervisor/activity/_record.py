"""One request as the activity log keeps it: filled by the gateway, written once by the store."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Record"]


@dataclass
class Record:
    """What one request did. Times are seconds (``started``: Unix time); ``None``: not known
    (a request refused before it reached a model has no tokens, no queue wait, no first token).

    ``key`` is the *name* of the API key that sent it, never the key. ``request_body`` and
    ``response_body`` are filled only when capture is on for the request's model; a streamed
    response is kept raw here and assembled into its text by the store's thread, off the loop.
    """

    started: float
    route: str
    method: str = "POST"
    request_id: str | None = None
    model: str | None = None
    key: str | None = None
    client: str | None = None
    status: int = 0
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    queue_wait: float | None = None
    ttft: float | None = None
    duration: float | None = None
    finish_reason: str | None = None
    cancelled: bool = False
    stream: bool = False
    request_body: bytes | None = None
    response_body: bytes | None = None
    #: The admission class it queued in (``interactive``, ``batch``, ``background``).
    priority: str | None = None

    @property
    def tokens_per_second(self) -> float | None:
        """Completion tokens over the time they took to come (first token → end, else the whole)."""
        if not self.completion_tokens or self.duration is None:
            return None
        span = self.duration - (self.ttft or 0.0) if self.stream else self.duration
        return round(self.completion_tokens / span, 2) if span > 0 else None
