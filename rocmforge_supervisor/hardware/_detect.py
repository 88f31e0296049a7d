"""Discovery: every device a model could be placed on, and a cheap refresh of what is in use."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config import ForgeSettings
from ._amd import GfxOverride, scan_amd
from ._amdsmi import AmdsmiGpu, amdsmi_import_probe, read_amdsmi
from ._cpu import cpu_device, ram_usage
from ._gfx import gfx_target_name, parse_gfx_override
from ._kfd import check_kfd
from ._nvml import nvml_used, read_nvidia
from ._sysfs import try_read_int
from ._types import Device, Inventory

__all__ = ["detect", "refresh_usage"]


def _override(settings: ForgeSettings) -> GfxOverride | None:
    raw = settings.hsa_override_gfx_version
    if not raw:
        return None
    try:
        return GfxOverride(raw, target=gfx_target_name(parse_gfx_override(raw)))
    except ValueError as exc:
        return GfxOverride(raw, error=str(exc))


def detect(settings: ForgeSettings, *, amdsmi_module: Any = None, nvml_module: Any = None) -> Inventory:
    """Find /dev/kfd, AMD GPUs (KFD + DRM sysfs, then amdsmi), NVIDIA GPUs (NVML) and the CPU.

    Never raises for a missing or odd device: such a device is listed with ``usable=False`` and a
    ``skip_reason``, and a source that cannot be used is listed in ``probes`` with why.
    ``amdsmi_module`` / ``nvml_module`` replace the real libraries (tests pass stand-ins).
    """
    machine_root = settings.sysfs_root.parent
    kfd = check_kfd(settings.dev_root, machine_root, settings.sysfs_root)
    override = _override(settings)
    scan = scan_amd(
        settings.sysfs_root,
        settings.dev_root,
        kfd,
        enable_igpu=settings.enable_igpu,
        inherited_rocr=settings.inherited_rocr_visible_devices,
        override=override,
    )
    notes = list(scan.notes)
    if override is not None and override.error:
        notes.append(f"{override.error}; ROCm will not start with it: fix or unset it")
    amd = list(scan.devices)
    if amd or not settings.use_amdsmi:
        smi_probe, smi = read_amdsmi(settings.use_amdsmi, amdsmi_module)
    else:
        smi_probe, smi = amdsmi_import_probe(amdsmi_module), []
    amd = [_join_amdsmi(d, smi) for d in amd]
    nv_probe, nvidia = read_nvidia(settings.use_nvml, settings.inherited_cuda_visible_devices, nvml_module)
    devices = (*amd, *nvidia, cpu_device())
    return Inventory(
        devices=devices,
        kfd=kfd,
        probes=(scan.probe, smi_probe, nv_probe),
        notes=tuple(notes),
    )


def _join_amdsmi(device: Device, smi: list[AmdsmiGpu]) -> Device:
    """Match by KFD node when amdsmi reports it (partitions share a PCI address), else by BDF."""
    match = next((g for g in smi if g.kfd_node is not None and g.kfd_node == device.kfd_node), None)
    if match is None:
        same_bdf = [g for g in smi if g.bdf == device.pci_bdf]
        match = same_bdf[0] if len(same_bdf) == 1 else None
    if match is None:
        return device
    extra = dict(device.extra)
    extra.update(temperature_c=match.temperature_c, utilization_pct=match.utilization_pct, amdsmi=True)
    changes: dict[str, Any] = {"extra": extra}
    if match.market_name and not extra.get("partitioned"):
        changes["name"] = match.market_name
    if device.vram_total_bytes == 0 and match.vram_total_bytes:
        changes["vram_total_bytes"] = match.vram_total_bytes
        changes["vram_used_bytes"] = match.vram_used_bytes or 0
    return replace(device, **changes)


def refresh_usage(inventory: Inventory, settings: ForgeSettings, *, nvml_module: Any = None) -> Inventory:
    """The same inventory with used memory re-read: AMD from the sysfs files discovery noted (a few
    small reads), NVIDIA through NVML, the CPU through psutil. Nothing else is re-detected."""
    nvidia = [d.uuid for d in inventory.devices if d.vendor == "nvidia" and d.uuid]
    nv_used = nvml_used(nvidia, nvml_module) if nvidia and settings.use_nvml else {}
    devices: list[Device] = []
    for d in inventory.devices:
        if d.vendor == "amd" and d.usage_paths:
            values = [try_read_int(p) for p in d.usage_paths]
            if all(v is not None for v in values):
                used = sum(v for v in values if v is not None)
                gtt = try_read_int(d.gtt_used_path) if d.gtt_used_path else d.gtt_used_bytes
                d = replace(d, vram_used_bytes=min(used, d.vram_total_bytes), gtt_used_bytes=gtt)
        elif d.vendor == "nvidia" and d.uuid in nv_used:
            d = replace(d, vram_used_bytes=nv_used[d.uuid])
        elif d.vendor == "cpu":
            total, used, available = ram_usage()
            extra = dict(d.extra)
            extra["ram_available_bytes"] = available
            d = replace(d, vram_total_bytes=total, vram_used_bytes=used, extra=extra)
        devices.append(d)
    return replace(inventory, devices=tuple(devices))
