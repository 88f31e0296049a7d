"""A tiny random-weight CLIP projector (``mmproj``) GGUF that the real llama-server's mtmd loads.

Why: no registry package ships a vision GGUF with its projector, and a real one is hundreds of
MB. This file goes through the same loader (``tools/mtmd/clip.cpp`` at the pin), the same image
decoding, preprocessing and encoder graph as a real LLaVA-style projector, so the plumbing (the
``--mmproj`` flag, ``/props.modalities``, image parts reaching the child, the extra prompt tokens
an image costs) is exercised for real. The weights are random: what the model "sees" is noise.

The layout is LLaVA's (``clip.projector_type = mlp``): a patch embedding, position embeddings,
``block_count`` ViT blocks, then ``mm.0`` → GELU → ``mm.2`` into the text model's embedding
width. ``clip_n_mmproj_embd`` is ``mm.2.weight``'s output width, which mtmd requires to equal the
text model's ``n_embd`` (else "mismatch between text model … and mmproj").

An image becomes ``(IMAGE_SIZE / PATCH_SIZE) ** 2`` tokens (:data:`IMAGE_TOKENS`).
"""

from __future__ import annotations

import base64
import io
import math
import struct
import wave
import zlib
from pathlib import Path

import gguf
import numpy as np

from .tiny_gguf import TINY_N_EMBD

__all__ = [
    "AUDIO_TOKENS",
    "IMAGE_SIZE",
    "IMAGE_TOKENS",
    "PATCH_SIZE",
    "png_base64",
    "png_bytes",
    "wav_bytes",
    "write_tiny_audio_clip",
    "write_tiny_clip",
]

IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
_N_EMBD = 32
_N_HEAD = 2
_N_FF = 64
_N_LAYER = 2
_PROJ_HIDDEN = 64


class _Weights:
    """Seeded random weights (same seed, same bytes), scaled by fan-in, and the constant ones."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def mat(self, *shape: int) -> np.ndarray:
        weights: np.ndarray = self._rng.standard_normal(shape, dtype=np.float32) / np.float32(
            np.sqrt(shape[-1])
        )
        return weights

    def zeros(self, *shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)

    def ones(self, n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


def _clip_writer(path: Path, name: str, projector: str, *, vision: bool) -> gguf.GGUFWriter:
    """A projector GGUF's writer with the keys every projector has (its kind, which encoder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_string("clip.projector_type", projector)
    writer.add_bool("clip.has_vision_encoder", vision)
    writer.add_bool("clip.has_audio_encoder", not vision)
    return writer


def _encoder_keys(writer: gguf.GGUFWriter, encoder: str, text_n_embd: int) -> None:
    """The encoder's size keys (``clip.vision.*`` or ``clip.audio.*``): the same tiny ViT widths."""
    writer.add_uint32(f"clip.{encoder}.embedding_length", _N_EMBD)
    writer.add_uint32(f"clip.{encoder}.feed_forward_length", _N_FF)
    writer.add_uint32(f"clip.{encoder}.block_count", _N_LAYER)
    writer.add_uint32(f"clip.{encoder}.attention.head_count", _N_HEAD)
    writer.add_float32(f"clip.{encoder}.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32(f"clip.{encoder}.projection_dim", text_n_embd)


def _norms_and_ffn(writer: gguf.GGUFWriter, w: _Weights, block: str) -> None:
    """A block's two layer norms and its feed-forward pair (both encoders lay them out alike)."""
    for norm in ("ln1", "ln2"):
        writer.add_tensor(f"{block}.{norm}.weight", w.ones(_N_EMBD))
        writer.add_tensor(f"{block}.{norm}.bias", w.zeros(_N_EMBD))
    writer.add_tensor(f"{block}.ffn_up.weight", w.mat(_N_FF, _N_EMBD))
    writer.add_tensor(f"{block}.ffn_up.bias", w.zeros(_N_FF))
    writer.add_tensor(f"{block}.ffn_down.weight", w.mat(_N_EMBD, _N_FF))
    writer.add_tensor(f"{block}.ffn_down.bias", w.zeros(_N_EMBD))


def _finish(writer: gguf.GGUFWriter, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_clip(path: Path, *, seed: int = 0, text_n_embd: int = TINY_N_EMBD) -> Path:
    """Write the projector to ``path`` (same arguments, same bytes) and return ``path``.

    ``text_n_embd``: the embedding width of the text model it is meant for (the tiny llama's by
    default); another width makes a projector that llama-server refuses for that model.
    """
    path = Path(path)
    w = _Weights(seed)
    mat, zeros, ones = w.mat, w.zeros, w.ones
    writer = _clip_writer(path, "tiny-clip-test", "mlp", vision=True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    _encoder_keys(writer, "vision", text_n_embd)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    n_pos = (IMAGE_SIZE // PATCH_SIZE) ** 2
    # numpy shapes are GGUF shapes reversed: (out, in) for a matrix, (n_embd, C, kh, kw) for the conv.
    writer.add_tensor("v.patch_embd.weight", mat(_N_EMBD, 3, PATCH_SIZE, PATCH_SIZE))
    writer.add_tensor("v.patch_embd.bias", zeros(_N_EMBD))
    writer.add_tensor("v.position_embd.weight", mat(n_pos, _N_EMBD))
    writer.add_tensor("v.pre_ln.weight", ones(_N_EMBD))
    writer.add_tensor("v.pre_ln.bias", zeros(_N_EMBD))
    for i in range(_N_LAYER):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{part}.weight", mat(_N_EMBD, _N_EMBD))
            writer.add_tensor(f"v.blk.{i}.{part}.bias", zeros(_N_EMBD))
        _norms_and_ffn(writer, w, f"v.blk.{i}")
    writer.add_tensor("mm.0.weight", mat(_PROJ_HIDDEN, _N_EMBD))
    writer.add_tensor("mm.0.bias", zeros(_PROJ_HIDDEN))
    writer.add_tensor("mm.2.weight", mat(text_n_embd, _PROJ_HIDDEN))
    writer.add_tensor("mm.2.bias", zeros(text_n_embd))

    return _finish(writer, path)


def png_bytes(width: int = 40, height: int = 40) -> bytes:
    """A real RGB PNG (a colour gradient), written with the standard library only."""
    rows = b"".join(
        b"\x00" + b"".join(bytes((x * 7 % 256, y * 5 % 256, 100)) for x in range(width))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def png_base64(width: int = 40, height: int = 40) -> str:
    return base64.b64encode(png_bytes(width, height)).decode()


_N_MEL = 128
_A_POS = 1500  # whisper: 30 s of 10 ms frames, halved by the second convolution
_STACK = 4  # 1500 positions stack evenly (8 would leave half a frame: mtmd aborts)
#: Tokens of one clip up to 30 s (whisper pads to 30 s): 1500 positions stacked by 4.
AUDIO_TOKENS = _A_POS // _STACK


def write_tiny_audio_clip(
    path: Path, *, seed: int = 0, text_n_embd: int = TINY_N_EMBD, stack: int = _STACK
) -> Path:
    """An audio projector (Ultravox's layout: a whisper encoder, frames stacked by 4, a SwiGLU
    projector), random weights, that mtmd loads as ``audio`` (``/props.modalities.audio``).

    ``stack=8`` makes one that loads but aborts the child on the first audio (mtmd expects 187
    tokens of 1500 positions and its graph makes 188: ``clip_encode: expected output … tokens``):
    a real input-triggered crash, for the supervisor's handling of one."""
    path = Path(path)
    w = _Weights(seed)
    mat, zeros, ones = w.mat, w.zeros, w.ones
    writer = _clip_writer(path, "tiny-audio-test", "ultravox", vision=False)
    writer.add_uint32("clip.audio.num_mel_bins", _N_MEL)
    _encoder_keys(writer, "audio", text_n_embd)
    writer.add_uint32("clip.audio.projector.stack_factor", stack)

    # conv kernels: numpy (out, in, k) = GGUF {k, in, out}; conv biases (out, 1).
    writer.add_tensor("a.conv1d.1.weight", mat(_N_EMBD, _N_MEL, 3))
    writer.add_tensor("a.conv1d.1.bias", zeros(_N_EMBD, 1))
    writer.add_tensor("a.conv1d.2.weight", mat(_N_EMBD, _N_EMBD, 3))
    writer.add_tensor("a.conv1d.2.bias", zeros(_N_EMBD, 1))
    writer.add_tensor("a.position_embd.weight", mat(_A_POS, _N_EMBD))
    for i in range(_N_LAYER):
        writer.add_tensor(f"a.blk.{i}.attn_q.weight", mat(_N_EMBD, _N_EMBD))
        writer.add_tensor(f"a.blk.{i}.attn_q.bias", zeros(_N_EMBD))
        writer.add_tensor(f"a.blk.{i}.attn_k.weight", mat(_N_EMBD, _N_EMBD))  # whisper: no K bias
        writer.add_tensor(f"a.blk.{i}.attn_v.weight", mat(_N_EMBD, _N_EMBD))
        writer.add_tensor(f"a.blk.{i}.attn_v.bias", zeros(_N_EMBD))
        writer.add_tensor(f"a.blk.{i}.attn_out.weight", mat(_N_EMBD, _N_EMBD))
        writer.add_tensor(f"a.blk.{i}.attn_out.bias", zeros(_N_EMBD))
        _norms_and_ffn(writer, w, f"a.blk.{i}")
    writer.add_tensor("a.post_ln.weight", ones(_N_EMBD))
    writer.add_tensor("a.post_ln.bias", zeros(_N_EMBD))
    stacked = _N_EMBD * stack
    writer.add_tensor("mm.a.norm_pre.weight", ones(stacked))
    writer.add_tensor("mm.a.mlp.1.weight", mat(2 * _PROJ_HIDDEN, stacked))
    writer.add_tensor("mm.a.norm_mid.weight", ones(_PROJ_HIDDEN))
    writer.add_tensor("mm.a.mlp.2.weight", mat(text_n_embd, _PROJ_HIDDEN))

    return _finish(writer, path)


def wav_bytes(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A mono 16-bit WAV of a 440 Hz tone, written with the standard library only."""
    n = int(seconds * rate)
    samples = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n)
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples)
    return out.getvalue()
