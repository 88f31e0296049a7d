"""One multipart upload read off a request body: the ``file`` field, its name and the text fields
asked for. Shared by the audio routes and ``/v1/files``; what each checks of the bytes is theirs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from ..._errors import InvalidRequest
from ..core._routes import replayed

__all__ = ["Upload", "read_upload"]


@dataclass(frozen=True)
class Upload:
    data: bytes
    """At most ``limit + 1`` bytes: one more than the limit says the file is over it."""
    filename: str
    fields: dict[str, str | None]
    """The text fields asked for; None where absent or empty."""


def _text(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) and value != "" else None


async def read_upload(
    request: Request,
    body: bytes,
    limit: int,
    *,
    fields: tuple[str, ...],
    default_name: str,
    missing: str,
    hint: str,
    max_part_size: int | None = None,
) -> Upload:
    """The form's ``file`` (read up to ``limit + 1`` bytes) and ``fields``; an
    :class:`InvalidRequest` when there is no file (``missing``, ``hint``) or no form at all."""
    options = {} if max_part_size is None else {"max_part_size": max_part_size}
    try:
        async with replayed(request, body).form(**options) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidRequest(f'the request has no "file" field{missing}', param="file", hint=hint)
            data = await upload.read(limit + 1)
            return Upload(data, upload.filename or default_name, {n: _text(form, n) for n in fields})
    except (AssertionError, ValueError, KeyError) as exc:
        raise InvalidRequest(
            f"the form body could not be parsed: {exc}", param="file", hint="send multipart/form-data"
        ) from None
