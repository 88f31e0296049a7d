"""Hardware discovery: /dev/kfd, AMD GPUs (KFD/DRM sysfs, amdsmi), NVIDIA (NVML), the CPU; device masks;
the devices of llama.cpp RPC workers."""

from ._attribution import ProcessMemory, parse_fdinfo, process_memory
from ._cpu import cpu_flags, cpu_model_name
from ._detect import detect, refresh_usage
from ._gfx import gfx_target_name, parse_gfx_override
from ._listing import ListedDevice, parse_device_list
from ._masks import MASK_VARIABLES, child_env
from ._report import device_json, inventory_json
from ._types import Device, Inventory, KfdStatus, ProbeStatus, Vendor
from ._workers import WorkerDevice, WorkerReport, discover_workers, parse_worker_address

__all__ = [
    "MASK_VARIABLES",
    "Device",
    "Inventory",
    "KfdStatus",
    "ListedDevice",
    "ProbeStatus",
    "ProcessMemory",
    "Vendor",
    "WorkerDevice",
    "WorkerReport",
    "child_env",
    "cpu_flags",
    "cpu_model_name",
    "detect",
    "device_json",
    "discover_workers",
    "gfx_target_name",
    "inventory_json",
    "parse_device_list",
    "parse_fdinfo",
    "parse_gfx_override",
    "parse_worker_address",
    "process_memory",
    "refresh_usage",
]
