"""The GGUF quants of a hub repository, each described from its header alone: ``forge pull --fit``.

A GGUF keeps everything the memory estimate needs (the metadata and every tensor's name, shape and
type) at the file's start, before the tensor data. So each quant's header is read with HTTP range
requests (a few MiB, grown until the header and the tensor table are whole) instead of the file.

The header bytes are written into a *sparse* file as long as the real one (the tensor data a hole
that takes no disk), under the file's own name, so that the one GGUF reader (:func:`inspect_gguf`,
which checks the tensor data against the file's length and finds a split model's parts by name)
describes it exactly as it would describe the downloaded file. Nothing of it stays: the files live
in a temporary folder for the duration of the call.

A hub that ignores ``Range`` (a mirror answering 200 with the whole file) still works: the start of
the stream is read until the header is whole, then the transfer is closed.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

from .._errors import HubError, InvalidModelFile, ModelNotFound
from ..config import ForgeSettings
from ._gguf import GGUFInfo, inspect_gguf
from ._hub import (
    _PROXY_VARS,
    HubRef,
    _check_name_resolves,
    _complete,
    _endpoint,
    _groups,
    _offline,
    _token,
    _translate,
    parse_hf_reference,
    select_gguf_files,
)
from ._names import is_mmproj, quant_tag_of
from ._projector import ProjectorInfo, choose_projector, inspect_projector

__all__ = ["HubQuant", "RepoQuants", "hub_quants", "read_gguf_header"]

#: The first range asked for a header; doubled while the header runs past what was read.
FIRST_BYTES = 4 * 1024 * 1024
#: No header is bigger (the largest vocabularies take ~20 MiB): beyond it the file is refused.
MAX_HEADER_BYTES = 512 * 1024 * 1024

# GGUF value types: fixed sizes (STRING = 8 and ARRAY = 9 are read by length).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _NeedMore(Exception):
    """The header runs past the bytes read so far."""


class _Cursor:
    def __init__(self, buf: bytes | bytearray, order: str) -> None:
        self.buf = buf
        self.pos = 0
        self.order = order

    def take(self, n: int) -> int:
        start = self.pos
        self.pos += n
        if self.pos > len(self.buf):
            raise _NeedMore
        return start

    def u32(self) -> int:
        at = self.take(4)
        return int(struct.unpack_from(self.order + "I", self.buf, at)[0])

    def u64(self) -> int:
        at = self.take(8)
        return int(struct.unpack_from(self.order + "Q", self.buf, at)[0])

    def skip_string(self) -> None:
        self.take(self.u64())

    def skip_value(self, vtype: int) -> None:
        if vtype in _FIXED:
            self.take(_FIXED[vtype])
        elif vtype == _STRING:
            self.skip_string()
        elif vtype == _ARRAY:
            itype, count = self.u32(), self.u64()
            if itype in _FIXED:
                self.take(_FIXED[itype] * count)
            elif itype == _STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                raise ValueError(f"an array of value type {itype}")
        else:
            raise ValueError(f"value type {vtype}")


def header_length(buf: bytes | bytearray, name: str) -> int | None:
    """Where the header (metadata and tensor table) of the GGUF starting ``buf`` ends; None when it
    runs past ``buf``. Raises :class:`InvalidModelFile` when ``buf`` starts no GGUF."""
    if len(buf) < 8:
        return None
    if bytes(buf[:4]) != b"GGUF":
        raise InvalidModelFile(
            f"{name} is not a GGUF model: it starts with {bytes(buf[:4])!r}, expected b'GGUF'",
            hint="name a GGUF repository (often named …-GGUF)",
        )
    order = ">" if int.from_bytes(buf[4:8], "little") & 0xFFFF == 0 else "<"
    cur = _Cursor(buf, order)
    cur.take(4)
    try:
        if cur.u32() < 2:
            return 8  # GGUF v1: too old to serve; inspect_gguf names the version
        n_tensors, n_kv = cur.u64(), cur.u64()
        for _ in range(n_kv):
            cur.skip_string()
            cur.skip_value(cur.u32())
        for _ in range(n_tensors):
            cur.skip_string()
            cur.take(8 * cur.u32())
            cur.take(4 + 8)
    except _NeedMore:
        return None
    except ValueError as exc:
        raise InvalidModelFile(
            f"{name} is not a valid GGUF model: its header holds {exc}", hint="name another quant"
        ) from exc
    return cur.pos


def read_gguf_header(
    client: httpx.Client,
    url: str,
    size: int,
    name: str,
    *,
    first: int = FIRST_BYTES,
) -> bytes:
    """The header of the GGUF at ``url`` (``size`` bytes long), by range requests from its start,
    each twice the last while the header runs past them. A server that ignores ``Range`` (200,
    the whole file) is read from the stream's start until the header is whole, then closed."""
    buf = bytearray()
    want = min(max(first, 8), size)
    while True:
        with client.stream("GET", url, headers={"Range": f"bytes={len(buf)}-{want - 1}"}) as r:
            if r.status_code not in (200, 206):
                r.raise_for_status()
                raise httpx.HTTPStatusError(f"status {r.status_code}", request=r.request, response=r)
            ranged = r.status_code == 206
            if not ranged:
                buf.clear()  # the whole file, from its start
            check_at = want
            for chunk in r.iter_bytes():
                buf += chunk
                if ranged or len(buf) < check_at:
                    continue
                end = header_length(buf, name)
                if end is not None:
                    return bytes(buf[:end])  # leaving the block closes the transfer
                check_at = _grown(len(buf), name)
        end = header_length(buf, name)
        if end is not None:
            return bytes(buf[:end])
        if not ranged or len(buf) >= size:
            raise InvalidModelFile(
                f"{name} is truncated or corrupt: its GGUF header runs past its {size:,} bytes",
                hint="name another quant",
            )
        want = min(_grown(len(buf), name), size)


def _grown(have: int, name: str) -> int:
    if have >= MAX_HEADER_BYTES:
        raise InvalidModelFile(
            f"{name}: its GGUF header is over {MAX_HEADER_BYTES // 2**20} MiB long",
            hint="name the quant to pull as org/repo:QUANT",
        )
    return have * 2


# -- a repository's quants -------------------------------------------------------------------------


@dataclass(frozen=True)
class HubQuant:
    """One model of a repository (every part of a split one), described from its header."""

    label: str
    """Its quant tag (``Q4_K_M``), else its file name."""
    files: tuple[str, ...]
    """The repo paths of its parts, first first."""
    size_bytes: int
    info: GGUFInfo | None = None
    projector: ProjectorInfo | None = None
    """The projector ``forge pull`` would take with it (:func:`choose_projector`)."""
    projector_file: str | None = None
    problem: str | None = None
    """Why it has no description (a header that cannot be read): it is no candidate then."""


@dataclass(frozen=True)
class RepoQuants:
    ref: HubRef
    quants: tuple[HubQuant, ...]
    files: tuple[str, ...]
    """The repo's whole listing."""

    def reference_of(self, quant: HubQuant) -> str:
        """``org/repo:TAG`` when the tag means exactly this quant, else ``org/repo/FILE``."""
        rev = f"@{self.ref.revision}" if self.ref.revision else ""
        tag = quant_tag_of(quant.files[0])
        if tag is not None:
            try:
                chosen = select_gguf_files(self.files, HubRef(self.ref.repo_id, self.ref.revision, quant=tag))
            except ModelNotFound:
                chosen = []
            if tuple(chosen) == quant.files:
                return f"{self.ref.repo_id}{rev}:{tag}"
        return f"{self.ref.repo_id}{rev}/{quant.files[0]}"


def _listing(ref: HubRef, settings: ForgeSettings) -> dict[str, int]:
    """The repo's files and their sizes, from the hub."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=_endpoint(settings), token=_token(settings))

    def call() -> dict[str, int]:
        tree = api.list_repo_tree(ref.repo_id, revision=ref.revision, recursive=True)
        return {f.path: int(f.size) for f in tree if isinstance(f, RepoFile)}

    return _translate(ref, settings, call)


def _check_reachable(settings: ForgeSettings) -> None:
    """Fail at once, in one line, when nothing answers at the hub's address (a mirror that is
    down): huggingface-hub would retry the listing five times first, ~23 s of retry lines. Behind
    a proxy the proxy connects: no check."""
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = _endpoint(settings) or constants.ENDPOINT
    parts = urlsplit(url)
    if not parts.hostname:
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=15).close()
    except OSError as exc:
        raise HubError(
            f"cannot reach the hub at {url}: {exc.strerror or type(exc).__name__}",
            hint="check the network and the hub's address (FORGE_HF_ENDPOINT / HF_ENDPOINT), then run it again",
        ) from exc


@contextmanager
def _client(settings: ForgeSettings) -> Iterator[httpx.Client]:
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # exported, not in __all__

    headers = build_hf_headers(token=_token(settings))
    # Redirects (the hub sends a file's bytes from its CDN) drop the token on another host.
    with httpx.Client(headers=headers, follow_redirects=True, timeout=httpx.Timeout(30.0)) as client:
        yield client


def _url(ref: HubRef, name: str, settings: ForgeSettings) -> str:
    from huggingface_hub import hf_hub_url

    return hf_hub_url(ref.repo_id, name, revision=ref.revision, endpoint=_endpoint(settings))


def hub_quants(
    text: str,
    settings: ForgeSettings,
    *,
    first: int = FIRST_BYTES,
    on_file: Callable[[str], Any] | None = None,
) -> RepoQuants:
    """Every GGUF model of the repository ``text`` names (``org/repo``, a quant or file in it is
    ignored), each described from its header; projector files are no candidates but each quant
    carries the one ``forge pull`` would take with it. Downloads no file; ``on_file`` is told the
    name of each header read."""
    ref = parse_hf_reference(text)
    ref = HubRef(ref.repo_id, ref.revision)
    if _offline(settings):
        raise HubError(
            f"forge pull --fit reads {ref.repo_id}'s file headers from the hub, and offline mode is on",
            hint="unset HF_HUB_OFFLINE / FORGE_HF_OFFLINE, or name the quant: forge pull org/repo:QUANT",
        )
    _check_name_resolves(settings)
    _check_reachable(settings)
    sizes = _listing(ref, settings)
    files = sorted(sizes)
    ggufs = [f for f in files if f.lower().endswith(".gguf") and not is_mmproj(f)]
    if not ggufs:
        raise ModelNotFound(
            f"{ref.repo_id} has no GGUF files",
            hint="use a GGUF repository (often named …-GGUF), or convert the model with llama.cpp's "
            "convert_hf_to_gguf.py",
        )
    quants: list[HubQuant] = []
    projectors: dict[str, ProjectorInfo | str] = {}
    with tempfile.TemporaryDirectory(prefix="forge-fit-") as tmp, _client(settings) as client:

        def sparse(name: str) -> Path:
            """The file ``name`` as a sparse copy: its header, then a hole to its full length."""
            if on_file is not None:
                on_file(name)
            data = _translate(
                ref,
                settings,
                lambda: read_gguf_header(client, _url(ref, name, settings), sizes[name], name, first=first),
            )
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as f:
                f.write(data)
                f.truncate(sizes[name])
            return path

        for group in _groups(ggufs).values():
            parts = _complete(ref, group)
            label = quant_tag_of(parts[0]) or PurePosixPath(parts[0]).name
            missing = [p for p in parts if p not in sizes]
            size = sum(sizes.get(p, 0) for p in parts)
            if missing:
                problem = f"{len(missing)} of its {len(parts)} parts are not in the repository"
                quants.append(HubQuant(label, tuple(parts), size, problem=problem))
                continue
            try:
                local = [sparse(p) for p in parts]
                info = inspect_gguf(local[0])
            except (InvalidModelFile, ModelNotFound) as exc:
                quants.append(HubQuant(label, tuple(parts), size, problem=exc.message))
                continue
            info = replace(info, path=Path(parts[0]), split_files=tuple(Path(p) for p in parts))
            chosen, _ = choose_projector(files, parts[0])
            projector: ProjectorInfo | None = None
            if chosen is not None:
                if chosen not in projectors:
                    try:
                        projectors[chosen] = replace(inspect_projector(sparse(chosen)), path=Path(chosen))
                    except (InvalidModelFile, ModelNotFound) as exc:
                        projectors[chosen] = exc.message
                found = projectors[chosen]
                if isinstance(found, str):
                    quants.append(HubQuant(label, tuple(parts), size, projector_file=chosen, problem=found))
                    continue
                projector = found
            quants.append(HubQuant(label, tuple(parts), size, info, projector, chosen))
    quants.sort(key=lambda q: (q.size_bytes, q.label))
    return RepoQuants(ref, tuple(quants), tuple(files))
