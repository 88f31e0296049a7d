"""The GPU-visibility environment of a child placed on a set of devices.

A value of None means "remove this variable from the inherited environment"; a variable that is
not in the result is left as inherited. What each placement gets:

AMD (one or more AMD GPUs)
    ``HIP_VISIBLE_DEVICES`` = their HIP ordinals (``0,2``). ``ROCR_VISIBLE_DEVICES`` = their
    ``GPU-…`` UUIDs when ``rocr_mask_by_uuid`` is set and every one has a UUID no other GPU shares
    (compute partitions share one; ROCr then ends the list at it) (HIP then numbers
    them from 0, so ``HIP_VISIBLE_DEVICES`` becomes ``0..n-1``); otherwise the inherited value
    (the ordinals were counted after it) or removed. ``CUDA_VISIBLE_DEVICES`` and
    ``GPU_DEVICE_ORDINAL`` are removed: HIP reads them too. ``HSA_OVERRIDE_GFX_VERSION`` = the
    setting (or removed).
NVIDIA
    ``CUDA_VISIBLE_DEVICES`` = their UUIDs (ordinals for any without one),
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so ordinals mean what NVML says), ``HIP_VISIBLE_DEVICES=-1``
    (hides AMD GPUs from a build for both HIP and CUDA), ``GPU_DEVICE_ORDINAL`` removed.
CPU (or no device)
    ``HIP_VISIBLE_DEVICES=-1`` and ``CUDA_VISIBLE_DEVICES=-1`` (an invalid first ordinal ends the
    list: HIP and CUDA see no device), ``GGML_VK_VISIBLE_DEVICES=""`` (Vulkan sees none),
    ``GPU_DEVICE_ORDINAL`` removed. The process layer also passes ``-ngl 0 --device none``.

A Vulkan build's devices are not masked for GPU placements: its numbering is its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import UsageError
from ..config import ForgeSettings
from ._types import Device, Inventory

__all__ = ["MASK_VARIABLES", "child_env"]

#: Every variable ``child_env`` may set or remove.
MASK_VARIABLES = (
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "GPU_DEVICE_ORDINAL",
    "GGML_VK_VISIBLE_DEVICES",
    "HSA_OVERRIDE_GFX_VERSION",
)


def child_env(
    devices: Sequence[Device], inventory: Inventory, settings: ForgeSettings
) -> dict[str, str | None]:
    """The visibility variables for a child placed on ``devices`` (see the module docstring).

    Raises UsageError for a device that is not in ``inventory`` or not usable, or for a placement
    that mixes AMD and NVIDIA GPUs. The CPU device in a GPU placement is ignored (llama.cpp always
    has the CPU for what does not fit).
    """
    gpus: list[Device] = []
    for d in devices:
        known = _find(inventory, d)
        if known.vendor == "cpu":
            continue
        if not known.usable:
            raise UsageError(
                f"device {known.key} ({known.name}) is not usable: {known.skip_reason}",
                hint="run `forge gpus` to see the usable devices",
            )
        if known not in gpus:
            gpus.append(known)
    vendors = {d.vendor for d in gpus}
    if len(vendors) > 1:
        raise UsageError(
            "a placement cannot mix AMD and NVIDIA GPUs: one llama-server computes on one GPU accelerator",
            hint="place the model on GPUs of one vendor",
        )
    if not gpus:
        return {
            "HIP_VISIBLE_DEVICES": "-1",
            "CUDA_VISIBLE_DEVICES": "-1",
            "GGML_VK_VISIBLE_DEVICES": "",
            "GPU_DEVICE_ORDINAL": None,
        }
    gpus.sort(key=lambda d: d.index)
    if vendors == {"nvidia"}:
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(d.uuid or str(d.index) for d in gpus),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "HIP_VISIBLE_DEVICES": "-1",
            "GPU_DEVICE_ORDINAL": None,
        }
    env: dict[str, str | None] = {
        "CUDA_VISIBLE_DEVICES": None,
        "GPU_DEVICE_ORDINAL": None,
        "HSA_OVERRIDE_GFX_VERSION": settings.hsa_override_gfx_version or None,
    }
    uuids = [d.uuid for d in gpus]
    everyone = [d.uuid for d in inventory.devices if d.vendor == "amd" and d.uuid]
    # ROCr refuses a UUID that matches two GPUs (compute partitions share their device's id).
    unique = all(u is not None and everyone.count(u) == 1 for u in uuids)
    if settings.rocr_mask_by_uuid and unique:
        env["ROCR_VISIBLE_DEVICES"] = ",".join(u for u in uuids if u)
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    else:
        env["ROCR_VISIBLE_DEVICES"] = settings.inherited_rocr_visible_devices
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(d.index) for d in gpus)
    return env


def _find(inventory: Inventory, device: Device) -> Device:
    for d in inventory.devices:
        if d.key == device.key:
            return d
    raise UsageError(
        f"device {device.key} is not in this inventory", hint="detect the hardware again (`forge gpus`)"
    )
