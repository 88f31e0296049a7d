"""gfx target names from KFD's ``gfx_target_version``, and ``HSA_OVERRIDE_GFX_VERSION``.

The name is derived here rather than taken from rocm-smi or amdsmi, which format some targets
wrongly (110001 → "gfx11001", 90010 → "gfx9010").
"""

from __future__ import annotations

import re

__all__ = ["gfx_target_name", "parse_gfx_override"]

_OVERRIDE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def gfx_target_name(version: int) -> str:
    """``major·10000 + minor·100 + stepping`` → ``gfx`` + decimal major + hex minor + hex stepping.

    110000 → gfx1100, 90010 → gfx90a, 110501 → gfx1151, 90402 → gfx942. Raises ValueError for 0
    (a CPU node) and for a minor or stepping above 0xf, which no target name can spell.
    """
    if version <= 0:
        raise ValueError(f"gfx_target_version {version} is not a GPU target")
    major, rest = divmod(version, 10000)
    minor, stepping = divmod(rest, 100)
    if minor > 0xF or stepping > 0xF:
        raise ValueError(f"gfx_target_version {version}: minor {minor} or stepping {stepping} is above 0xf")
    return f"gfx{major}{minor:x}{stepping:x}"


def parse_gfx_override(value: str) -> int:
    """``HSA_OVERRIDE_GFX_VERSION`` (``11.0.0``, ``9.0.10``) → the gfx_target_version it stands for.

    Accepts what the ROCm thunk accepts (``%u.%u.%u`` and nothing after, major ≤ 63, minor and
    stepping ≤ 255) and additionally needs a nameable target (minor and stepping ≤ 0xf). Raises
    ValueError otherwise: with such a value the ROCm runtime refuses to enumerate any GPU.
    """
    m = _OVERRIDE.fullmatch(value.strip())
    if not m:
        raise ValueError(f"HSA_OVERRIDE_GFX_VERSION={value!r} is not major.minor.stepping (e.g. 11.0.0)")
    major, minor, stepping = (int(g) for g in m.groups())
    if major > 63 or minor > 255 or stepping > 255:
        raise ValueError(f"HSA_OVERRIDE_GFX_VERSION={value!r} is out of range")
    version = major * 10000 + minor * 100 + stepping
    gfx_target_name(version)  # raises for an unnameable target
    return version
