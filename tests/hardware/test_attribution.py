"""Device memory per process: KFD's per-process files and DRM fdinfo in the kernel's exact format
(on a copy of the rx7900xtx fixture, gpu_id 45700 at 0000:0c:00.0), amdsmi's and NVML's process
lists through recorded-shape stand-ins, and real processes' RSS on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rocmforge_supervisor.hardware import Device, detect, parse_fdinfo, process_memory
from tests.support.gpu_procs import fdinfo_text, write_comm, write_fdinfo, write_kfd

from .conftest import machine_settings

GIB = 1024**3
MIB = 1024**2
GPU_ID = 45700
BDF = "0000:0c:00.0"


def _gpu(root: Path) -> Device:
    return detect(machine_settings(root)).by_key("amd:0")


def _read(root: Path, pids: set[int] | None = None, **kw: Any) -> dict[int, Any]:
    found = process_memory([_gpu(root)], sysfs_root=root / "sys", proc_root=root / "proc", pids=pids, **kw)
    return found["amd:0"]


def test_fdinfo_parse_in_the_kernels_format() -> None:
    client = parse_fdinfo(fdinfo_text(BDF, 7, 3 * GIB))
    assert client is not None
    assert (client.pdev, client.client_id, client.vram_bytes) == (BDF, "7", 3 * GIB)
    assert parse_fdinfo("pos:\t0\nflags:\t0100002\nmnt_id:\t15\nino:\t4\n") is None  # not a DRM fd
    mib = parse_fdinfo("drm-driver:\tamdgpu\ndrm-memory-vram:\t512 MiB\n")
    assert mib is not None and mib.vram_bytes == 512 * MIB
    plain = parse_fdinfo("drm-driver:\ti915\ndrm-resident-vram:\t4096\n")  # bytes, the newer key
    assert plain is not None and plain.vram_bytes == 4096


def test_kfd_and_fdinfo_per_process(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("rx7900xtx")
    write_kfd(root, 1111, GPU_ID, 6 * GIB)  # a HIP process (llama-server)
    write_comm(root, 1111, "llama-server")
    # the same HIP process's render node: its KFD memory shows there too (the larger figure counts)
    write_fdinfo(root, 1111, 5, fdinfo_text(BDF, 3, 6 * GIB - 4 * MIB))
    # a game: graphics only, one DRM client behind two fds (dup) and a second client
    write_comm(root, 4242, "game")
    write_fdinfo(root, 4242, 9, fdinfo_text(BDF, 7, 2 * GIB))
    write_fdinfo(root, 4242, 10, fdinfo_text(BDF, 7, 2 * GIB))
    write_fdinfo(root, 4242, 11, fdinfo_text(BDF, 8, 1 * GIB), target="/dev/dri/card0")
    # another GPU's client, and a non-DRM fd whose fdinfo must not be read as one
    write_fdinfo(root, 4242, 12, fdinfo_text("0000:03:00.0", 9, 5 * GIB))
    write_fdinfo(root, 4242, 3, "pos:\t0\nflags:\t02\nmnt_id:\t1\nino:\t9\n", target="/tmp/log.txt")

    found = _read(root)
    assert {pid: (p.bytes, p.source, p.name) for pid, p in found.items()} == {
        1111: (6 * GIB, "kfd", "llama-server"),
        4242: (3 * GIB, "fdinfo", "game"),
    }
    only_ours = _read(root, pids={1111})
    assert set(only_ours) == {1111}


def test_a_process_without_gpu_memory_or_unreadable_is_left_out(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("rx7900xtx")
    write_kfd(root, 2222, GPU_ID, 0)
    write_kfd(root, 3333, 99999, 4 * GIB)  # another GPU's gpu_id
    (root / "proc" / "5555").mkdir(parents=True)  # no fd/ (another user's process)
    assert _read(root) == {}


class _AmdsmiWithProcesses:
    """amdsmi 6.x's shapes: process list entries are dicts with memory_usage.vram_mem (bytes)."""

    def amdsmi_init(self, flags: int = 0) -> None:
        pass

    def amdsmi_shut_down(self) -> None:
        pass

    def amdsmi_get_processor_handles(self) -> list[str]:
        return ["h0"]

    def amdsmi_get_gpu_device_bdf(self, h: str) -> str:
        return BDF

    def amdsmi_get_gpu_process_list(self, h: str) -> list[dict[str, Any]]:
        return [
            {
                "name": "blender",
                "pid": 777,
                "mem": 0,
                "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 5 * GIB},
            },
            {
                "name": "idle",
                "pid": 778,
                "mem": 0,
                "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 0},
            },
        ]


def test_amdsmi_process_list(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("rx7900xtx")
    found = _read(root, use_amdsmi=True, amdsmi_module=_AmdsmiWithProcesses())
    assert {pid: (p.bytes, p.source, p.name) for pid, p in found.items()} == {
        777: (5 * GIB, "amdsmi", "blender")
    }


class _NvmlWithProcesses:
    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return "h"

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=10, usedGpuMemory=3 * GIB), SimpleNamespace(pid=11, usedGpuMemory=None)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: str) -> list[Any]:
        return [SimpleNamespace(pid=12, usedGpuMemory=1 * GIB)]


def test_nvml_process_lists(tmp_path: Path) -> None:
    gpu = Device(
        vendor="nvidia", index=0, name="RTX", vram_total_bytes=24 * GIB, vram_used_bytes=0, uuid="GPU-1"
    )
    found = process_memory(
        [gpu], sysfs_root=tmp_path, proc_root=tmp_path, use_nvml=True, nvml_module=_NvmlWithProcesses()
    )["nvidia:0"]
    assert {pid: p.bytes for pid, p in found.items()} == {10: 3 * GIB, 12: 1 * GIB}


def test_rss_of_real_processes_on_the_cpu(tmp_path: Path) -> None:
    cpu = detect(machine_settings(tmp_path)).cpu
    code = "import sys; b = b'x' * (200 * 2**20); print('ok', flush=True); sys.stdin.read()"
    hog = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    with hog:  # closes its pipes and reaps it
        try:
            assert hog.stdout is not None and hog.stdout.readline() == "ok\n"
            found = process_memory([cpu], sysfs_root=Path("/sys"), proc_root=Path("/proc"), pids={hog.pid})
            assert found["cpu"][hog.pid].bytes >= 200 * MIB and found["cpu"][hog.pid].source == "rss"
            everyone = process_memory([cpu], sysfs_root=Path("/sys"), proc_root=Path("/proc"))["cpu"]
            assert hog.pid in everyone and os.getpid() in everyone
        finally:
            hog.kill()


def test_no_gpu_no_rows(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("no_gpu")
    inv = detect(machine_settings(root))
    found = process_memory(
        [d for d in inv.devices if d.vendor != "cpu"], sysfs_root=root / "sys", proc_root=root / "proc"
    )
    assert all(not rows for rows in found.values())
