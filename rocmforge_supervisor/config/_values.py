"""The two load knobs every caller spells: which GPUs (``gpu``) and how many layers (``n_gpu_layers``).

One parser and one type each, used by forge.toml, ``FORGE_*`` variables, the ``forge load`` flags
and ``load_model(...)`` keywords alike, so that ``"0,1"``, ``[0, 1]`` and ``--gpu 0,1`` mean the
same thing everywhere and every bad value gets the same one-line message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, NewType

__all__ = [
    "CtxSize",
    "DeviceKey",
    "GpuChoice",
    "GpuLayers",
    "GpuRef",
    "Reserve",
    "gpu_layers_for_placement",
    "parse_bytes",
    "parse_ctx_size",
    "parse_gpu",
    "parse_gpu_layers",
    "parse_reserve",
    "reserve_bytes",
]

#: A GPU named by its device key (``"amd:1"``, ``"nvidia:0"``), lower-cased; only :func:`parse_gpu`
#: makes one, so a holder never re-reads the text (a ``NewType``: at run time, and in JSON, a str).
DeviceKey = NewType("DeviceKey", str)
#: One GPU as the user named it: an ordinal (``1``) or a device key.
GpuRef = int | DeviceKey
#: ``"auto"``, ``"cpu"``, one GPU or a list of them: :func:`parse_gpu`'s result, parsed once (at
#: config load, or from a ``--gpu`` flag or ``load_model(gpu=…)``) and only matched after that.
GpuChoice = Literal["auto", "cpu"] | GpuRef | list[GpuRef]
#: None: forge decides from the memory estimate; a count; ``"auto"`` (llama-server fits); ``"all"``.
GpuLayers = int | Literal["auto", "all"] | None

_KEY = re.compile(r"[a-z]+:\d+")
GPU_HELP = "'auto', 'cpu', a GPU index (0) or a list of indices ([0, 1]; 0,1), or device keys (amd:0)"


def _gpu_ref(value: object, original: object) -> GpuRef:
    if isinstance(value, bool):
        raise ValueError(f"{original!r} is not {GPU_HELP}")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v.isdigit():
            return int(v)
        if _KEY.fullmatch(v):
            return DeviceKey(v)
    raise ValueError(f"{original!r} is not {GPU_HELP}")


def parse_gpu(value: object) -> GpuChoice:
    """The one parser for a GPU choice; ValueError with a one-line message when it is none."""
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("auto", ""):
            return "auto"
        if v == "cpu":
            return "cpu"
        if "," in v or ";" in v:
            value = [p for p in v.replace(";", ",").split(",")]
        else:
            return _gpu_ref(v, value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not value:
            raise ValueError(f"{list(value)!r} is not {GPU_HELP}")
        refs = [_gpu_ref(p, value) for p in value]
        if len(set(refs)) != len(refs):
            raise ValueError(f"{list(value)!r} names a GPU twice")
        return refs
    return _gpu_ref(value, value)


def parse_gpu_layers(value: object) -> GpuLayers:
    """The one parser for ``n_gpu_layers``: a count >= 0, ``auto`` or ``all`` (-1 means all, as in
    llama.cpp); ValueError with a one-line message otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("auto", "all"):
            return v  # type: ignore[return-value]
        if v.lstrip("-").isdigit():
            value = int(v)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == -1:
            return "all"
        if value >= 0:
            return value
    raise ValueError(f"{value!r} is not a number of layers (>= 0), 'auto' or 'all'")


#: ``ctx_size``: None (the model's trained context, or ``[supervisor] ctx_size``), a number of
#: tokens, or ``"auto"``: the largest context that fits where the model is placed, chosen at load.
CtxSize = int | Literal["auto"] | None


def parse_ctx_size(value: object) -> CtxSize:
    """The one parser for ``ctx_size``: a count >= 0 (0: the trained context) or ``"auto"``;
    ValueError with a one-line message otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "auto":
            return "auto"
        if v.isdigit():
            value = int(v)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:  # pydantic's own words for a number below its bound, as every count says it
            raise ValueError('Input should be greater than or equal to 0 (or "auto")')
        return value
    raise ValueError(
        f"{value!r} is not a context size: use a number of tokens (4096; 0: the model's trained "
        'context) or "auto" (the largest that fits where the model is placed)'
    )


def gpu_layers_for_placement(value: GpuLayers) -> int | None:
    """The placer's spelling: None = all layers where they fit (``auto``/``all``/unset)."""
    return value if isinstance(value, int) else None


#: ``[supervisor] vram_reserve``: a fraction of each device (``0.05``, ``"5%"``) or bytes
#: (``2147483648``, ``"2GiB"``, ``"512MiB"``); 0 turns yielding off.
Reserve = float | int

_RESERVE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
RESERVE_HELP = 'a fraction of each device ("5%", 0.05), bytes ("2GiB", "512MiB", 2147483648), or 0 (off)'


def parse_reserve(value: object) -> Reserve:
    """A fraction in [0, 1) stays a float; a byte count becomes an int. ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not {RESERVE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value!r} is negative; use {RESERVE_HELP}")
        return value
    if isinstance(value, float):
        if not 0 <= value < 1:
            raise ValueError(f"{value!r} is not a fraction below 1; use {RESERVE_HELP}")
        return value
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if text.endswith("%"):
            try:
                pct = float(text[:-1])
            except ValueError:
                pct = -1.0
            if not 0 <= pct < 100:
                raise ValueError(f"{value!r} is not a percentage below 100%; use {RESERVE_HELP}")
            return pct / 100
        if re.fullmatch(r"\d+\.\d+", text):  # a plain number with a point: a fraction
            return parse_reserve(float(text))
        try:
            return parse_bytes(text)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not {RESERVE_HELP}")


def reserve_bytes(reserve: Reserve, total: int) -> int:
    """The reserve on a device of ``total`` bytes."""
    return int(total * reserve) if isinstance(reserve, float) else int(reserve)


BYTES_HELP = 'bytes: an integer or a size such as "12GiB", "512MiB"'


def parse_bytes(value: object) -> int:
    """A byte count from an integer or a size with a binary unit (``"12GiB"``). ValueError
    otherwise (a fraction means nothing here)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not {BYTES_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value!r} is negative; use {BYTES_HELP}")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", value.strip().lower().replace(" ", ""))
        if m and m.group(2) in _RESERVE_UNITS:
            return int(float(m.group(1)) * _RESERVE_UNITS[m.group(2)])
    raise ValueError(f"{value!r} is not {BYTES_HELP}")
