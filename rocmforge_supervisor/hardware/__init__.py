"""Hardware discovery: /dev/kfd, AMD GPUs (KFD/DRM sysfs, amdsmi), NVIDIA (NVML), the CPU; device masks."""

from ._detect import detect, refresh_usage
from ._gfx import gfx_target_name, parse_gfx_override
from ._masks import MASK_VARIABLES, child_env
from ._report import device_json, inventory_json
from ._types import Device, Inventory, KfdStatus, ProbeStatus, Vendor

__all__ = [
    "MASK_VARIABLES",
    "Device",
    "Inventory",
    "KfdStatus",
    "ProbeStatus",
    "Vendor",
    "child_env",
    "detect",
    "device_json",
    "gfx_target_name",
    "inventory_json",
    "parse_gfx_override",
    "refresh_usage",
]
