"""Multimodal projectors (``mmproj`` GGUFs): what one is, what it costs, and which one fits a model.

A vision or audio model in llama.cpp is two files: the text model, and a projector
(``general.architecture = clip``) that llama-server's mtmd loads with ``--mmproj`` and that turns
an image or a sound into embeddings of the text model's width. The projector sits beside the model
in its Hugging Face repo (``mmproj-model-f16.gguf``) or folder; forge finds it there for
``mmproj = "auto"`` and ``forge pull``, and counts its memory in the estimate.

Its memory: the weights (all its tensors, on the device mtmd runs it on: the first GPU, or the CPU
with ``--no-mmproj-offload``) and a compute buffer for one image (or one audio chunk). The compute
buffer is an allowance, like the text model's, from the encoder's shape: the attention scores of
one layer over all patches plus the activations of its feed-forward; corrected after the load by
the child's own ``reserve_compute_meta`` line (:mod:`._allocations`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .._errors import InvalidModelFile, ModelNotFound
from ._gguf import _read, _value
from ._names import is_mmproj, quant_tag_of

__all__ = ["ProjectorInfo", "choose_projector", "inspect_projector"]

_F32 = 4
#: Tokens of one audio chunk (whisper-style encoders: 30 s of 10 ms frames, halved by the conv).
_AUDIO_TOKENS = 1500
#: Projector precisions in the order forge prefers when a repo has several and none matches the
#: model's quant: what llama.cpp's converters write by default first.
_PREFERRED = ("F16", "BF16", "Q8_0", "F32")


@dataclass(frozen=True)
class ProjectorInfo:
    """What a projector GGUF says about itself, and the sizes the estimate needs."""

    path: Path
    projector_type: str
    vision: bool
    audio: bool
    embedding_length: int
    feed_forward_length: int
    block_count: int
    head_count: int
    image_size: int
    patch_size: int
    weights_bytes: int
    file_size_bytes: int

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(m for m, on in (("vision", self.vision), ("audio", self.audio)) if on)

    @property
    def compute_bytes(self) -> int:
        """An allowance for the encoder's scratch memory on one input (see the module doc)."""
        tokens = 0
        if self.vision and self.patch_size > 0:
            tokens = (self.image_size // self.patch_size) ** 2 + 1
        if self.audio:
            tokens = max(tokens, _AUDIO_TOKENS)
        n_embd = self.embedding_length
        n_ff = self.feed_forward_length or 4 * n_embd
        scores = max(self.head_count, 1) * tokens * tokens * _F32
        acts = tokens * (4 * n_embd + n_ff) * _F32
        image = self.image_size * self.image_size * 3 * _F32 if self.vision else 0
        return scores + acts + image

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "projector_type": self.projector_type,
            "modalities": list(self.modalities),
            "embedding_length": self.embedding_length,
            "block_count": self.block_count,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "weights_bytes": self.weights_bytes,
            "compute_bytes": self.compute_bytes,
            "file_size_bytes": self.file_size_bytes,
        }


def _int(value: object) -> int:
    if isinstance(value, list):
        value = max(value) if value else 0
    return int(value) if isinstance(value, (int, float)) else 0


def inspect_projector(path: Path) -> ProjectorInfo:
    """Read a projector GGUF; a file that is not one is refused here, before any spawn.

    Raises :class:`ModelNotFound` for a missing file and :class:`InvalidModelFile` for a GGUF
    that is not a projector (a text model given as ``mmproj``) or has no encoder.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelNotFound(
            f"no projector file at {path}",
            hint='set [models.NAME] mmproj to an existing mmproj .gguf, "hf:org/repo:FILE" or "auto"',
        )
    reader = _read(path)
    arch = _value(reader, "general.architecture")
    if arch != "clip":
        raise InvalidModelFile(
            f"{path} is not a multimodal projector: its architecture is {arch!r}, not 'clip'",
            hint="mmproj takes the projector file (usually named mmproj-….gguf), not the model",
        )
    vision = bool(_value(reader, "clip.has_vision_encoder"))
    audio = bool(_value(reader, "clip.has_audio_encoder"))
    if not vision and not audio:
        raise InvalidModelFile(
            f"{path} has neither a vision nor an audio encoder (clip.has_vision_encoder/has_audio_encoder)",
            hint="use the projector file of a vision or audio model",
        )
    proj_type = _value(reader, "clip.projector_type") or _value(reader, "clip.vision.projector_type")
    if not proj_type:
        proj_type = _value(reader, "clip.audio.projector_type")
    prefix = "clip.vision" if vision else "clip.audio"

    def key(k: str) -> int:
        return _int(_value(reader, f"{prefix}.{k}"))

    image_size = _int(_value(reader, "clip.vision.image_size"))
    max_pixels = _int(_value(reader, "clip.vision.image_max_pixels"))
    if max_pixels:  # dynamic-resolution encoders (Qwen2-VL…): the largest image they take
        image_size = max(image_size, math.isqrt(max_pixels))
    return ProjectorInfo(
        path=path,
        projector_type=str(proj_type or "unknown"),
        vision=vision,
        audio=audio,
        embedding_length=key("embedding_length"),
        feed_forward_length=key("feed_forward_length"),
        block_count=key("block_count"),
        head_count=key("attention.head_count"),
        image_size=image_size,
        patch_size=_int(_value(reader, "clip.vision.patch_size")),
        weights_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        file_size_bytes=path.stat().st_size,
    )


def choose_projector(files: Sequence[str], model_file: str | None = None) -> tuple[str | None, list[str]]:
    """The projector among ``files`` (a repo listing or a folder) for the model ``model_file``,
    and all the candidates (so that a caller can say which it took when there were several).

    Pure. Prefers a projector in the model's own folder, then one carrying the model's quant tag
    (``mmproj-Q8_0.gguf`` beside ``model-Q8_0.gguf``), then F16, BF16, Q8_0, F32, then the first by
    name. None when there is no projector.
    """
    candidates = sorted(f for f in files if f.lower().endswith(".gguf") and is_mmproj(f))
    if not candidates:
        return None, []
    pool = candidates
    if model_file is not None:
        folder = PurePosixPath(model_file).parent
        beside = [c for c in candidates if PurePosixPath(c).parent == folder]
        pool = beside or candidates
        tag = quant_tag_of(model_file)
        if tag is not None:
            same = [c for c in pool if quant_tag_of(c) == tag]
            if same:
                return same[0], candidates
    for wanted in _PREFERRED:
        for c in pool:
            if quant_tag_of(c) == wanted:
                return c, candidates
    return pool[0], candidates
