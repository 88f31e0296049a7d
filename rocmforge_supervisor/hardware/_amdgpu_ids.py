"""Marketing names of AMD GPUs from libdrm's ``amdgpu.ids`` (what rocminfo and amdsmi show).

KFD's own ``name`` file says ``ip discovery`` for every RDNA3-era GPU, so without amdsmi this table
is the only place a name like "AMD Radeon RX 7900 XTX" comes from. The file is looked up under the
machine root (the parent of the sysfs root: ``/`` normally, a fixture tree in tests).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["marketing_name"]

_CANDIDATES = (
    "usr/share/libdrm/amdgpu.ids",
    "opt/amdgpu/share/libdrm/amdgpu.ids",
    "usr/local/share/libdrm/amdgpu.ids",
)


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> dict[tuple[int, int], str]:
    """Parse ``device_id,<tab>revision_id,<tab>product_name`` lines (hex ids; ``#`` comments)."""
    del mtime_ns  # part of the cache key only: a changed file is parsed again
    table: dict[tuple[int, int], str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return table
    for line in lines:
        if not line or line.startswith("#"):
            continue
        parts = line.split(",", 2)
        if len(parts) != 3:
            continue  # the version line ("1.0.0")
        try:
            key = (int(parts[0].strip(), 16), int(parts[1].strip(), 16))
        except ValueError:
            continue
        table.setdefault(key, parts[2].strip())
    return table


def _table(machine_root: Path) -> dict[tuple[int, int], str]:
    for rel in _CANDIDATES:
        path = machine_root / rel
        try:
            st = path.stat()
        except OSError:
            continue
        return _load(str(path), st.st_mtime_ns)
    return {}


def marketing_name(machine_root: Path, device_id: int, revision: int | None) -> str | None:
    """The product name for a PCI device id and revision, or None when the table lacks it.

    An exact (device, revision) match wins, as in libdrm. Without the revision (or without an
    exact entry), a device id whose entries all carry one name still gives that name.
    """
    table = _table(machine_root)
    if not table:
        return None
    if revision is not None and (device_id, revision) in table:
        return table[(device_id, revision)]
    names = {name for (dev, _rev), name in table.items() if dev == device_id}
    return names.pop() if len(names) == 1 else None
