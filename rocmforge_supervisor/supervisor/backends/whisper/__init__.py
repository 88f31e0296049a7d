"""The whisper backend: a whisper.cpp model served by whisper-server (speech to text), placed by its
size; the gateway translates both audio routes to its ``/inference``. whisper-server's program is
``process``'s (``WHISPER_SERVER``): forge builds it, and the build's self-test runs it too."""

from .._entry import Backend
from ._plan import plan_whisper, whisper_request

__all__ = ["AUDIO_ROUTES", "BACKEND", "whisper_request"]

#: whisper-server's routes behind the gateway.
AUDIO_ROUTES = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations", "/inference"})

BACKEND = Backend(
    "whisper",
    "a whisper (speech to text) model",
    "whisper · speech to text",
    plan_whisper,
    False,
    lambda _c: AUDIO_ROUTES,
    transcribes=True,
)
