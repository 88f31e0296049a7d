"""Images and audio in a request: found in every dialect, checked once, before the child sees them.

llama-server takes media as ``image_url`` / ``input_audio`` parts of a chat message (and
translates Anthropic ``image`` blocks and Responses ``input_image`` items into those). Each
part's URL may be:

* ``data:image/…;base64,…`` or raw base64: the bytes themselves. Checked here to be well-formed
  base64, so that a malformed one is a 400 naming the part, never a 500.
* ``http(s)://…``: **llama-server downloads it itself** (≤ 10 MB, 10 s) from wherever it points —
  a loopback admin port, a cloud metadata address, a private service. That is a server-side
  request forgery surface on every API key holder's behalf, so the gateway refuses such URLs with a
  400 naming the setting, unless ``[server] allow_remote_media = true`` says the operator accepts
  that the children fetch any URL a client names (private and loopback addresses included: the
  gateway does not fetch or filter them itself). Clients that need remote images can fetch them
  and send base64.
* ``file://…``: refused always (forge never starts a child with ``--media-path``).

And a request with media to a model without a projector (``[models.NAME] mmproj``) is a 400
naming the model and the key to set, instead of llama-server's "image input is not supported"
from deep in the child.

One function, :func:`refuse_unusable_media`, called from the one place each API's requests pass
(the forwarded JSON routes, and the Ollama API after its translation to OpenAI parts).
"""

from __future__ import annotations

import binascii
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..._errors import RequestRejected

__all__ = ["MediaPart", "media_parts", "refuse_unusable_media"]

_REMOTE_SETTING = "[server] allow_remote_media = true"


@dataclass(frozen=True)
class MediaPart:
    """One image or sound in a request: where it is (a JSON path for the error) and its URL/data."""

    where: str
    kind: str
    """``image``, ``audio`` or ``video``."""
    url: str
    base64_only: bool = False
    """Anthropic's base64 source and ``input_audio``: raw base64, never a URL."""


def _as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _parts_of(content: Any, where: str) -> Iterator[MediaPart]:
    if not isinstance(content, list):
        return
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            continue
        at = f"{where}[{j}]"
        kind = part.get("type")
        if kind == "image_url":  # OpenAI chat
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            yield MediaPart(f"{at}.image_url.url", "image", _as_str(url))
        elif kind in ("input_audio", "input_video"):  # OpenAI chat (llama-server: data or url)
            media = part.get(kind)
            data = media.get("data", media.get("url")) if isinstance(media, Mapping) else media
            yield MediaPart(f"{at}.{kind}.data", kind.removeprefix("input_"), _as_str(data), base64_only=True)
        elif kind == "input_image":  # Responses
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            yield MediaPart(f"{at}.image_url", "image", _as_str(url))
        elif kind == "image":  # Anthropic
            source = part.get("source")
            source = source if isinstance(source, Mapping) else {}
            if source.get("type") == "url":
                yield MediaPart(f"{at}.source.url", "image", _as_str(source.get("url")))
            else:
                yield MediaPart(f"{at}.source.data", "image", _as_str(source.get("data")), base64_only=True)
        elif kind == "tool_result":  # Anthropic: images inside a tool's result
            yield from _parts_of(part.get("content"), f"{at}.content")


def media_parts(payload: Mapping[str, Any]) -> list[MediaPart]:
    """Every image/audio/video part of a chat (``messages``) or Responses (``input``) body."""
    out: list[MediaPart] = []
    for field in ("messages", "input"):
        items = payload.get(field)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            if isinstance(item, Mapping):
                out += _parts_of(item.get("content"), f"{field}[{i}].content")
    return out


def _bad(part: MediaPart, why: str, hint: str) -> RequestRejected:
    return RequestRejected(
        f"{part.where}: {why}", hint=hint, status_code=400, error_type="invalid_request_error"
    )


def _check_base64(part: MediaPart, data: str) -> None:
    text = "".join(data.split())
    try:
        decoded = binascii.a2b_base64(text, strict_mode=True) if text else b""
    except (binascii.Error, ValueError):
        decoded = b""
    if not decoded:
        raise _bad(
            part,
            f"the {part.kind} is not valid base64 data",
            f"send the {part.kind}'s bytes base64-encoded"
            + ("" if part.base64_only else f" as data:{part.kind}/…;base64,…"),
        )


def _check_url(part: MediaPart, allow_remote: bool) -> None:
    url = part.url.strip()
    lower = url[:16].lower()
    if not url:
        raise _bad(part, f"the {part.kind} is empty", f"send the {part.kind} as base64 data")
    if lower.startswith("file:"):
        raise _bad(
            part,
            "file:// URLs are refused (they would read files on the server)",
            f"send the {part.kind}'s bytes as a base64 data URL",
        )
    if lower.startswith("http"):
        if part.base64_only:
            raise _bad(part, f"the {part.kind} must be base64 data, not a URL", "send base64 data")
        if not allow_remote:
            raise _bad(
                part,
                f"remote {part.kind} URLs are refused: the model server would fetch any address a "
                "request names (a server-side request forgery risk)",
                f"send the {part.kind} as a base64 data URL, or set {_REMOTE_SETTING} in forge.toml",
            )
        return
    if lower.startswith("data:"):
        head, sep, data = url.partition(",")
        if part.base64_only or not sep:
            raise _bad(
                part, f"malformed data URL {head[:40]!r}", f"send data:{part.kind}/…;base64,<base64 data>"
            )
        if not head.lower().startswith(f"data:{part.kind}/") or not head.lower().endswith(";base64"):
            raise _bad(
                part,
                f"data URL {head[:60]!r} is not a base64 {part.kind}",
                f"send data:{part.kind}/<type>;base64,<base64 data>",
            )
        _check_base64(part, data)
        return
    _check_base64(part, url)  # llama-server reads any other string as raw base64


def refuse_unusable_media(
    name: str, payload: Mapping[str, Any], *, has_projector: bool, allow_remote: bool
) -> None:
    """Raise a 400 (:class:`RequestRejected`) for the first media part model ``name`` cannot take,
    or that is malformed, remote (unless ``allow_remote``) or a ``file://`` URL."""
    parts = media_parts(payload)
    if not parts:
        return
    if not has_projector:
        part = parts[0]
        raise RequestRejected(
            f"model {name!r} cannot take {part.kind} input ({part.where}): it has no multimodal projector",
            hint=f'set mmproj = "auto" (or the mmproj .gguf path) under [models.{name}] in forge.toml, '
            "or send the request without media",
            status_code=400,
            error_type="invalid_request_error",
        )
    for part in parts:
        _check_url(part, allow_remote)
