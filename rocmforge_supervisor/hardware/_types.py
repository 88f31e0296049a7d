"""What discovery reports: devices a model can be placed on, as the child will see them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Device", "Inventory", "KfdStatus", "ProbeStatus", "Vendor"]

Vendor = Literal["amd", "nvidia", "cpu"]


@dataclass(frozen=True)
class KfdStatus:
    """Whether ``/dev/kfd`` (ROCm's compute device) is there and openable read-write."""

    present: bool
    accessible: bool
    hint: str | None = None


@dataclass(frozen=True)
class ProbeStatus:
    """Whether one optional source of facts (amdsmi, NVML, KFD topology) could be used, and why not."""

    name: str
    available: bool
    detail: str


@dataclass(frozen=True)
class Device:
    """One place a model can run.

    ``index`` is the ordinal the vendor's runtime gives it: the HIP ordinal for AMD (KFD GPU node
    order, after any inherited ``ROCR_VISIBLE_DEVICES``), the CUDA/NVML ordinal for NVIDIA, 0 for
    the CPU. For the CPU, "VRAM" means system RAM (total and in use).
    """

    vendor: Vendor
    index: int
    name: str
    vram_total_bytes: int
    vram_used_bytes: int
    uuid: str | None = None
    pci_bdf: str | None = None
    gfx_target: str | None = None
    compute_capability: str | None = None
    integrated: bool = False
    usable: bool = True
    skip_reason: str | None = None
    gtt_total_bytes: int | None = None
    gtt_used_bytes: int | None = None
    render_minor: int | None = None
    kfd_node: int | None = None
    cores: int | None = None
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)
    usage_paths: tuple[str, ...] = field(default=(), compare=False)
    """Files whose decimal contents add up to ``vram_used_bytes``: what ``refresh_usage`` re-reads."""
    gtt_used_path: str | None = field(default=None, compare=False)

    @classmethod
    def unusable(
        cls,
        vendor: Vendor,
        index: int,
        name: str,
        reason: str,
        *,
        kfd_node: int | None = None,
        pci_bdf: str | None = None,
        uuid: str | None = None,
    ) -> Device:
        """A GPU that is there but that its driver would not describe: listed with ``reason`` (so
        ``forge devices`` says why it is not used), no memory figures, never placed on."""
        return cls(
            vendor=vendor,
            index=index,
            name=name,
            vram_total_bytes=0,
            vram_used_bytes=0,
            usable=False,
            skip_reason=reason,
            kfd_node=kfd_node,
            pci_bdf=pci_bdf,
            uuid=uuid,
        )

    @property
    def key(self) -> str:
        """A stable short name: ``amd:0``, ``nvidia:1``, ``cpu``.

        A GPU the runtime will not enumerate (hidden by an inherited mask, no render node in a
        container) has no ordinal (``index`` -1); it is named by its PCI address instead,
        ``amd:0000:03:00.0``, or by its KFD node, ``amd:node2``.
        """
        if self.vendor == "cpu":
            return "cpu"
        if self.index >= 0:
            return f"{self.vendor}:{self.index}"
        if self.pci_bdf:
            return f"{self.vendor}:{self.pci_bdf}"
        return f"{self.vendor}:node{self.kfd_node}"

    @property
    def vram_free_bytes(self) -> int:
        return max(0, self.vram_total_bytes - self.vram_used_bytes)


@dataclass(frozen=True)
class Inventory:
    """Every device found (usable or not, with why), plus the state of ``/dev/kfd``."""

    devices: tuple[Device, ...]
    kfd: KfdStatus
    probes: tuple[ProbeStatus, ...] = ()
    """What each source said: ``kfd-topology``, ``amdsmi``, ``nvml``."""
    notes: tuple[str, ...] = ()
    """Machine-wide problems found on the way (an invalid HSA_OVERRIDE_GFX_VERSION, a render
    minor that points at another PCI device), one line each."""

    @property
    def gpus(self) -> tuple[Device, ...]:
        """Usable GPUs, in ordinal order."""
        return tuple(d for d in self.devices if d.vendor != "cpu" and d.usable)

    @property
    def cpu(self) -> Device:
        for d in self.devices:
            if d.vendor == "cpu":
                return d
        raise LookupError("inventory has no CPU device")  # discovery always adds one

    def probe(self, name: str) -> ProbeStatus | None:
        for p in self.probes:
            if p.name == name:
                return p
        return None

    def by_key(self, key: str) -> Device:
        for d in self.devices:
            if d.key == key:
                return d
        raise KeyError(key)
