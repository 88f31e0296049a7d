"""A whisper.cpp model file: checked, described and sized for placement (``backend = "whisper"``).

whisper.cpp loads its own GGML format (magic ``ggml``, little-endian ``0x67676d6c``), not GGUF, so
:func:`inspect_gguf` cannot read it. :func:`inspect_whisper` checks the magic and the header (a
wrong file is refused before any spawn, in one line) and fills the :class:`GGUFInfo` the launch
pipeline carries with what a whisper model has: its size and its name, no context or blocks.

Memory: the estimate is the file (the weights, loaded whole on the one device) plus the state
whisper.cpp allocates beside it (KV caches and four compute buffers: about 130 MB for tiny,
growing slowly with the model). The child's own lines correct it once it has loaded::

    whisper_model_load:          CPU total size =    77.11 MB
    whisper_init_state: kv self size  =    3.15 MB
    whisper_init_state: compute buffer (decode) =   95.91 MB

(``MB`` there is 10^6 bytes.) :class:`WhisperLedgerFeed` turns them into :class:`Allocation` rows.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .._errors import InvalidModelFile
from ._allocations import Allocation, AllocationLedger, Part, buffer_device
from ._gguf import GGUFInfo

__all__ = ["WHISPER_MAGIC", "WhisperLedgerFeed", "inspect_whisper", "whisper_state_bytes"]

WHISPER_MAGIC = 0x67676D6C  # "ggml", as whisper.cpp's loader checks it
_HEADER = struct.Struct("<12i")  # magic + n_vocab … n_mels, ftype (whisper_model_load's 11 hparams)
_TYPES = {4: "tiny", 6: "base", 12: "small", 24: "medium", 32: "large"}  # by n_audio_layer
_MB = 1_000_000


def whisper_state_bytes(file_bytes: int) -> int:
    """What whisper.cpp allocates beside the weights: 128 MiB plus a tenth of the model (the
    decode compute buffer is most of it; measured: tiny 130 MB, the bigger models more)."""
    return 128 * 1024 * 1024 + file_bytes // 10


def inspect_whisper(path: Path) -> GGUFInfo:
    """The header of a whisper.cpp GGML model; :class:`InvalidModelFile` when it is not one."""
    try:
        with path.open("rb") as f:
            head = f.read(_HEADER.size)
        size = path.stat().st_size
    except OSError as exc:
        raise InvalidModelFile(
            f"{path} could not be read: {exc.strerror or exc}", hint="check the path and its permissions"
        ) from exc
    if len(head) < _HEADER.size or struct.unpack_from("<I", head)[0] != WHISPER_MAGIC:
        raise InvalidModelFile(
            f"{path} is not a whisper.cpp model (no ggml magic at its start)",
            hint='backend = "whisper" needs a whisper.cpp GGML model such as ggml-tiny.en.bin '
            "(huggingface.co/ggerganov/whisper.cpp)",
        )
    _magic, n_vocab, _actx, astate, ahead, alayer, _tctx, _tstate, _thead, _tlayer, _mels, ftype = (
        _HEADER.unpack(head)
    )
    kind = _TYPES.get(alayer, f"{alayer}-layer")
    return GGUFInfo.outside(
        path,
        architecture="whisper",
        name=path.stem,
        size_label=kind,
        file_type={0: "F32", 1: "F16"}.get(ftype % 1000, f"ftype {ftype}"),
        file_type_id=ftype,
        block_count=alayer,
        head_count=ahead,
        embedding_length=astate,
        vocab_size=n_vocab,
        split_files=(path,),
        size_bytes=size,
    )


_TOTAL_RE = re.compile(r"whisper_model_load:\s+(?P<buffer>\S+) total size =\s*(?P<mb>\d+(?:\.\d+)?) MB")
_STATE_RE = re.compile(
    r"whisper_init_state: (?P<what>kv \w+ size|compute buffer \(\w+\))\s*=\s*(?P<mb>\d+(?:\.\d+)?) MB"
)


@dataclass
class WhisperLedgerFeed:
    """Feeds a whisper-server child's allocation lines into the model's :class:`AllocationLedger`:
    the weights on the buffer's device, the KV caches and compute buffers on the same one."""

    ledger: AllocationLedger
    gpu_keys: Sequence[str] | None = None
    _buffer: str = field(default="CPU")

    def __call__(self, line: str) -> Allocation | None:
        m = _TOTAL_RE.search(line)
        part: Part
        if m is not None:
            self._buffer = m["buffer"]
            part = "weights"
        else:
            m = _STATE_RE.search(line)
            if m is None:
                return None
            part = "kv" if m["what"].startswith("kv") else "compute"
        alloc = Allocation(
            device=buffer_device(self._buffer, self.gpu_keys),
            buffer=self._buffer,
            part=part,
            bytes=round(float(m["mb"]) * _MB),
        )
        self.ledger.allocations.append(alloc)
        return alloc
