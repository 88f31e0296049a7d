"""Reading a GGUF's header: what the model is, how big each layer is, and whether the file is whole.

Every load is validated here first, so a bad file gets one clear error instead of a child that
exits with a loader trace. The parsing itself is the ``gguf`` package's :class:`GGUFReader`; see
:class:`_HeaderReader` for the one thing we change about it and why.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFEndian, GGUFReader, GGUFValueType, LlamaFileType
from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType

from .._errors import InvalidModelFile, ModelNotFound
from ._names import parse_split_name

#: whisper.cpp's model files start with ``ggml`` as a little-endian int (the bytes ``lmgg``).
_GGML_MAGIC = 0x67676D6C

__all__ = ["SUPPORTED_GGUF_VERSIONS", "GGUFInfo", "inspect_gguf", "read_gguf_keys"]

#: The GGUF versions llama.cpp (and the gguf package) read.
SUPPORTED_GGUF_VERSIONS = (2, 3)

_BLK_RE = re.compile(r"^blk\.(\d+)\.")

# Architectures that use interleaved sliding-window attention, and llama.cpp's default period
# when the file has no ``sliding_window_pattern`` (src/models/<arch>.cpp at the pinned commit):
# ``period`` N means layer il is a window layer unless il % N == N - 1.
_DEFAULT_SWA_PERIOD = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3n": 5,
    "cohere2": 4,
    "llama4": 4,
}
# gemma2 files often lack the window size: llama.cpp then uses this.
_DEFAULT_SWA_WINDOW = {"gemma2": 4096}


# Weight types the CPU backend copies into a repacked layout (``CPU_REPACK`` buffer) on x86-64
# with AVX2 (ggml-cpu/repack.cpp, ``ggml_repack_get_optimal_repack_type``): the copy is extra
# memory on top of the mapped file. Q2_K joins them with AVX-512; we leave it out.
_CPU_REPACKED = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})


class _InvalidHeader(Exception):
    """Raised inside the reader for a structural problem we can name precisely."""


class _HeaderReader(GGUFReader):
    """:class:`GGUFReader` with large metadata arrays read in one step.

    The stock reader builds one numpy view per array element, which takes ~20 s for the
    262,144-entry vocabulary of gemma-3 (three such arrays). We only need those arrays' lengths,
    so arrays longer than ``_SMALL`` are skipped over: scalar arrays as a single view, string
    arrays by walking their length prefixes with :mod:`struct`. Small arrays (per-layer head
    counts, window patterns) keep the stock behaviour. Tensor data is also checked against the
    file's end before the stock reader maps it, so truncation gets its own message.
    """

    _SMALL = 4096

    def _get_field_parts(
        self, orig_offs: int, raw_type: int
    ) -> tuple[int, list[np.ndarray[Any, Any]], list[int], list[GGUFValueType]]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs
        raw_itype = self._get(offs, np.uint32)
        alen = self._get(offs + 4, np.uint64)
        count = int(alen[0])
        if count <= self._SMALL:
            return super()._get_field_parts(orig_offs, raw_type)
        offs += 12
        itype = GGUFValueType(int(raw_itype[0]))
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:
            values = self._get(offs, nptype, count)
            if len(values) != count:
                raise _InvalidHeader("a metadata array runs past the end of the file")
            return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
        if itype != GGUFValueType.STRING:
            raise _InvalidHeader(f"unsupported metadata array of {itype.name}")
        fmt = "<Q" if self.endianess == GGUFEndian.LITTLE else ">Q"
        buf = memoryview(self.data)  # type: ignore[arg-type]
        size = len(buf)
        unpack = struct.Struct(fmt).unpack_from
        pos = offs
        for _ in range(count):
            if pos + 8 > size:
                raise _InvalidHeader("a metadata string array runs past the end of the file")
            pos += 8 + unpack(buf, pos)[0]
        if pos > size:
            raise _InvalidHeader("a metadata string array runs past the end of the file")
        blob = self._get(offs, np.uint8, pos - offs)
        return pos - orig_offs, [raw_itype, alen, blob], [], [GGUFValueType.ARRAY, itype]

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        size = len(self.data)
        for f in fields:
            _nl, name_data, _nd, dims, raw_dtype, offset_tensor = f.parts
            try:
                qtype = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                name = bytes(name_data).decode("utf-8", "replace")
                raise _InvalidHeader(
                    f"tensor {name} has ggml type {int(raw_dtype[0])}, which this gguf package does not know"
                ) from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n_bytes = int(np.prod(dims)) * type_size // block
            end = start_offs + int(offset_tensor[0]) + n_bytes
            if end > size:
                raise _Truncated(end, size)
        super()._build_tensors(start_offs, fields)


class _Truncated(Exception):
    def __init__(self, needed: int, size: int) -> None:
        super().__init__(needed, size)
        self.needed = needed
        self.size = size


@dataclass(frozen=True)
class GGUFInfo:
    """What a model file says about itself, and the sizes the memory estimate needs.

    For a split model, ``path`` is the first part (the one llama-server is given) and the sizes
    cover every part.
    """

    path: Path
    architecture: str
    name: str | None
    size_label: str | None
    parameter_count: int
    file_type: str
    """Quantization of the file as a whole (``Q4_K_M``); guessed from the tensors if unset."""
    file_type_id: int | None
    gguf_version: int
    context_length: int | None
    block_count: int
    head_count: int
    head_count_kv: tuple[int, ...]
    """Per layer (usually all equal: use :attr:`head_count_kv_max` for display)."""
    embedding_length: int
    feed_forward_length: int | None
    key_length: int
    value_length: int
    vocab_size: int
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    """Per layer: True where the layer attends only to the last ``sliding_window`` tokens."""
    has_chat_template: bool
    split_files: tuple[Path, ...]
    file_size_bytes: int
    tensor_count: int
    tensor_bytes: int
    layer_bytes: tuple[int, ...]
    """Weight bytes of each repeating block ``blk.N.*``."""
    input_bytes: int
    """Token embedding (and other input tensors): llama.cpp always keeps these on the CPU."""
    output_bytes: int
    """Output norm and head (``output*`` tensors)."""
    output_tied: bool
    """No ``output.weight``: the head is the token embedding, loaded again on a GPU output layer."""
    embedding_bytes: int
    """``token_embd.weight`` (part of ``input_bytes``)."""
    layer_repack_bytes: tuple[int, ...] = ()
    """Per block: weight bytes the CPU backend repacks into a second copy when the block is on the CPU."""
    output_repack_bytes: int = 0
    tensor_types: Mapping[str, int] = field(default_factory=dict)
    """Bytes per ggml type (``Q4_K`` → bytes), for the quantization display."""

    @classmethod
    def outside(
        cls,
        path: Path,
        *,
        architecture: str,
        name: str | None,
        file_type: str,
        size_bytes: int,
        size_label: str | None = None,
        file_type_id: int | None = None,
        block_count: int = 0,
        head_count: int = 0,
        embedding_length: int = 0,
        vocab_size: int = 0,
        has_chat_template: bool = False,
        split_files: tuple[Path, ...] = (),
    ) -> GGUFInfo:
        """What the listings and placement know of a model that is no GGUF forge reads (a
        whisper.cpp file, a command's model): its size and what its own format says, every other
        count zero."""
        return cls(
            path=path,
            architecture=architecture,
            name=name,
            size_label=size_label,
            parameter_count=0,
            file_type=file_type,
            file_type_id=file_type_id,
            gguf_version=0,
            context_length=None,
            block_count=block_count,
            head_count=head_count,
            head_count_kv=(),
            embedding_length=embedding_length,
            feed_forward_length=None,
            key_length=0,
            value_length=0,
            vocab_size=vocab_size,
            sliding_window=None,
            swa_layers=(),
            has_chat_template=has_chat_template,
            split_files=split_files,
            file_size_bytes=size_bytes,
            tensor_count=0,
            tensor_bytes=size_bytes,
            layer_bytes=(),
            input_bytes=0,
            output_bytes=0,
            output_tied=False,
            embedding_bytes=0,
        )

    @property
    def head_count_kv_max(self) -> int:
        return max(self.head_count_kv, default=0)

    @property
    def is_split(self) -> bool:
        return len(self.split_files) > 1

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "name": self.name,
            "size_label": self.size_label,
            "parameter_count": self.parameter_count,
            "file_type": self.file_type,
            "file_type_id": self.file_type_id,
            "gguf_version": self.gguf_version,
            "context_length": self.context_length,
            "block_count": self.block_count,
            "head_count": self.head_count,
            "head_count_kv": self.head_count_kv_max,
            "head_count_kv_per_layer": list(self.head_count_kv),
            "embedding_length": self.embedding_length,
            "feed_forward_length": self.feed_forward_length,
            "key_length": self.key_length,
            "value_length": self.value_length,
            "vocab_size": self.vocab_size,
            "sliding_window": self.sliding_window,
            "sliding_window_layers": sum(self.swa_layers),
            "has_chat_template": self.has_chat_template,
            "split_files": [str(p) for p in self.split_files],
            "file_size_bytes": self.file_size_bytes,
            "tensor_count": self.tensor_count,
            "tensor_bytes": self.tensor_bytes,
            "tensor_types": dict(self.tensor_types),
        }


# -- validation ------------------------------------------------------------------------------------


def _check_prefix(path: Path) -> None:
    """Magic and version from the first 8 bytes, before handing the file to the reader."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise InvalidModelFile(
            f"cannot read {path}: {exc.strerror or exc}", hint="check the file's permissions"
        ) from exc
    if len(head) < 8:
        raise InvalidModelFile(
            f"{path} is not a GGUF model: it is only {len(head)} bytes long",
            hint="download the model again",
        )
    (magic,) = struct.unpack("<I", head[:4])
    if magic == _GGML_MAGIC:  # whisper.cpp's own format: served by the whisper backend
        raise InvalidModelFile(
            f"{path} is a whisper.cpp (GGML) model, not a GGUF one: llama-server cannot load it",
            hint='serve it with forge serve: [models.NAME] path = "…" backend = "whisper" '
            "(POST /v1/audio/transcriptions)",
        )
    if magic != GGUF_MAGIC:
        raise InvalidModelFile(
            f"{path} is not a GGUF model: it starts with {head[:4]!r}, expected b'GGUF'",
            hint="pass a .gguf file (safetensors or PyTorch checkpoints must be converted with "
            "llama.cpp's convert_hf_to_gguf.py first)",
        )
    version = int.from_bytes(head[4:8], "little")
    if version & 0xFFFF == 0:  # written on a big-endian host
        version = int.from_bytes(head[4:8], "big")
    if version not in SUPPORTED_GGUF_VERSIONS:
        raise InvalidModelFile(
            f"{path} is GGUF version {version}; llama-server reads versions "
            f"{' and '.join(map(str, SUPPORTED_GGUF_VERSIONS))}",
            hint="convert the model again with a current llama.cpp (or download a newer upload)",
        )


def _read(path: Path) -> _HeaderReader:
    _check_prefix(path)
    try:
        return _HeaderReader(path)
    except _Truncated as exc:
        raise InvalidModelFile(
            f"{path} is truncated: its tensor data needs {exc.needed:,} bytes but the file has {exc.size:,}",
            hint="the download or copy was interrupted: download the model again",
        ) from exc
    except _InvalidHeader as exc:
        raise InvalidModelFile(f"{path} is not a valid GGUF model: {exc}", hint="download it again") from exc
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        raise InvalidModelFile(
            f"{path} is truncated or corrupt: its GGUF header cannot be read ({exc})",
            hint="download the model again",
        ) from exc
    except OSError as exc:
        raise InvalidModelFile(f"cannot read {path}: {exc.strerror or exc}") from exc


# -- metadata helpers ------------------------------------------------------------------------------


def _value(reader: GGUFReader, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None or not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING and not f.data:
            return None  # a long string array we skipped: callers only ask for its length
        return f.contents()
    return f.contents()


def _array_len(reader: GGUFReader, key: str) -> int | None:
    f = reader.fields.get(key)
    if f is None or not f.types or f.types[0] != GGUFValueType.ARRAY:
        return None
    # parts: key length, key bytes, value type, item type, item count, ...
    return int(f.parts[4][0])


def _per_layer(value: Any, n_layer: int, default: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * n_layer
    if isinstance(value, list):
        vals = [int(v) for v in value][:n_layer]
        return tuple(vals + [vals[-1] if vals else default] * (n_layer - len(vals)))
    return (int(value),) * n_layer


def _swa_layers(arch: str, reader: GGUFReader, n_layer: int, window: int | None) -> tuple[bool, ...]:
    if not window:
        return (False,) * n_layer
    pattern = _value(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and pattern:
        flags = [bool(v) for v in pattern][:n_layer]
        return tuple(flags + [False] * (n_layer - len(flags)))
    period = int(pattern) if isinstance(pattern, int) else _DEFAULT_SWA_PERIOD.get(arch)
    if period is None:
        # An architecture we don't know the layout of: count every layer as full (over-estimate).
        return (False,) * n_layer
    if period == 0:
        return (True,) * n_layer
    return tuple(il % period < period - 1 for il in range(n_layer))


def _file_type_name(file_type_id: int | None, type_bytes: Mapping[str, int]) -> str:
    if file_type_id is not None:
        try:
            name = LlamaFileType(file_type_id).name
        except ValueError:
            return f"unknown({file_type_id})"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    # No general.file_type: name it after the type holding most of the weight bytes.
    if not type_bytes:
        return "unknown"
    return max(type_bytes.items(), key=lambda kv: kv[1])[0] + " (guessed)"


# -- the public reader -----------------------------------------------------------------------------


def _split_parts(path: Path, reader: GGUFReader) -> list[Path]:
    count = _value(reader, "split.count")
    count = int(count) if count else 1
    parsed = parse_split_name(path.name)
    if count <= 1:
        return [path]
    if parsed is None or parsed.count != count:
        raise InvalidModelFile(
            f"{path} is part of a {count}-part split model but is not named like one "
            f"(<name>-00001-of-{count:05d}.gguf)",
            hint="keep the names gguf-split gave the parts: llama-server finds the others by name",
        )
    parts = [path.with_name(n) for n in parsed.all_parts()]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise ModelNotFound(
            f"split model {parsed.prefix} is missing {len(missing)} of its {count} parts "
            f"({', '.join(missing[:3])}{'…' if len(missing) > 3 else ''})",
            hint=f"put all {count} parts in {path.parent}",
        )
    return parts


def inspect_gguf(path: Path) -> GGUFInfo:
    """Read and validate a GGUF model (all parts of a split one).

    Raises :class:`InvalidModelFile` for bad magic, an unsupported version, a corrupt header or
    truncated tensor data, and :class:`ModelNotFound` for a missing file or split part. Given any
    part of a split model, the result describes the whole model, with ``path`` its first part.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelNotFound(
            f"no model file at {path}", hint="pass an existing .gguf path (forge pull can fetch one)"
        )
    parsed = parse_split_name(path.name)
    if parsed is not None and parsed.no != 1:
        first = path.with_name(parsed.part(1))
        if not first.is_file():
            raise ModelNotFound(
                f"{path.name} is part {parsed.no} of a split model whose first part {first.name} is missing",
                hint=f"put all {parsed.count} parts in {path.parent}",
            )
        path = first

    reader = _read(path)
    gguf_version = int(_value(reader, "GGUF.version"))
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidModelFile(
            f"{path} has no general.architecture: it is not a model GGUF (a LoRA or vocabulary file?)",
            hint="pass the model's .gguf file",
        )
    parts = _split_parts(path, reader)
    readers = [reader] + [_read(p) for p in parts[1:]]

    tensors = [t for r in readers for t in r.tensors]
    if not tensors:
        raise InvalidModelFile(
            f"{path} holds no tensors (a vocabulary-only GGUF?)", hint="pass a model file with weights"
        )

    def key(k: str) -> Any:
        return _value(reader, f"{arch}.{k}")

    n_layer = int(key("block_count") or 0)
    n_embd = int(key("embedding_length") or 0)
    n_head_raw = key("attention.head_count")
    n_head = int(max(n_head_raw) if isinstance(n_head_raw, list) else (n_head_raw or 0))
    head_kv = _per_layer(key("attention.head_count_kv"), n_layer, n_head)
    head_dim = n_embd // n_head if n_head else 0
    key_length = int(key("attention.key_length") or head_dim)
    value_length = int(key("attention.value_length") or head_dim)
    window_raw = key("attention.sliding_window")
    window = int(window_raw) if window_raw else _DEFAULT_SWA_WINDOW.get(arch)
    swa = _swa_layers(arch, reader, n_layer, window)
    ctx = key("context_length")
    ff = key("feed_forward_length")
    vocab = _array_len(reader, "tokenizer.ggml.tokens") or int(key("vocab_size") or 0)
    has_template = any(k.startswith("tokenizer.chat_template") for k in reader.fields)

    layer_bytes = [0] * n_layer
    layer_repack = [0] * n_layer
    input_bytes = output_bytes = output_repack = 0
    type_bytes: dict[str, int] = {}
    names = set()
    for t in tensors:
        n = int(t.n_bytes)
        names.add(t.name)
        type_bytes[t.tensor_type.name] = type_bytes.get(t.tensor_type.name, 0) + n
        repacked = t.tensor_type.name in _CPU_REPACKED and len(t.shape) == 2 and int(t.shape[1]) % 8 == 0
        m = _BLK_RE.match(t.name)
        if m is not None and int(m[1]) < n_layer:
            layer_bytes[int(m[1])] += n
            layer_repack[int(m[1])] += n if repacked else 0
        elif t.name.startswith("output"):
            output_bytes += n
            output_repack += n if repacked else 0
        else:
            input_bytes += n
    output_tied = "output.weight" not in names
    tok = next((t for t in tensors if t.name == "token_embd.weight"), None)
    embedding_bytes = int(tok.n_bytes) if tok is not None else 0

    file_type_raw = _value(reader, "general.file_type")
    file_type_id = int(file_type_raw) if file_type_raw is not None else None
    name = _value(reader, "general.name")
    size_label = _value(reader, "general.size_label")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=name if isinstance(name, str) else None,
        size_label=size_label if isinstance(size_label, str) else None,
        parameter_count=sum(int(t.n_elements) for t in tensors),
        file_type=_file_type_name(file_type_id, type_bytes),
        file_type_id=file_type_id,
        gguf_version=gguf_version,
        context_length=int(ctx) if ctx else None,
        block_count=n_layer,
        head_count=n_head,
        head_count_kv=head_kv,
        embedding_length=n_embd,
        feed_forward_length=(int(max(ff)) if isinstance(ff, list) else int(ff)) if ff else None,
        key_length=key_length,
        value_length=value_length,
        vocab_size=vocab,
        sliding_window=window if any(swa) else None,
        swa_layers=swa,
        has_chat_template=has_template,
        split_files=tuple(parts),
        file_size_bytes=sum(p.stat().st_size for p in parts),
        tensor_count=len(tensors),
        tensor_bytes=sum(int(t.n_bytes) for t in tensors),
        layer_bytes=tuple(layer_bytes),
        input_bytes=input_bytes,
        output_bytes=output_bytes,
        output_tied=output_tied,
        embedding_bytes=embedding_bytes,
        layer_repack_bytes=tuple(layer_repack),
        output_repack_bytes=output_repack,
        tensor_types=dict(sorted(type_bytes.items(), key=lambda kv: -kv[1])),
    )


def read_gguf_keys(path: Path, keys: Iterable[str]) -> dict[str, Any]:
    """The values of some metadata keys (missing ones left out): a chat template, FIM token ids.

    Apart from :func:`inspect_gguf` because only the API's model cards need these, and the chat
    template string is large.
    """
    reader = _read(Path(path))
    out: dict[str, Any] = {}
    for k in keys:
        v = _value(reader, k)
        if v is not None:
            out[k] = v
    return out
