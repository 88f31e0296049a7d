"""AMD GPUs as the ROCm runtime will enumerate them: KFD topology joined to DRM sysfs.

The order and filtering follow ROCm's thunk (libhsakmt) and runtime (ROCr) so that ``Device.index``
is the HIP ordinal the child will see:

* KFD nodes are walked in numeric order; a node whose ``gpu_id`` is 0 or that has no SIMDs is a CPU.
* A GPU node whose ``gpu_id`` the kernel refuses to show (EPERM: a device cgroup, i.e. a container
  not given that GPU) or whose ``/dev/dri/renderD<minor>`` does not exist is skipped by the thunk:
  it takes no ordinal.
* An inherited ``ROCR_VISIBLE_DEVICES`` then filters and reorders what is left; HIP ordinals are
  positions in that result.

Each GPU is joined to its DRM device directory through ``drm_render_minor`` (never ``cardN``), and
the join is checked against the PCI address built from ``domain`` and ``location_id``.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field, replace
from pathlib import Path

from ._amdgpu_ids import marketing_name
from ._gfx import gfx_target_name
from ._kfd import CONTAINER_HINT
from ._sysfs import PropertiesError, listdir, parse_properties, read_text, try_read_int, try_read_text
from ._types import Device, KfdStatus, ProbeStatus
from ._visible import visible_order

__all__ = ["AmdScan", "GfxOverride", "scan_amd"]

GiB = 1 << 30
AMD_VENDOR = 0x1002
#: ``heap_type`` of a KFD memory bank that is device memory: frame buffer public / private.
_FB_HEAPS = (1, 2)
#: Targets that only exist as integrated GPUs (APUs). Used because a BIOS may give an APU a large
#: VRAM carve-out, which defeats the "small VRAM, big GTT" rule (Strix Halo with 64+ GiB of VRAM).
_APU_TARGETS = frozenset(
    {
        "gfx801",
        "gfx902",
        "gfx909",
        "gfx90c",
        "gfx1013",
        "gfx1033",
        "gfx1035",
        "gfx1036",
        "gfx1037",
        "gfx1103",
        "gfx1150",
        "gfx1151",
        "gfx1152",
        "gfx1153",
    }
)
IGPU_REASON = "integrated GPU: excluded by default (set FORGE_ENABLE_IGPU=1 to use it)"


@dataclass(frozen=True)
class GfxOverride:
    """A parsed ``HSA_OVERRIDE_GFX_VERSION``: the target name, or why the value is refused."""

    raw: str
    target: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class AmdScan:
    devices: tuple[Device, ...]
    probe: ProbeStatus
    notes: tuple[str, ...] = ()


@dataclass
class _Node:
    """One KFD node that is (or may be) a GPU, before ordinals are known."""

    number: int
    path: Path
    props: dict[str, int] | None = None
    partial: dict[str, int] = field(default_factory=dict)  # what a corrupted file still said
    problem: str | None = None  # unusable, but the runtime still enumerates it
    hidden: str | None = None  # the runtime will not enumerate it: no ordinal
    bdf: str | None = None
    partition: int = 0
    uuid: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def scan_amd(
    sysfs_root: Path,
    dev_root: Path,
    kfd: KfdStatus,
    *,
    enable_igpu: bool,
    inherited_rocr: str | None,
    override: GfxOverride | None,
) -> AmdScan:
    """Every AMD GPU in KFD topology (and any AMD DRM device that KFD does not show), in HIP order."""
    topology = sysfs_root / "class" / "kfd" / "kfd" / "topology" / "nodes"
    machine_root = sysfs_root.parent
    notes: list[str] = []
    numbers = sorted(int(n) for n in listdir(topology) if n.isdigit())
    cpu_nodes = 0
    nodes: list[_Node] = []
    for number in numbers:
        node = _read_node(number, topology / str(number))
        if node is None:
            cpu_nodes += 1
            continue
        nodes.append(node)

    if not numbers:
        probe = ProbeStatus("kfd-topology", False, f"no KFD topology at {topology}")
    else:
        probe = ProbeStatus(
            "kfd-topology", True, f"{len(numbers)} nodes: {cpu_nodes} CPU, {len(nodes)} GPU or unreadable"
        )

    for node in nodes:
        if node.hidden is None:
            _locate(node)
    _mark_partitions(nodes)
    if kfd.present:
        for node in nodes:
            _check_render_node(node, dev_root)

    # The runtime's device list: GPU nodes the thunk keeps, in node order; then the inherited mask.
    enumerated = [n for n in nodes if n.hidden is None]
    order = visible_order(inherited_rocr, [n.uuid for n in enumerated])
    ordinal: dict[int, int] = {}
    if order is None:
        ordinal = {n.number: i for i, n in enumerate(enumerated)}
    else:
        ordinal = {enumerated[pos].number: rank for rank, pos in enumerate(order)}
        for n in enumerated:
            if n.number not in ordinal:
                n.hidden = f"hidden by the inherited ROCR_VISIBLE_DEVICES={inherited_rocr!r}"

    devices: list[Device] = []
    for node in nodes:
        devices.append(
            _device(
                node,
                ordinal.get(node.number, -1),
                sysfs_root,
                machine_root,
                kfd,
                enable_igpu=enable_igpu,
                override=override,
                notes=notes,
            )
        )
    minors = {n.props["drm_render_minor"] for n in nodes if n.props and "drm_render_minor" in n.props}
    orphans = _drm_only(sysfs_root, minors, bool(numbers))
    # A corrupted node whose PCI address is unknown is most likely the AMD render node that no
    # readable KFD node claims (render minors are handed out in the same probe order): pair them.
    unknown = [i for i, d in enumerate(devices) if d.pci_bdf is None and d.kfd_node is not None]
    for i, orphan in zip(unknown, list(orphans), strict=False):
        devices[i] = replace(
            devices[i],
            name=f"{orphan.name} (KFD node {devices[i].kfd_node})",
            pci_bdf=orphan.pci_bdf,
            render_minor=orphan.render_minor,
            vram_total_bytes=orphan.vram_total_bytes,
            vram_used_bytes=orphan.vram_used_bytes,
        )
        orphans.remove(orphan)
    devices.extend(orphans)
    devices.sort(key=lambda d: (d.index < 0, d.index if d.index >= 0 else d.kfd_node or 0))
    return AmdScan(tuple(devices), probe, tuple(notes))


def _read_node(number: int, path: Path) -> _Node | None:
    """A GPU (or unreadable) node, or None for a CPU node."""
    node = _Node(number, path)
    try:
        gpu_id_text = read_text(path / "gpu_id").strip()
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            node.hidden = "not permitted by the device cgroup (a container not given this GPU)"
        else:
            node.hidden = f"KFD node {number}: gpu_id unreadable ({exc.strerror or exc})"
        return node
    try:
        gpu_id = int(gpu_id_text)
    except ValueError:
        node.hidden = f"KFD node {number}: gpu_id is not a number ({gpu_id_text[:20]!r})"
        return node
    if gpu_id == 0:
        return None
    props_path = path / "properties"
    try:
        node.props = parse_properties(read_text(props_path))
    except PermissionError:
        node.hidden = "not permitted by the device cgroup (a container not given this GPU)"
        return node
    except PropertiesError as exc:
        node.partial = exc.partial
        node.problem = f"corrupted KFD properties ({props_path}: {exc}); check dmesg for amdgpu errors"
        return node
    except OSError as exc:
        node.problem = f"unreadable KFD properties ({props_path}: {exc.strerror or exc})"
        return node
    props = node.props
    if props.get("simd_count", 0) == 0:
        return None  # the runtime treats a node without SIMDs as a CPU
    missing = [k for k in ("gfx_target_version", "drm_render_minor", "location_id") if k not in props]
    if missing:
        node.problem = f"corrupted KFD properties ({props_path}: no {', '.join(missing)})"
    elif props.get("vendor_id", AMD_VENDOR) != AMD_VENDOR:
        node.problem = f"KFD node {number} is not an AMD device (vendor_id {props['vendor_id']:#06x})"
    uid = props.get("unique_id", 0)
    node.uuid = f"GPU-{uid:016x}" if uid else None
    return node


def _locate(node: _Node) -> None:
    """PCI address from ``domain`` and ``location_id`` (bits 31:28: partition on newer kernels)."""
    props = node.props if node.props is not None else node.partial
    if "location_id" not in props:
        return
    location = props["location_id"]
    node.partition = location >> 28
    location &= 0xFFFF
    bus, devfn = location >> 8, location & 0xFF
    node.bdf = f"{props.get('domain', 0):04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


def _mark_partitions(nodes: list[_Node]) -> None:
    """Several KFD nodes on one PCI device are compute partitions (MI300 in CPX/DPX/QPX mode)."""
    seen: dict[str, int] = {}
    for n in nodes:
        if n.bdf:
            seen[n.bdf] = seen.get(n.bdf, 0) + 1
    for n in nodes:
        if n.bdf and (seen[n.bdf] > 1 or n.partition):
            n.extra["partitioned"] = True


def _check_render_node(node: _Node, dev_root: Path) -> None:
    if node.hidden or node.props is None or "drm_render_minor" not in node.props:
        return
    render = dev_root / "dri" / f"renderD{node.props['drm_render_minor']}"
    if not render.exists():
        node.hidden = f"{render} is missing, so ROCm skips this GPU; {CONTAINER_HINT}"


def _device(
    node: _Node,
    index: int,
    sysfs_root: Path,
    machine_root: Path,
    kfd: KfdStatus,
    *,
    enable_igpu: bool,
    override: GfxOverride | None,
    notes: list[str],
) -> Device:
    props = node.props
    if props is None or node.problem or "gfx_target_version" not in props:
        return Device.unusable(
            "amd",
            index,
            f"AMD GPU (KFD node {node.number})",
            node.hidden or node.problem or "unreadable KFD node",
            kfd_node=node.number,
            pci_bdf=node.bdf,
            uuid=node.uuid,
        )
    try:
        native = gfx_target_name(props["gfx_target_version"])
    except ValueError as exc:
        native = None
        node.problem = str(exc)
    minor = props["drm_render_minor"]
    drm = _drm_dir(sysfs_root, minor, node.bdf, notes)
    mem = _memory(node, drm)
    device_id = try_read_int(drm / "device", 16) if drm else None
    device_id = device_id if device_id is not None else props.get("device_id", 0)
    revision = try_read_int(drm / "revision", 16) if drm else None

    discrete_marker = drm is not None and (
        (drm / "board_info").exists() or (drm / "mem_info_vram_vendor").exists()
    )
    small_carveout = (
        mem.vram_total <= 4 * GiB and mem.gtt_total >= 8 * GiB and mem.gtt_total >= 4 * mem.vram_total
    )
    integrated = not discrete_marker and (native in _APU_TARGETS or small_carveout)
    total, used, paths = mem.vram_total, mem.vram_used, mem.used_paths
    if integrated and not node.extra.get("partitioned"):
        # An APU allocates from its carve-out and from GTT (system RAM the GPU maps): both count.
        total, used = total + mem.gtt_total, used + mem.gtt_used
        paths = paths + ((mem.gtt_path,) if mem.gtt_path else ())

    name = _name(node, drm, machine_root, device_id, revision, native)
    gfx = native
    extra: dict[str, object] = dict(node.extra)
    extra.update(device_id=f"0x{device_id:04x}", memory_source=mem.source)
    if revision is not None:
        extra["revision"] = f"0x{revision:02x}"
    if props.get("simd_per_cu"):
        extra["compute_units"] = props["simd_count"] // props["simd_per_cu"]
    if node.partition:
        extra["partition"] = node.partition
    if override is not None and override.target:
        extra["gfx_target_native"] = native
        gfx = override.target

    reason = node.hidden or node.problem
    if reason is None and override is not None and override.error:
        reason = f"{override.error}: the ROCm runtime refuses to start with it"
    if reason is None and not kfd.accessible:
        reason = kfd.hint or "/dev/kfd is not accessible"
    if reason is None and integrated and not enable_igpu:
        reason = IGPU_REASON
    if reason is None and total <= 0:
        reason = "no memory size in sysfs (mem_info_vram_total / KFD mem_banks)"
    return Device(
        vendor="amd",
        index=index,
        name=name,
        vram_total_bytes=total,
        vram_used_bytes=min(used, total) if total else used,
        uuid=node.uuid,
        pci_bdf=node.bdf,
        gfx_target=gfx,
        integrated=integrated,
        usable=reason is None,
        skip_reason=reason,
        gtt_total_bytes=mem.gtt_total if drm else None,
        gtt_used_bytes=mem.gtt_used if drm else None,
        render_minor=minor,
        kfd_node=node.number,
        extra=extra,
        usage_paths=paths,
        gtt_used_path=mem.gtt_path,
    )


def _link_target_name(path: Path) -> str | None:
    """The last component of what a sysfs link points at (``0000:03:00.0``): one readlink, where
    resolving the whole path would stat every directory on the way."""
    try:
        return path.readlink().name
    except OSError:
        return path.resolve().name if path.is_dir() else None


def _drm_dir(sysfs_root: Path, minor: int, bdf: str | None, notes: list[str]) -> Path | None:
    """The device directory behind ``renderD<minor>``, checked against the KFD PCI address."""
    render = sysfs_root / "class" / "drm" / f"renderD{minor}" / "device"
    base = _link_target_name(render)
    if base is not None:
        if not _looks_like_bdf(base) or base == bdf:
            return render  # a partition's render node points at a platform device, not a PCI one
        notes.append(f"renderD{minor} points at {base} but KFD says {bdf}: using the PCI address")
    pci = sysfs_root / "bus" / "pci" / "devices" / bdf if bdf else None
    if pci is not None and pci.exists():
        return pci
    return render if base is not None else None


def _looks_like_bdf(name: str) -> bool:
    return len(name) == 12 and name[4] == ":" and name[7] == ":" and name[10] == "."


@dataclass
class _Memory:
    vram_total: int = 0
    vram_used: int = 0
    gtt_total: int = 0
    gtt_used: int = 0
    used_paths: tuple[str, ...] = ()
    gtt_path: str | None = None
    source: str = "none"


def _memory(node: _Node, drm: Path | None) -> _Memory:
    mem = _Memory()
    if drm is not None:
        mem.gtt_total = try_read_int(drm / "mem_info_gtt_total") or 0
        mem.gtt_used = try_read_int(drm / "mem_info_gtt_used") or 0
        mem.gtt_path = str(drm / "mem_info_gtt_used") if mem.gtt_total else None
    # A partition's DRM numbers describe the whole device; its own share is in KFD's mem_banks.
    if drm is not None and not node.extra.get("partitioned"):
        total = try_read_int(drm / "mem_info_vram_total")
        if total:
            used_path = drm / "mem_info_vram_used"
            mem.vram_total = total
            mem.vram_used = try_read_int(used_path) or 0
            mem.used_paths = (str(used_path),)
            mem.source = "drm"
            return mem
    banks = node.path / "mem_banks"
    paths: list[str] = []
    for bank in sorted(listdir(banks)):
        text = try_read_text(banks / bank / "properties")
        try:
            props = parse_properties(text or "")
        except PropertiesError:
            continue
        if props.get("heap_type") in _FB_HEAPS:
            mem.vram_total += props.get("size_in_bytes", 0)
            used_path = banks / bank / "used_memory"
            used = try_read_int(used_path)
            if used is not None:
                mem.vram_used += used
                paths.append(str(used_path))
    if mem.vram_total:
        mem.used_paths = tuple(paths)
        mem.source = "kfd"
    return mem


def _name(
    node: _Node, drm: Path | None, machine_root: Path, device_id: int, revision: int | None, gfx: str | None
) -> str:
    name = try_read_text(drm / "product_name") if drm else None
    if not name:
        name = marketing_name(machine_root, device_id, revision)
    if not name:
        kfd_name = try_read_text(node.path / "name")
        if kfd_name and kfd_name != "ip discovery" and not kfd_name.startswith("gfx"):
            name = kfd_name
    if not name:
        name = f"AMD {gfx or 'GPU'} (0x{device_id:04x})"
    if node.extra.get("partitioned"):
        name += f" [partition {node.partition}]"
    return name


def _drm_only(sysfs_root: Path, known_minors: set[int], have_kfd: bool) -> list[Device]:
    """AMD render nodes with no KFD node: the GPU exists but ROCm cannot compute on it."""
    drm = sysfs_root / "class" / "drm"
    found: list[Device] = []
    for entry in sorted(listdir(drm)):
        minor = entry[len("renderD") :]
        if not entry.startswith("renderD") or (minor.isdigit() and int(minor) in known_minors):
            continue
        dev = drm / entry / "device"
        if try_read_int(dev / "vendor", 16) != AMD_VENDOR:
            continue
        bdf = _link_target_name(dev) or entry
        device_id = try_read_int(dev / "device", 16) or 0
        revision = try_read_int(dev / "revision", 16)
        name = marketing_name(sysfs_root.parent, device_id, revision) or f"AMD GPU (0x{device_id:04x})"
        why = (
            "no KFD node for this GPU: ROCm does not support it, or amdgpu runs without KFD"
            if have_kfd
            else "no KFD topology: amdgpu was loaded without HSA/KFD support, so ROCm cannot use it"
        )
        found.append(
            Device(
                vendor="amd",
                index=-1,
                name=name,
                vram_total_bytes=try_read_int(dev / "mem_info_vram_total") or 0,
                vram_used_bytes=try_read_int(dev / "mem_info_vram_used") or 0,
                pci_bdf=bdf,
                usable=False,
                skip_reason=why,
                render_minor=int(minor) if minor.isdigit() else None,
            )
        )
    return found
