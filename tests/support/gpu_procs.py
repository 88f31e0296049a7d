"""Per-process GPU memory files in the kernel's exact formats, written into a fixture machine.

* KFD (drivers/gpu/drm/amd/amdkfd/kfd_process.c): ``/sys/class/kfd/kfd/proc/<pid>/`` holds
  ``pasid`` and, per GPU the process opened, ``vram_<gpu_id>`` and ``sdma_<gpu_id>``; ``vram_*``
  is ``kfd_procfs_show``'s ``"%llu\\n"`` of the bytes in use.
* DRM fdinfo (Documentation/gpu/drm-usage-stats.rst, amdgpu_fdinfo.c): the VFS's ``pos``/``flags``/
  ``mnt_id``/``ino`` lines, then amdgpu's ``drm-driver``, ``drm-pdev``, ``drm-client-id`` and
  ``drm-memory-vram:\\t<n> KiB`` (gtt and cpu with the kernel's stray space before the tab);
  ``fd/<n>`` is a link to the DRM node.
* ``/proc/<pid>/comm``: the name and a newline.
"""

from __future__ import annotations

from pathlib import Path

KIB = 1024


def write_kfd(root: Path, pid: int, gpu_id: int, vram_bytes: int) -> None:
    d = root / "sys" / "class" / "kfd" / "kfd" / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "pasid").write_text("0\n")
    (d / f"sdma_{gpu_id}").write_text("0\n")
    tmp = d / f".vram_{gpu_id}"
    tmp.write_text(f"{vram_bytes}\n")
    tmp.replace(d / f"vram_{gpu_id}")  # a reader never sees half a number


def write_comm(root: Path, pid: int, name: str) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(name[:15] + "\n")


def fdinfo_text(pdev: str, client_id: int, vram_bytes: int, *, driver: str = "amdgpu") -> str:
    return (
        "pos:\t0\n"
        "flags:\t02100002\n"
        "mnt_id:\t26\n"
        "ino:\t1062\n"
        f"pasid:\t{32768 + client_id}\n"
        f"drm-driver:\t{driver}\n"
        f"drm-pdev:\t{pdev}\n"
        f"drm-client-id:\t{client_id}\n"
        f"drm-memory-vram:\t{vram_bytes // KIB} KiB\n"
        "drm-memory-gtt: \t4096 KiB\n"
        "drm-memory-cpu: \t0 KiB\n"
        "amd-memory-visible-vram:\t0 KiB\n"
        "amd-evicted-vram:\t0 KiB\n"
        "amd-evicted-visible-vram:\t0 KiB\n"
        "amd-requested-vram:\t0 KiB\n"
        "amd-requested-visible-vram:\t0 KiB\n"
        "amd-requested-gtt:\t0 KiB\n"
        "drm-engine-gfx:\t123456 ns\n"
    )


def write_fdinfo(root: Path, pid: int, fd: int, text: str, target: str = "/dev/dri/renderD128") -> None:
    d = root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True, exist_ok=True)
    (d / "fdinfo").mkdir(parents=True, exist_ok=True)
    link = d / "fd" / str(fd)
    if not link.is_symlink():
        link.symlink_to(target)
    (d / "fdinfo" / str(fd)).write_text(text)


def set_vram_used(root: Path, bdf: str, used_bytes: int) -> None:
    """The device counter (``mem_info_vram_used``), as the kernel would show it with that in use."""
    device = (root / "sys" / "bus" / "pci" / "devices" / bdf).resolve()
    tmp = device / ".mem_info_vram_used"
    tmp.write_text(f"{used_bytes}\n")
    tmp.replace(device / "mem_info_vram_used")
