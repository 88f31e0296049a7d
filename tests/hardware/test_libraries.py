"""amdsmi and NVML: absent here for real (tested as such); their joins tested with recorded-shape
stand-ins, since no machine in this project has the libraries."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from rocmforge_supervisor._errors import UsageError
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import child_env, detect, refresh_usage
from rocmforge_supervisor.hardware._amdsmi import read_amdsmi
from rocmforge_supervisor.hardware._nvml import read_nvidia

Settings = Callable[..., ForgeSettings]


def test_amdsmi_absent_for_real() -> None:
    probe, gpus = read_amdsmi(True)
    assert not probe.available and gpus == []
    # not installed here; where it is, ROCm's library (or a GPU) is missing and init fails
    expected = "import amdsmi failed" if importlib.util.find_spec("amdsmi") is None else "amdsmi_init failed"
    assert expected in probe.detail


def test_nvml_absent_for_real() -> None:
    probe, gpus = read_nvidia(True, None)
    assert not probe.available and gpus == []
    assert "nvmlInit failed" in probe.detail


class AmdSmiLibraryException(Exception):  # the shape of amdsmi's exception (err_code, err_info)
    def __init__(self, err_code: int) -> None:
        super().__init__(f"Error code:\n\t{err_code} | AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported")
        self.err_code = err_code


class FakeAmdsmi:  # recorded-shape stand-in for the amdsmi module (no ROCm library here)
    """Answers with the dict shapes amdsmi 6.x returns, for two of the eight MI300X (by BDF)."""

    AmdSmiMemoryType = SimpleNamespace(VRAM=0, VIS_VRAM=1, GTT=2)
    AmdSmiTemperatureType = SimpleNamespace(EDGE=0, HOTSPOT=1, VRAM=2)
    AmdSmiTemperatureMetric = SimpleNamespace(CURRENT=0)

    def __init__(self, *, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.shut_down = False
        self._gpus: dict[str, dict[str, Any]] = {
            "h0": {
                "bdf": "0000:05:00.0",
                "node": 2,
                "name": "AMD Instinct MI300X OAM",
                "temp": 41,
                "busy": 7,
            },
            "h1": {"bdf": "0000:26:00.0", "node": 3, "name": "N/A", "temp": 39, "busy": "N/A"},
        }

    def amdsmi_init(self, flags: int = 0) -> None:
        if self.fail_init:
            raise AmdSmiLibraryException(34)

    def amdsmi_shut_down(self) -> None:
        self.shut_down = True

    def amdsmi_get_processor_handles(self) -> list[str]:
        return list(self._gpus)

    def amdsmi_get_gpu_device_bdf(self, h: str) -> str:
        return str(self._gpus[h]["bdf"])

    def amdsmi_get_gpu_kfd_info(self, h: str) -> dict[str, Any]:
        return {"kfd_id": 12345, "node_id": self._gpus[h]["node"], "current_partition_id": 0}

    def amdsmi_get_gpu_asic_info(self, h: str) -> dict[str, Any]:
        return {
            "market_name": self._gpus[h]["name"],
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": "0x8B2F3A1C2D4E5F61",
            "oam_id": 0,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
        }

    def amdsmi_get_gpu_memory_total(self, h: str, mem_type: int) -> int:
        return 206141652992

    def amdsmi_get_gpu_memory_usage(self, h: str, mem_type: int) -> int:
        return 293175296

    def amdsmi_get_temp_metric(self, h: str, sensor: int, metric: int) -> int:
        if sensor == self.AmdSmiTemperatureType.EDGE:
            raise AmdSmiLibraryException(2)  # MI300X has no edge sensor
        return int(self._gpus[h]["temp"])

    def amdsmi_get_gpu_activity(self, h: str) -> dict[str, Any]:
        return {"gfx_activity": self._gpus[h]["busy"], "umc_activity": 0, "mm_activity": "N/A"}


def test_amdsmi_join_by_bdf(fixture_machine: Settings) -> None:
    smi = FakeAmdsmi()
    inv = detect(fixture_machine("mi300x_8", use_amdsmi=True), amdsmi_module=smi)
    probe = inv.probe("amdsmi")
    assert probe is not None and probe.available and probe.detail == "2 GPU(s)"
    assert smi.shut_down
    gpus = [d for d in inv.devices if d.vendor == "amd"]
    assert gpus[0].name == "AMD Instinct MI300X OAM"  # amdsmi's name wins
    assert gpus[0].extra["temperature_c"] == 41.0 and gpus[0].extra["utilization_pct"] == 7.0
    assert gpus[1].name == "AMD Instinct MI300X"  # "N/A" is not a name
    assert gpus[1].extra["utilization_pct"] is None
    assert "amdsmi" not in gpus[2].extra  # not joined
    # the gfx target stays KFD's, whatever amdsmi formats
    assert {d.gfx_target for d in gpus} == {"gfx942"}


def test_amdsmi_init_failure_is_not_available(fixture_machine: Settings) -> None:
    inv = detect(fixture_machine("mi300x_8", use_amdsmi=True), amdsmi_module=FakeAmdsmi(fail_init=True))
    probe = inv.probe("amdsmi")
    assert probe is not None and not probe.available and "amdsmi_init failed" in probe.detail
    assert len(inv.gpus) == 8


class _Memory:
    def __init__(self, total: int, used: int) -> None:
        self.total, self.used, self.free = total, used, total - used


class _Pci:
    def __init__(self, bus_id: bytes) -> None:
        self.busId = bus_id


class _Util:
    gpu = 12
    memory = 3


class NVMLError_LibraryNotFound(Exception):  # the name pynvml uses
    pass


class FakeNvml:  # recorded-shape stand-in for pynvml (no NVIDIA driver here)
    """Two GPUs, answering with pynvml's shapes (structs with .total/.used, bus ids as bytes)."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *, missing: bool = False) -> None:
        self.missing = missing
        self.used = [1 << 30, 2 << 30]
        self.uuids = ["GPU-6f1c2d3e-4a5b-6c7d-8e9f-0a1b2c3d4e5f", "GPU-0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e"]

    def nvmlInit(self) -> None:
        if self.missing:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return self.uuids.index(uuid)

    def nvmlDeviceGetName(self, h: int) -> str:
        return ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"][h]

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.uuids[h]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> _Memory:
        return _Memory([25757220864, 51527024640][h], self.used[h])

    def nvmlDeviceGetPciInfo(self, h: int) -> _Pci:
        return _Pci([b"00000000:01:00.0", b"00000000:41:00.0"][h])

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return [(8, 9), (8, 6)][h]

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 45

    def nvmlDeviceGetUtilizationRates(self, h: int) -> _Util:
        return _Util()


def test_mixed_amd_and_nvidia_machine(fixture_machine: Settings) -> None:
    nvml = FakeNvml()
    s = fixture_machine("rx7900xtx", use_nvml=True)
    inv = detect(s, nvml_module=nvml)
    amd = inv.by_key("amd:0")
    rtx, a6000 = inv.by_key("nvidia:0"), inv.by_key("nvidia:1")
    assert (rtx.name, rtx.compute_capability, rtx.pci_bdf) == (
        "NVIDIA GeForce RTX 4090",
        "8.9",
        "0000:01:00.0",
    )
    assert rtx.vram_total_bytes == 25757220864 and rtx.vram_used_bytes == 1 << 30
    assert a6000.compute_capability == "8.6"
    assert [d.vendor for d in inv.devices] == ["amd", "nvidia", "nvidia", "cpu"]

    amd_env = child_env([amd], inv, s)
    assert amd_env["CUDA_VISIBLE_DEVICES"] is None and amd_env["HIP_VISIBLE_DEVICES"] == "0"
    nv_env = child_env([a6000], inv, s)
    assert nv_env == {
        "CUDA_VISIBLE_DEVICES": nvml.uuids[1],
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HIP_VISIBLE_DEVICES": "-1",
        "GPU_DEVICE_ORDINAL": None,
    }
    assert child_env([rtx, a6000], inv, s)["CUDA_VISIBLE_DEVICES"] == ",".join(nvml.uuids)
    with pytest.raises(UsageError, match="mix AMD and NVIDIA"):
        child_env([amd, rtx], inv, s)

    nvml.used = [5 << 30, 7 << 30]
    fresh = refresh_usage(inv, s, nvml_module=nvml)
    assert fresh.by_key("nvidia:0").vram_used_bytes == 5 << 30
    assert fresh.by_key("nvidia:1").vram_used_bytes == 7 << 30


def test_inherited_cuda_visible_devices(fixture_machine: Settings) -> None:
    nvml = FakeNvml()
    s = fixture_machine("no_gpu", use_nvml=True, inherited_cuda_visible_devices="GPU-0b1c")
    inv = detect(s, nvml_module=nvml)
    (visible,) = inv.gpus
    assert visible.name == "NVIDIA RTX A6000" and visible.index == 0
    hidden = inv.by_key("nvidia:0000:01:00.0")
    assert not hidden.usable and "CUDA_VISIBLE_DEVICES" in (hidden.skip_reason or "")


def test_nvml_missing_library_via_stand_in(fixture_machine: Settings) -> None:
    inv = detect(fixture_machine("no_gpu", use_nvml=True), nvml_module=FakeNvml(missing=True))
    probe = inv.probe("nvml")
    assert probe is not None and not probe.available and "Library Not Found" in probe.detail
    assert [d.vendor for d in inv.devices] == ["cpu"]
