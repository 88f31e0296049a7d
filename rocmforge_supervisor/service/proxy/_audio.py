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
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..._errors import InvalidRequest, PayloadTooLarge, ServerError
from ..core._routes import ForwardRoute
from ..edge._errors_http import error_response
from ._relay import Opened
from ._upload import read_upload

__all__ = [
    "FORMATS",
    "AudioForm",
    "is_translation",
    "parse_form",
    "relay",
    "render",
    "sniff_audio",
    "to_inference",
]

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
_TRANSLATION_PATHS = frozenset({"/v1/audio/translations", "/audio/translations"})

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


def render(result: dict[str, Any], fmt: str, task: str = "transcribe") -> Response:
    """whisper-server's ``verbose_json`` as OpenAI answers ``response_format=fmt``. ``task`` is the
    route's: an English-only model asked to translate transcribes (its audio is English already),
    and whisper-server then says ``transcribe``."""
    segments = _segments(result)
    # whisper-server ends each segment with a line break, mid-sentence; OpenAI's text is one line.
    text = " ".join(str(result.get("text") or "").split())
    if fmt == "json":
        return JSONResponse({"text": text})
    if fmt == "text":
        return Response(text + "\n", media_type="text/plain; charset=utf-8")
    if fmt == "srt":
        blocks = [
            f"{n}\n{_stamp(s['start'], ',')} --> {_stamp(s['end'], ',')}\n{s['text'].strip()}\n"
            for n, s in enumerate(segments, 1)
        ]
        return Response("\n".join(blocks), media_type="text/plain; charset=utf-8")
    if fmt == "vtt":
        cues = [
            f"{_stamp(s['start'], '.')} --> {_stamp(s['end'], '.')}\n{s['text'].strip()}\n" for s in segments
        ]
        return Response("WEBVTT\n\n" + "\n".join(cues), media_type="text/vtt; charset=utf-8")
    return JSONResponse(
        {
            "task": task,
            "language": str(result.get("language") or ""),
            "duration": float(result.get("duration") or 0.0),
            "text": text,
            "segments": segments,
        }
    )


async def relay(opened: Opened, form: AudioForm, route: ForwardRoute, rid: str | None) -> Response:
    """The child's answer to the client: rendered when it is a transcription, else the error as
    the forwarder already shaped it (a 503 for a child that went away)."""
    try:
        body = opened.content if opened.chunks is None else b"".join([c async for c in opened.chunks])
    finally:
        with anyio.CancelScope(shield=True):
            await opened.close()
    if opened.status != 200:
        return Response(body, status_code=opened.status, headers=opened.headers)
    try:
        result = json.loads(body)
        if not isinstance(result, dict):
            raise ValueError("not an object")
    except ValueError:
        exc = ServerError("whisper-server answered something that is not its verbose_json", status_code=502)
        return error_response(exc, rid, route.dialect)
    resp = render(result, form.response_format, "translate" if is_translation(route.path) else "transcribe")
    if rid:
        resp.headers["X-Request-ID"] = rid
    return resp
