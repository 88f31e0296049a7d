"""Saved KV-cache slots on disk (``keep_context``): files, manifests, the disk budget.

One directory per model under ``[server] context_dir`` (0700: the files hold users' prompts), which
is also that model's child's ``--slot-save-path``: llama-server reads and writes the ``.slot`` files
there by bare name. Each saved slot is two files with one stem::

    ctx-<ns>-s<slot>.slot   llama-server's own state file (tokens + KV), 0600
    ctx-<ns>-s<slot>.json   forge's manifest: what the file is valid for, tokens, bytes, when

A save is committed in steps that leave nothing restorable half-way: llama-server writes
``tmp-<hex>.slot``; forge renames it to its final name, then writes the manifest under a temporary
name and renames it. The manifest is the commit: a ``.slot`` without one, or whose size is not the
manifest's, is never handed to a child (:meth:`ContextStore.sweep` removes the leftovers).

A file is valid only for the same model file, the same KV layout (context, slots, cache types) and
the same llama-server build (:class:`ContextKey`); anything else is deleted, never loaded. Nothing
here talks to a child: :mod:`._keep_context` does, and publishes the events.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["ContextKey", "ContextStore", "ContextSummary", "SavedContext", "context_key"]

_MANIFEST_VERSION = 1
_DATA, _MANIFEST = ".slot", ".json"
_TMP_PREFIX = "tmp-"

#: llama-server flags that change the layout of a slot's state file (how the KV is stored), each
#: spelling → its long form.
_LAYOUT_FLAGS = {
    "-ctk": "--cache-type-k",
    "-ctv": "--cache-type-v",
    "-fa": "--flash-attn",
    "-kvu": "--kv-unified",
    "-no-kvu": "--no-kv-unified",
    **{
        f: f
        for f in (
            "--cache-type-k",
            "--cache-type-v",
            "--flash-attn",
            "--swa-full",
            "--kv-unified",
            "--no-kv-unified",
        )
    },
}
_VALUED = frozenset({"--cache-type-k", "--cache-type-v", "--flash-attn"})


def _file_identity(path: Path) -> dict[str, Any]:
    """Path, size and mtime: a replaced or rebuilt file differs (hashing GBs at each stop would not)."""
    try:
        st = path.stat()
    except OSError:
        return {"path": str(path), "size": None, "mtime_ns": None}
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _layout_args(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    it = iter(args)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag.startswith("--"):
            flag = flag.replace("_", "-")  # llama.cpp's own --foo_bar → --foo-bar
        if flag not in _LAYOUT_FLAGS:
            continue
        flag = _LAYOUT_FLAGS[flag]
        if flag in _VALUED and not eq:
            value = next(it, "")
        out.append(f"{flag}={value}" if flag in _VALUED else flag)
    return out


@dataclass(frozen=True)
class ContextKey:
    """What a saved slot is valid for: the model file, the KV layout, the llama-server build."""

    model: dict[str, Any]
    layout: dict[str, Any]
    build: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "layout": self.layout, "build": self.build}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContextKey:
        return cls(model=dict(data["model"]), layout=dict(data["layout"]), build=dict(data["build"]))

    def mismatch(self, current: ContextKey) -> str | None:
        """None when a file saved under ``self`` fits a child described by ``current``; else what
        differs, in words (for the event)."""
        if self.model != current.model:
            return "another model file (path, size or mtime differ)"
        if self.layout != current.layout:
            return f"another KV layout (saved {self.layout}, now {current.layout})"
        if self.build != current.build:
            return "another llama-server build"
        return None


def context_key(
    *, model_path: Path, binary: Path, ctx_size: int | None, parallel: int | None, args: Sequence[str]
) -> ContextKey:
    """The key of a child started with these: what its saved slots will be valid for."""
    return ContextKey(
        model=_file_identity(model_path),
        layout={"ctx_size": ctx_size, "parallel": parallel, "flags": _layout_args(args)},
        build=_file_identity(binary),
    )


@dataclass(frozen=True)
class SavedContext:
    """One saved slot. ``problem`` says why it cannot be restored (then it is only ever deleted)."""

    directory: Path
    stem: str
    model: str = ""
    slot: int = 0
    tokens: int = 0
    bytes: int = 0
    saved_at: float = 0.0
    used_at: float = 0.0
    key: ContextKey | None = None
    problem: str | None = None

    @property
    def filename(self) -> str:
        """The bare name llama-server's ``/slots`` actions take."""
        return self.stem + _DATA

    @property
    def data_path(self) -> Path:
        return self.directory / (self.stem + _DATA)

    @property
    def manifest_path(self) -> Path:
        return self.directory / (self.stem + _MANIFEST)

    def manifest(self) -> dict[str, Any]:
        return {
            "version": _MANIFEST_VERSION,
            "model": self.model,
            "slot": self.slot,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "saved_at": self.saved_at,
            "used_at": self.used_at,
            "key": self.key.to_json() if self.key else None,
        }


@dataclass(frozen=True)
class ContextSummary:
    """What ``forge ps`` and ``/api/models`` show of a model's saved contexts."""

    count: int = 0
    tokens: int = 0
    bytes: int = 0
    newest: float | None = None
    conversations: int = 0  # of ``count``: the per-conversation tier's states (``conv-``)
    conversation_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "newest": self.newest,
            "conversation_states": self.conversations,
            "conversation_state_bytes": self.conversation_bytes,
        }


@dataclass
class ContextStore:
    """The saved slots of every model under one root, with one disk budget (LRU)."""

    root: Path
    max_bytes: int
    _dirs: dict[str, Path] = field(default_factory=dict)
    #: Each model's summary as last read from disk: what ``status()`` shows, read on the event
    #: loop, so it never touches the disk there (:meth:`refresh` re-reads, from a thread).
    _summaries: dict[str, ContextSummary] = field(default_factory=dict)

    # -- places ----------------------------------------------------------------------------------

    def directory(self, model: str, *, create: bool = True) -> Path:
        """The model's directory (its child's ``--slot-save-path``), created 0700 with the root.
        Raises OSError when it cannot be created (the caller warns and starts without saving)."""
        path = self._dirs.get(model)
        if path is None:
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", model)
            if safe != model or safe.startswith("."):
                safe = f"{safe.lstrip('.')}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
            path = self._dirs[model] = self.root / safe
        if create:
            for d in (self.root, path):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                if d.stat().st_mode & 0o777 != 0o700:
                    d.chmod(0o700)  # mkdir's mode is masked by the umask; an old dir may be wider
        return path

    @staticmethod
    def temp_name() -> str:
        """A bare file name for llama-server to write a save into (never restored by that name)."""
        return f"{_TMP_PREFIX}{secrets.token_hex(6)}{_DATA}"

    # -- writing ---------------------------------------------------------------------------------

    def commit(
        self, model: str, temp: str, *, slot: int, tokens: int, key: ContextKey, stem: str | None = None
    ) -> SavedContext:
        """Make a finished save restorable: 0600, its final name, then its manifest (the commit).
        Raises OSError (a full disk…): the caller discards the save and warns."""
        d = self.directory(model)
        now = time.time()
        stem = stem or f"ctx-{time.time_ns()}-s{slot}"
        src = d / temp
        try:
            src.chmod(0o600)
            size = src.stat().st_size
            entry = SavedContext(d, stem, model, slot, tokens, size, now, now, key)
            src.rename(entry.data_path)
            self._write_manifest(entry)
        except OSError:
            for p in (src, d / (stem + _DATA)):
                p.unlink(missing_ok=True)
            raise
        return entry

    def touch(self, entry: SavedContext, *, demote: bool = False) -> SavedContext:
        """Mark it used now (restored): the budget removes the least recently used first.
        ``demote``: mark it used never instead, so the budget removes it before any other."""
        used = replace(entry, used_at=0.0 if demote else time.time())
        with contextlib.suppress(OSError):
            self._write_manifest(used)
        return used

    def _write_manifest(self, entry: SavedContext) -> None:
        tmp = entry.directory / f"{_TMP_PREFIX}{secrets.token_hex(6)}{_MANIFEST}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry.manifest(), f)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(entry.manifest_path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def discard(self, model: str, name: str) -> None:
        """A save that will not be committed (empty slot, failed, timed out)."""
        with contextlib.suppress(OSError):
            (self.directory(model, create=False) / name).unlink(missing_ok=True)

    def delete(self, entry: SavedContext) -> None:
        # The manifest first: from then on the data file is a leftover, never restored.
        for p in (entry.manifest_path, entry.data_path):
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)

    def sweep(self, model: str) -> int:
        """Remove what no manifest commits: temporary files, data files without a manifest.
        Only while no save of this model is in flight (before a restore, after a stop)."""
        d = self.directory(model, create=False)
        try:
            names = {p.name for p in d.iterdir()}
        except OSError:
            return 0
        removed = 0
        for name in names:
            orphan = name.endswith(_DATA) and name[: -len(_DATA)] + _MANIFEST not in names
            if name.startswith(_TMP_PREFIX) or orphan:
                with contextlib.suppress(OSError):
                    (d / name).unlink()
                    removed += 1
        return removed

    def forget(self, model: str) -> int:
        """Delete every saved context of ``model`` (``forge unload NAME --forget``); how many."""
        entries = self.entries(model)
        for e in entries:
            self.delete(e)
        self.sweep(model)
        self._summaries[model] = ContextSummary()
        return len(entries)

    def replace_older(self, model: str, keep: Iterable[SavedContext]) -> list[SavedContext]:
        """After a stop saved ``keep``: the model's earlier saves are superseded; removed."""
        stems = {e.stem for e in keep}
        # A conversation's state (``conv-``, :mod:`._conversations`) is not superseded by a stop.
        old = [e for e in self.entries(model) if e.stem not in stems and not e.stem.startswith("conv-")]
        for e in old:
            self.delete(e)
        return old

    def enforce_budget(self) -> list[SavedContext]:
        """Remove the least recently used saves (all models together) until within ``max_bytes``."""
        everything = sorted(
            (e for name in self._models() for e in self.entries(name)), key=lambda e: e.used_at
        )
        total = sum(e.bytes for e in everything)
        removed: list[SavedContext] = []
        for e in everything:
            if total <= self.max_bytes:
                break
            self.delete(e)
            total -= e.bytes
            removed.append(e)
        return removed

    # -- reading ---------------------------------------------------------------------------------

    def entries(self, model: str) -> list[SavedContext]:
        """The model's committed saves, most recently used first; unusable ones carry a ``problem``."""
        d = self.directory(model, create=False)
        try:
            manifests = [
                p for p in d.iterdir() if p.suffix == _MANIFEST and not p.name.startswith(_TMP_PREFIX)
            ]
        except OSError:
            return []
        out = [self._read(d, p) for p in manifests]
        return sorted(out, key=lambda e: e.used_at, reverse=True)

    def entry(self, model: str, stem: str) -> SavedContext | None:
        """One committed save by name (a conversation's next turn looks up one, not all)."""
        d = self.directory(model, create=False)
        manifest = d / (stem + _MANIFEST)
        return self._read(d, manifest) if manifest.exists() else None

    def summary(self, model: str) -> ContextSummary:
        """The model's saves as the disk has them now (a thread's work), remembered for
        :meth:`known_summary`."""
        good = [e for e in self.entries(model) if e.problem is None]
        summary = self._summaries[model] = ContextSummary(
            count=len(good),
            tokens=sum(e.tokens for e in good),
            bytes=sum(e.bytes for e in good),
            newest=max((e.saved_at for e in good), default=None),
            conversations=sum(1 for e in good if e.stem.startswith("conv-")),
            conversation_bytes=sum(e.bytes for e in good if e.stem.startswith("conv-")),
        )
        return summary

    def known_summary(self, model: str) -> ContextSummary:
        """The summary last read (an empty one before the first): no disk, for the event loop."""
        return self._summaries.get(model) or ContextSummary()

    def refresh(self, models: Iterable[str] = ()) -> None:
        """Re-read the summaries of ``models`` and of every model read before (a save's budget
        may have removed another model's saves). Reads the disk: call it from a thread."""
        for name in {*models, *list(self._summaries)}:
            self.summary(name)

    def _models(self) -> list[str]:
        """Every model with a directory here (names from the manifests, which keep the real name)."""
        names: set[str] = set(self._dirs)
        try:
            dirs = [p for p in self.root.iterdir() if p.is_dir()]
        except OSError:
            dirs = []
        for d in dirs:
            if d in self._dirs.values():
                continue
            for p in d.glob(f"*{_MANIFEST}"):
                e = self._read(d, p)
                if e.model:
                    self._dirs.setdefault(e.model, d)
                    names.add(e.model)
                    break
        return sorted(names)

    @staticmethod
    def _read(d: Path, manifest: Path) -> SavedContext:
        stem = manifest.name[: -len(_MANIFEST)]
        try:
            data = json.loads(manifest.read_text())
            if data.get("version") != _MANIFEST_VERSION:
                raise ValueError(f"manifest version {data.get('version')!r}")
            entry = SavedContext(
                d,
                stem,
                model=str(data["model"]),
                slot=int(data["slot"]),
                tokens=int(data["tokens"]),
                bytes=int(data["bytes"]),
                saved_at=float(data["saved_at"]),
                used_at=float(data["used_at"]),
                key=ContextKey.from_json(data["key"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return SavedContext(d, stem, problem=f"unreadable manifest {manifest.name}: {exc}")
        try:
            size = entry.data_path.stat().st_size
        except OSError as exc:
            return replace(entry, problem=f"{entry.filename}: {exc.strerror or exc}")
        if size != entry.bytes:
            problem = (
                f"{entry.filename} is {size} bytes, its manifest says {entry.bytes}: truncated or changed"
            )
            return replace(entry, problem=problem)
        return entry
