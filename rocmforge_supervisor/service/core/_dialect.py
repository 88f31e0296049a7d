"""A dialect that is not llama-server's own, as the one forwarder sees it: a translator of the
child's answers. The request side (its body in llama-server's terms, the upstream path) is the
dialect's adapter to the one ingress (``proxy/_ingress``); the error side is ``_errors_http``'s
shape for the dialect. Everything between — the load wait, the slot, the watchdog's retry, metrics, the activity record, the
key's charge — is the forwarder's, the same for every dialect (llama-swap's ``apiconv``
converters plugged into its one proxy path are the model).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Translator"]


class Translator(Protocol):
    """The child's answer in the dialect's shape."""

    @property
    def stream_type(self) -> str:
        """``content-type`` of a streamed answer (``application/x-ndjson`` for Ollama)."""
        ...

    @property
    def whole_type(self) -> str:
        """``content-type`` of a whole answer (``application/json``; an audio transcription's
        depends on its ``response_format``)."""
        ...

    def whole(self, content: bytes) -> bytes:
        """A whole 200 answer (the child's JSON) as the dialect's body. Raises a ``ForgeError``
        when the child's answer is not what the dialect can translate."""
        ...

    def feed(self, chunk: bytes) -> bytes:
        """The dialect's stream pieces that ``chunk`` of the child's SSE completes (b"" while it
        completes none), sent as soon as they are. An error event of the child becomes the
        dialect's. Pushed by the forwarder as the chunks arrive, so a dialect's stream is one call
        per chunk down from the relay, not an iterator the dialect pulls back up through it."""
        ...

    def end(self) -> bytes:
        """What the dialect's stream ends with once the child's has ended (Ollama's last
        ``done`` line; a whole transcription): b"" when nothing."""
        ...

    @property
    def over(self) -> bool:
        """The dialect's answer is complete (after an error, or a native ``done``): the rest of
        the child's stream is not read and :meth:`end` is not called."""
        ...
