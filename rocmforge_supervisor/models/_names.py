"""File-name conventions of GGUF models: split parts and quantization tags.

llama.cpp finds the other parts of a split model by name alone (``<prefix>-00001-of-00003.gguf``,
the format ``gguf-split`` and :class:`gguf.GGUFWriter` write), so both the inspector and the hub
resolver need the same reading of those names. The quantization tag of a file (``Q4_K_M``,
``UD-Q4_K_XL``, ``BF16``) is only a naming habit of uploaders; :func:`matches_quant` says how
loosely we follow it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from gguf.gguf_writer import SHARD_NAME_FORMAT

__all__ = [
    "SplitName",
    "is_mmproj",
    "matches_quant",
    "parse_split_name",
    "quant_tag_of",
    "shard_name",
]

_SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)

# The quantization tags llama.cpp's quantize tool and the common uploaders put in file names.
_QUANT_RE = re.compile(
    r"(?:^|[-_.])(?P<tag>(?:UD-)?(?:I?Q\d(?:_[0-9A-Z]+)*|[BF]F?16|F32|MXFP4(?:_MOE)?|TQ\d_\d))"
    r"(?:-\d{5}-of-\d{5})?\.gguf$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class SplitName:
    """The parts of a split file name: ``prefix-0000{no}-of-0000{count}.gguf`` (``no`` from 1)."""

    prefix: str
    no: int
    count: int

    def part(self, no: int) -> str:
        return shard_name(self.prefix, no, self.count)

    def all_parts(self) -> list[str]:
        return [self.part(i) for i in range(1, self.count + 1)]


def parse_split_name(name: str) -> SplitName | None:
    """Read a split part's name; None for a file that is not named as a part."""
    m = _SPLIT_RE.match(name)
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    if count < 1 or not 1 <= no <= count:
        return None
    return SplitName(m["prefix"], no, count)


def shard_name(prefix: str, no: int, count: int) -> str:
    return SHARD_NAME_FORMAT.format(prefix, no, count)


def is_mmproj(path: str) -> bool:
    """Multimodal projector files sit beside the model in many repos; they are never the model."""
    return "mmproj" in PurePosixPath(path).name.lower()


def quant_tag_of(path: str) -> str | None:
    """The quantization tag a file's name carries (``Q4_K_M``), upper-cased; None if none."""
    m = _QUANT_RE.search(PurePosixPath(path).name)
    return m["tag"].upper() if m else None


def matches_quant(path: str, tag: str) -> bool:
    """Whether a repo file carries quantization ``tag``: at the end of its name, or as its folder.

    Case-insensitive. ``model-Q4_K_M.gguf``, ``model.q4_k_m.gguf``, ``model-Q4_K_M-00001-of-00002.gguf``
    and ``Q4_K_M/model-00001-of-00002.gguf`` all carry ``Q4_K_M``; ``model-Q4_K_M_L.gguf`` does not.
    """
    p = PurePosixPath(path)
    wanted = tag.upper()
    if any(part.upper() == wanted for part in p.parts[:-1]):
        return True
    name = p.name
    split = parse_split_name(name)
    stem = split.prefix if split else name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    stem_u = stem.upper()
    if not stem_u.endswith(wanted):
        return False
    before = stem_u[: -len(wanted)]
    return before == "" or before[-1] in "-_."
