"""OpenAI's audio routes for a ``backend = "whisper"`` model: translated to whisper-server's
``POST /inference`` and back.

``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` take a multipart form (``file``,
``model``, ``response_format``, ``language``, ``prompt``, ``temperature``). The form is checked
here, before any queueing, so a bad upload is a 4xx naming its field: no ``file``, an empty one,
one over ``server.audio_max_bytes`` (413), one that is not audio by its first bytes, or audio
this whisper-server cannot decode (it reads WAV, MP3, FLAC and Ogg Vorbis itself; M4A and WebM
need ffmpeg, which it uses only when forge found ffmpeg and passed ``--convert``).

The child is always asked for ``verbose_json`` (one shape to read) without language
probabilities (an extra encoder pass), ``language=auto`` unless one is given (whisper-server's
default is ``en``, OpenAI's is to detect it), and ``translate=true`` on the translations route;
the answer is rendered here into the shape the client asked for: ``json`` (``{"text"}``),
``text``, ``srt``, ``vtt`` or ``verbose_json`` (OpenAI's keys: task, language, duration, text,
segments with id/seek/start/end/text/tokens/temperature/avg_logprob/compression_ratio/
no_speech_prob). The request goes through the model's queue like any other (whisper-server serves
one at a time), and a child that dies under it is the forwarder's clean 503.

A llama model (one with an audio projector) keeps its plain forwarding on the transcriptions
route; translations are whisper's only.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request

from ..._errors import InvalidRequest, PayloadTooLarge, ServerError
from ..core._routes import FORWARDED
from ._upload import read_upload

__all__ = [
    "FORMATS",
    "AudioAnswer",
    "AudioForm",
    "is_translation",
    "parse_form",
    "render",
    "sniff_audio",
    "to_inference",
]

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
_TRANSLATION_PATHS = frozenset(r.path for r in FORWARDED if r.audio == "translate")

#: What whisper.cpp decodes itself (``examples/common-whisper.cpp``: miniaudio's WAV, MP3 and FLAC,
#: stb_vorbis for Ogg Vorbis); M4A and WebM only through ffmpeg (``--convert``).
_NATIVE = ("wav", "mp3", "flac", "ogg")


def is_translation(path: str) -> bool:
    return path in _TRANSLATION_PATHS


def sniff_audio(head: bytes) -> str | None:
    """The audio container ``head`` starts with, or None when it is not audio we know."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[4:8] == b"ftyp":
        return "m4a"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    return None


@dataclass(frozen=True)
class AudioForm:
    """A checked upload: the file and the options whisper-server is asked with."""

    filename: str
    data: bytes
    response_format: str
    language: str | None
    prompt: str | None
    temperature: float | None


async def parse_form(request: Request, body: bytes, limit: int) -> AudioForm:
    """The upload's fields, checked (an :class:`InvalidRequest` naming the field, or a 413)."""
    upload = await read_upload(
        request,
        body,
        limit,
        fields=("response_format", "language", "prompt", "temperature"),
        default_name="audio",
        missing=" (the audio to transcribe)",
        hint="send the audio as the multipart file field `file`",
    )
    data, filename, fields = upload.data, upload.filename, upload.fields
    if not data:
        raise InvalidRequest("file: the uploaded file is empty", param="file", hint="send an audio file")
    if len(data) > limit:
        raise PayloadTooLarge(
            f"file: the audio file is over {limit} bytes",
            param="file",
            hint="send a smaller file (server.audio_max_bytes sets the limit)",
        )
    kind = sniff_audio(data[:16])
    if kind is None:
        raise InvalidRequest(
            f"file: {filename!r} is not audio (not WAV, MP3, FLAC, OGG, M4A or WebM by its first bytes)",
            param="file",
            hint="send an audio file; WAV (16 kHz mono) needs no conversion",
        )
    if kind not in _NATIVE and shutil.which("ffmpeg") is None:
        raise InvalidRequest(
            f"file: {filename!r} is {kind.upper()}, which whisper-server reads only through ffmpeg",
            param="file",
            hint="send WAV, MP3, FLAC or Ogg Vorbis, or install ffmpeg on the server (then reload the model)",
        )
    fmt = fields["response_format"] or "json"
    if fmt not in FORMATS:
        raise InvalidRequest(
            f"response_format {fmt!r} is not one of {', '.join(FORMATS)}", param="response_format"
        )
    temperature = None
    if fields["temperature"] is not None:
        try:
            temperature = float(fields["temperature"])
        except ValueError:
            temperature = math.nan
        if not 0.0 <= temperature <= 1.0:
            raise InvalidRequest(
                f"temperature {fields['temperature']!r} is not a number from 0 to 1", param="temperature"
            )
    return AudioForm(filename, data, fmt, fields["language"], fields["prompt"], temperature)


def to_inference(form: AudioForm, *, translate: bool) -> tuple[bytes, str]:
    """whisper-server's ``/inference`` form for ``form``: (body, content type). httpx encodes it."""
    data = {
        "response_format": "verbose_json",
        "no_language_probabilities": "true",
        "language": form.language or "auto",
        "translate": "true" if translate else "false",
    }
    if form.prompt is not None:
        data["prompt"] = form.prompt
    if form.temperature is not None:
        data["temperature"] = repr(form.temperature)
    req = httpx.Request(
        "POST", "http://child/inference", data=data, files={"file": (form.filename, form.data)}
    )
    return req.read(), req.headers["content-type"]


def _stamp(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _segments(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i, seg in enumerate(result.get("segments") or []):
        if not isinstance(seg, dict):
            continue
        start = float(seg.get("start") or 0.0)
        out.append(
            {
                "id": int(seg.get("id", i)),
                "seek": 0,
                "start": start,
                "end": float(seg.get("end") or start),
                "text": str(seg.get("text") or ""),
                "tokens": [int(t) for t in seg.get("tokens") or []],
                "temperature": float(seg.get("temperature") or 0.0),
                "avg_logprob": float(seg.get("avg_logprob") or 0.0),
                "compression_ratio": 0.0,  # whisper-server does not compute it
                "no_speech_prob": float(seg.get("no_speech_prob") or 0.0),
            }
        )
    return out


#: The ``content-type`` of each ``response_format`` (the JSON ones: ``application/json``).
_MEDIA = {
    "text": "text/plain; charset=utf-8",
    "srt": "text/plain; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def render(result: dict[str, Any], fmt: str, task: str = "transcribe") -> bytes:
    """whisper-server's ``verbose_json`` as OpenAI answers ``response_format=fmt``. ``task`` is the
    route's: an English-only model asked to translate transcribes (its audio is English already),
    and whisper-server then says ``transcribe``."""
    segments = _segments(result)
    # whisper-server ends each segment with a line break, mid-sentence; OpenAI's text is one line.
    text = " ".join(str(result.get("text") or "").split())
    if fmt == "json":
        return _json({"text": text})
    if fmt == "text":
        return (text + "\n").encode()
    if fmt == "srt":
        blocks = [
            f"{n}\n{_stamp(s['start'], ',')} --> {_stamp(s['end'], ',')}\n{s['text'].strip()}\n"
            for n, s in enumerate(segments, 1)
        ]
        return "\n".join(blocks).encode()
    if fmt == "vtt":
        cues = [
            f"{_stamp(s['start'], '.')} --> {_stamp(s['end'], '.')}\n{s['text'].strip()}\n" for s in segments
        ]
        return ("WEBVTT\n\n" + "\n".join(cues)).encode()
    return _json(
        {
            "task": task,
            "language": str(result.get("language") or ""),
            "duration": float(result.get("duration") or 0.0),
            "text": text,
            "segments": segments,
        }
    )


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class AudioAnswer:
    """The audio routes' translator (:class:`~..core._dialect.Translator`): whisper-server's
    ``verbose_json`` rendered as the client asked (``response_format``), so a transcription goes
    through the one forwarder and its one response like every other request."""

    response_format: str
    route_path: str
    stream_type: str = "text/plain; charset=utf-8"
    # whisper-server does not stream: a "stream" is the whole answer at its end (``end``).
    over: bool = False
    _body: bytearray = field(default_factory=bytearray, compare=False, repr=False)

    @property
    def whole_type(self) -> str:
        return _MEDIA.get(self.response_format, "application/json")

    def whole(self, content: bytes) -> bytes:
        try:
            result = json.loads(content)
            if not isinstance(result, dict):
                raise ValueError("not an object")
        except ValueError:
            raise ServerError(
                "whisper-server answered something that is not its verbose_json", status_code=502
            ) from None
        return render(
            result, self.response_format, "translate" if is_translation(self.route_path) else "transcribe"
        )

    def feed(self, chunk: bytes) -> bytes:
        self._body.extend(chunk)
        return b""

    def end(self) -> bytes:
        return self.whole(bytes(self._body))


async def audio_request(
    request: Request, body: bytes, route_path: str, limit: int
) -> tuple[str, bytes, str, AudioAnswer]:
    """The audio dialect's request in: the client's form as whisper-server's ``/inference`` path,
    body and content type, with the translator that renders its answer, so the forwarder meets
    audio as one more (path, body, translator) like the other dialects."""
    form = await parse_form(request, body, limit)
    inference, content_type = to_inference(form, translate=is_translation(route_path))
    return "/inference", inference, content_type, AudioAnswer(form.response_format, route_path)
