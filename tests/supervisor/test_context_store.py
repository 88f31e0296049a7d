"""The saved-context store on real files: commit order, modes, what is never restored (leftovers,
truncated files, unreadable manifests), the key's mismatches, the LRU budget, forget.

No llama-server here: the ``.slot`` payloads are plain bytes standing in for what it writes (the
store never reads them); the end-to-end behaviour is in tests/gateway/test_keep_context.py.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from rocmforge_supervisor.supervisor.contexts._context_store import (
    ContextKey,
    ContextStore,
    SavedContext,
    context_key,
)


def _key(tmp_path: Path, *, ctx_size: int = 2048, args: Sequence[str] = ()) -> ContextKey:
    model = tmp_path / "m.gguf"
    binary = tmp_path / "llama-server"
    for p in (model, binary):
        if not p.exists():
            p.write_bytes(b"x" * 10)
    return context_key(model_path=model, binary=binary, ctx_size=ctx_size, parallel=1, args=args)


def _save(store: ContextStore, model: str, size: int, tmp_path: Path, slot: int = 0) -> SavedContext:
    """What a save does: llama-server writes the temporary name, the store commits it."""
    temp = store.temp_name()
    (store.directory(model) / temp).write_bytes(b"\1" * size)
    return store.commit(model, temp, slot=slot, tokens=size // 10, key=_key(tmp_path))


def test_commit_makes_a_0600_file_and_manifest_in_a_0700_dir(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", max_bytes=10**9)
    entry = _save(store, "m", 1000, tmp_path)
    assert stat.S_IMODE((tmp_path / "ctx").stat().st_mode) == 0o700
    assert stat.S_IMODE(entry.directory.stat().st_mode) == 0o700
    for p in (entry.data_path, entry.manifest_path):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert [p.name for p in sorted(entry.directory.iterdir())] == [entry.stem + ".json", entry.stem + ".slot"]
    (back,) = store.entries("m")
    assert back.problem is None and back.bytes == 1000 and back.tokens == 100 and back.model == "m"
    assert store.summary("m").to_json()["count"] == 1


def test_a_wider_existing_directory_is_narrowed_to_0700(tmp_path: Path) -> None:
    (tmp_path / "ctx" / "m").mkdir(parents=True, mode=0o755)
    (tmp_path / "ctx" / "m").chmod(0o755)
    ContextStore(tmp_path / "ctx", max_bytes=1).directory("m")
    assert stat.S_IMODE((tmp_path / "ctx" / "m").stat().st_mode) == 0o700


def test_model_names_that_are_not_file_names_get_their_own_directory(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", max_bytes=1)
    a, b = store.directory("org/model:Q4"), store.directory("org_model_Q4")
    assert a != b and a.parent == b.parent == tmp_path / "ctx" and "/" not in a.name
    assert store.directory("..").parent == tmp_path / "ctx"


def test_leftovers_and_truncated_files_are_never_restorable(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", max_bytes=10**9)
    good = _save(store, "m", 1000, tmp_path)
    cut = _save(store, "m", 1000, tmp_path, slot=1)
    with cut.data_path.open("r+b") as f:
        f.truncate(10)
    d = good.directory
    (d / "tmp-abc.slot").write_bytes(b"half")  # a save cut off
    (d / "ctx-1-s0.slot").write_bytes(b"no manifest")  # renamed, manifest never written
    (d / "ctx-2-s0.json").write_text("{not json")
    entries = {e.stem: e for e in store.entries("m")}
    assert entries[good.stem].problem is None
    assert "truncated" in (entries[cut.stem].problem or "")
    assert "unreadable manifest" in (entries["ctx-2-s0"].problem or "")
    assert store.summary("m").count == 1
    assert store.sweep("m") == 2
    assert not (d / "tmp-abc.slot").exists() and not (d / "ctx-1-s0.slot").exists()


def test_the_key_names_what_changed(tmp_path: Path) -> None:
    base = _key(tmp_path)
    assert base.mismatch(_key(tmp_path)) is None
    assert "KV layout" in base.mismatch(_key(tmp_path, ctx_size=4096))
    # Cache types and flash attention change the file's layout; in any spelling llama.cpp takes.
    q8 = _key(tmp_path, args=["-ctk", "q8_0"])
    assert "KV layout" in base.mismatch(q8)
    assert q8.mismatch(_key(tmp_path, args=["--cache_type_k=q8_0"])) is None
    assert base.mismatch(_key(tmp_path, args=["--temp", "0.2"])) is None
    model = tmp_path / "m.gguf"
    model.write_bytes(b"y" * 11)
    assert "model file" in base.mismatch(_key(tmp_path))


def test_the_budget_removes_the_least_recently_used_of_all_models(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", max_bytes=2500)
    old = _save(store, "a", 1000, tmp_path)
    time.sleep(0.01)  # distinct timestamps: the budget orders by them
    mid = _save(store, "b", 1000, tmp_path)
    time.sleep(0.01)
    store.touch(old)  # restored: now the most recently used
    time.sleep(0.01)
    assert store.enforce_budget() == []
    _save(store, "a", 1000, tmp_path, slot=1)
    # A fresh store (another `forge serve`) finds every model's directory from the manifests.
    removed = ContextStore(tmp_path / "ctx", max_bytes=2500).enforce_budget()
    assert [(e.model, e.stem) for e in removed] == [("b", mid.stem)]
    assert store.summary("a").count == 2 and store.summary("b").count == 0


def test_forget_and_replace_older(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", max_bytes=10**9)
    first = _save(store, "m", 100, tmp_path)
    second = _save(store, "m", 100, tmp_path, slot=1)
    assert [e.stem for e in store.replace_older("m", [second])] == [first.stem]
    assert [e.stem for e in store.entries("m")] == [second.stem]
    assert store.forget("m") == 1
    assert list(second.directory.iterdir()) == []


def test_a_directory_that_cannot_be_made_raises_oserror(tmp_path: Path) -> None:
    (tmp_path / "ctx").write_text("a file where the directory should be")
    with pytest.raises(OSError):
        ContextStore(tmp_path / "ctx", max_bytes=1).directory("m")
