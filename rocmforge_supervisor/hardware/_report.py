"""The JSON shape of an inventory (``forge gpus --json``; the service's device listing).

Stable keys: ``devices[].vendor, index, name, gfx_target, pci_bdf, uuid, vram_total_bytes,
vram_used_bytes, integrated, usable, skip_reason, env`` and ``kfd.present, accessible, hint``.
Other keys may be added.
"""

from __future__ import annotations

from typing import Any

from ..config import ForgeSettings
from ._masks import child_env
from ._types import Device, Inventory

__all__ = ["device_json", "inventory_json"]


def _plain(value: object) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def device_json(device: Device, inventory: Inventory, settings: ForgeSettings) -> dict[str, Any]:
    """One device; ``env`` is what a child placed on it alone gets (empty when it is not usable)."""
    env = child_env([device], inventory, settings) if device.usable else {}
    return {
        "vendor": device.vendor,
        "index": device.index if device.index >= 0 else None,
        "key": device.key,
        "name": device.name,
        "gfx_target": device.gfx_target,
        "compute_capability": device.compute_capability,
        "pci_bdf": device.pci_bdf,
        "uuid": device.uuid,
        "vram_total_bytes": device.vram_total_bytes,
        "vram_used_bytes": device.vram_used_bytes,
        "vram_free_bytes": device.vram_free_bytes,
        "gtt_total_bytes": device.gtt_total_bytes,
        "gtt_used_bytes": device.gtt_used_bytes,
        "integrated": device.integrated,
        "usable": device.usable,
        "skip_reason": device.skip_reason,
        "render_minor": device.render_minor,
        "kfd_node": device.kfd_node,
        "cores": device.cores,
        "env": env,
        "extra": _plain(device.extra),
    }


def inventory_json(inventory: Inventory, settings: ForgeSettings) -> dict[str, Any]:
    return {
        "devices": [device_json(d, inventory, settings) for d in inventory.devices],
        "kfd": {
            "present": inventory.kfd.present,
            "accessible": inventory.kfd.accessible,
            "hint": inventory.kfd.hint,
        },
        "probes": [{"name": p.name, "available": p.available, "detail": p.detail} for p in inventory.probes],
        "notes": list(inventory.notes),
    }
