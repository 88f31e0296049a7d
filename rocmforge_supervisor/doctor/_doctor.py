"""``forge doctor``: every precondition of serving a model, one pass/warn/fail line each, with a fix.

The device-mask cross-check runs the real ``llama-server --list-devices`` under the environment
each placement would get and compares what it lists with what discovery expects: a mismatch means
the masks (or ROCm, or the build) would put a model somewhere other than planned.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from .._errors import ForgeError
from .._units import format_bytes
from ..activity import database_problem
from ..binaries import locate_llama_server, probe_binary
from ..config import ForgeSettings
from ..hardware import Device, Inventory, child_env, detect, device_json, gfx_target_name, parse_gfx_override
from ..process import clean_child_env

__all__ = [
    "Check",
    "DoctorReport",
    "ListedLike",
    "compare_listing",
    "cross_check",
    "load_target",
    "run_doctor",
]

Status = Literal["pass", "warn", "fail"]
MiB = 1 << 20
#: Name prefixes of GPU devices in ``--list-devices`` (``ROCm0``, ``CUDA1``, ``Vulkan0``).
GPU_PREFIXES = ("ROCm", "CUDA", "Vulkan", "SYCL", "MUSA", "Metal", "OpenCL", "CANN")
_PREFIX_OF = {"amd": "ROCm", "nvidia": "CUDA"}
#: The accel (``forge build --accel``) that computes on each GPU vendor.
_ACCEL_OF = {"amd": "hip", "nvidia": "cuda"}
_ROCM_BIN = Path("/opt/rocm/bin")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
BUILD_HINT = "run `forge build` (or set FORGE_LLAMA_SERVER to a llama-server binary)"


class ListedLike(Protocol):
    """A device line of ``llama-server --list-devices`` (the build package's ``ListedDevice``)."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def total_mib(self) -> int: ...


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]
    can_serve: bool
    inventory: Inventory
    load_target: Device | None = None
    binary: dict[str, object] | None = field(default=None)

    @property
    def exit_code(self) -> int:
        """0 when a model can be served (on the CPU counts), 1 otherwise."""
        return 0 if self.can_serve else 1

    def to_json(self, settings: ForgeSettings) -> dict[str, Any]:
        inv = self.inventory
        return {
            "ok": self.can_serve,
            "exit_code": self.exit_code,
            "checks": [c.to_json() for c in self.checks],
            "load_target": self.load_target.key if self.load_target else None,
            "binary": self.binary,
            "devices": [device_json(d, inv, settings) for d in inv.devices],
            "kfd": {"present": inv.kfd.present, "accessible": inv.kfd.accessible, "hint": inv.kfd.hint},
            "probes": [{"name": p.name, "available": p.available, "detail": p.detail} for p in inv.probes],
            "notes": list(inv.notes),
        }


def run_doctor(
    settings: ForgeSettings, *, inventory: Inventory | None = None, cross_check_masks: bool = True
) -> DoctorReport:
    inv = inventory if inventory is not None else detect(settings)
    amd = [d for d in inv.devices if d.vendor == "amd"]
    checks: list[Check] = [_cpu_check(inv)]
    checks.append(_kfd_check(inv, amd))
    checks.extend(_device_checks(inv, amd))
    if settings.hsa_override_gfx_version:
        checks.append(_override_check(settings, amd))
    checks.extend(_rocm_checks(amd))
    checks.append(_probe_check(inv, "amdsmi", needed=bool(amd)))
    checks.append(_nvml_check(inv, settings))
    checks.extend(Check("discovery", "warn", note) for note in inv.notes)

    binary_checks, info = _binary(settings)
    checks.extend(binary_checks)
    accels: tuple[str, ...] = tuple(info.accels) if info is not None else ()
    target = None
    if info is not None:
        checks.extend(_accel_checks(inv, info))
        if cross_check_masks:
            checks.extend(cross_check(Path(info.path), inv, settings, accels))
        target = load_target(inv, accels)
        where = target.key if target.vendor != "cpu" else "cpu"
        free = f"{format_bytes(target.vram_free_bytes)} free"
        checks.append(Check("load target", "pass", f"a load would go to {where} ({target.name}, {free})"))
    else:
        checks.append(Check("load target", "fail", "a load would fail: there is no llama-server", BUILD_HINT))
    checks.append(_activity_check(settings.state_dir / "activity.db"))
    binary_json = info.to_json() if info is not None and hasattr(info, "to_json") else None
    return DoctorReport(tuple(checks), info is not None, inv, target, binary_json)


def _activity_check(path: Path) -> Check:
    """The request log: a damaged or locked file does not stop serving, but nothing is logged."""
    problem = database_problem(path)
    if problem is None:
        return Check("activity log", "pass", f"{path}" + ("" if path.exists() else " (not created yet)"))
    return Check("activity log", "warn", problem[0], problem[1])


def _cpu_check(inv: Inventory) -> Check:
    cpu = inv.cpu
    available = cpu.extra.get("ram_available_bytes", cpu.vram_free_bytes)
    avail = format_bytes(int(available)) if isinstance(available, int) else "?"
    return Check(
        "cpu",
        "pass",
        f"{cpu.name}: {cpu.cores} cores, {format_bytes(cpu.vram_total_bytes)} RAM ({avail} available)",
    )


def _kfd_check(inv: Inventory, amd: list[Device]) -> Check:
    kfd = inv.kfd
    if kfd.present and kfd.accessible:
        return Check("/dev/kfd", "pass", "present and accessible (read-write)")
    if not amd and not kfd.present:
        return Check("/dev/kfd", "pass", "not present, and no AMD GPU was found (not needed)")
    return Check("/dev/kfd", "fail", "present but not accessible" if kfd.present else "not present", kfd.hint)


def _device_checks(inv: Inventory, amd: list[Device]) -> list[Check]:
    checks: list[Check] = []
    if not amd:
        topo = inv.probe("kfd-topology")
        checks.append(Check("amd gpus", "pass", f"none found ({topo.detail if topo else 'no KFD topology'})"))
    for d in [*amd, *(d for d in inv.devices if d.vendor == "nvidia")]:
        label = f"{d.key} {d.name}"
        target = d.gfx_target or d.compute_capability or "?"
        size = f"{format_bytes(d.vram_used_bytes)} used of {format_bytes(d.vram_total_bytes)}"
        if d.usable:
            kind = ", integrated" if d.integrated else ""
            checks.append(Check("gpu", "pass", f"{label}: {target}{kind}, {size}"))
        else:
            checks.append(Check("gpu", "warn", f"{label}: not used: {d.skip_reason}", _fix_for(d)))
    return checks


def _fix_for(d: Device) -> str | None:
    reason = d.skip_reason or ""
    if "FORGE_ENABLE_IGPU" in reason:
        return "set FORGE_ENABLE_IGPU=1 to place models on it"
    if "ROCR_VISIBLE_DEVICES" in reason or "CUDA_VISIBLE_DEVICES" in reason:
        return "unset the variable (or include this GPU) before starting forge"
    return None


def _override_check(settings: ForgeSettings, amd: list[Device]) -> Check:

    raw = settings.hsa_override_gfx_version or ""
    try:
        target = gfx_target_name(parse_gfx_override(raw))
    except ValueError as exc:
        return Check(
            "HSA_OVERRIDE_GFX_VERSION", "fail", str(exc), "set it to major.minor.stepping, or unset it"
        )
    native = sorted({str(d.extra.get("gfx_target_native")) for d in amd if d.extra.get("gfx_target_native")})
    return Check(
        "HSA_OVERRIDE_GFX_VERSION",
        "pass",
        f"{raw}: the runtime treats every GPU as {target}"
        + (f" (native: {', '.join(native)})" if native else ""),
    )


def _find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidate = _ROCM_BIN / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return -1, str(exc)
    return proc.returncode, proc.stdout + proc.stderr


def _rocm_checks(amd: list[Device]) -> list[Check]:
    needed = any(d.index >= 0 for d in amd)
    hipconfig, rocminfo = _find_tool("hipconfig"), _find_tool("rocminfo")
    checks: list[Check] = []
    if hipconfig is None:
        status: Status = "warn" if needed else "pass"
        message = "hipconfig not found" + ("" if needed else " (not needed: no AMD GPU)")
        fix = "install ROCm (https://rocm.docs.amd.com) to build and run the HIP llama-server"
        checks.append(Check("rocm", status, message, fix if needed else None))
    else:
        rc, out = _run([hipconfig, "--version"], 15)
        version = out.strip().splitlines()[0] if rc == 0 and out.strip() else f"failed: {out.strip()[-200:]}"
        checks.append(Check("rocm", "pass" if rc == 0 else "warn", f"hipconfig {version}"))
    if rocminfo is None:
        if needed:
            checks.append(Check("rocminfo", "warn", "rocminfo not found", "install ROCm's rocminfo package"))
        return checks
    rc, out = _run([rocminfo], 30)
    out = _ANSI_RE.sub("", out)  # rocminfo colours its errors ("ROCk module is NOT loaded") even into a pipe
    if rc != 0:
        tail = " ".join(out.strip().splitlines()[-2:])[-300:]
        checks.append(Check("rocminfo", "warn" if needed else "pass", f"rocminfo failed: {tail}"))
        return checks
    listed = sorted(re.findall(r"^\s*Name:\s+(gfx[0-9a-f]+)\s*$", out, flags=re.M))
    expected = sorted(d.gfx_target for d in amd if d.index >= 0 and d.gfx_target)
    if listed == expected:
        checks.append(Check("rocminfo", "pass", f"agents: {', '.join(listed) or 'no GPU'}"))
    else:
        checks.append(
            Check(
                "rocminfo",
                "warn",
                f"rocminfo lists {listed or 'no GPU'}, discovery expects {expected or 'no GPU'}",
                "compare `rocminfo` with `forge gpus`; check ROCR_VISIBLE_DEVICES and the container devices",
            )
        )
    return checks


def _probe_check(inv: Inventory, name: str, *, needed: bool) -> Check:
    probe = inv.probe(name)
    if probe is None:
        return Check(name, "pass", "not probed")
    if probe.available:
        return Check(name, "pass", probe.detail)
    if not needed:
        return Check(name, "pass", f"unavailable (not needed): {probe.detail}")
    return Check(
        name,
        "warn",
        f"unavailable: {probe.detail}",
        "optional: install ROCm's amdsmi for sensors (pip install amdsmi matching the ROCm version; "
        "Debian/Ubuntu: apt install amd-smi, whose module a venv sees with --system-site-packages)",
    )


def _pci_vendor_count(sysfs_root: Path, vendor: int) -> int:
    """Display/3D controllers of one vendor on the PCI bus (cheap: one small read per device)."""
    base = sysfs_root / "bus" / "pci" / "devices"
    count = 0
    try:
        entries = list(base.iterdir())
    except OSError:
        return 0
    for entry in entries:
        try:
            if int((entry / "vendor").read_text().strip(), 16) != vendor:
                continue
            if (entry / "class").read_text().strip().startswith("0x03"):
                count += 1
        except (OSError, ValueError):
            continue
    return count


def _nvml_check(inv: Inventory, settings: ForgeSettings) -> Check:
    probe = inv.probe("nvml")
    if probe is not None and probe.available:
        return Check("nvml", "pass", probe.detail)
    detail = probe.detail if probe else "not probed"
    boards = _pci_vendor_count(settings.sysfs_root, 0x10DE)
    if boards:
        return Check(
            "nvml",
            "warn",
            f"{boards} NVIDIA GPU(s) on the PCI bus, but NVML is unavailable: {detail}",
            "install the NVIDIA driver (it ships libnvidia-ml.so.1)",
        )
    return Check("nvml", "pass", f"unavailable (not needed: no NVIDIA GPU): {detail}")


def _binary(settings: ForgeSettings) -> tuple[list[Check], Any]:
    try:
        info = locate_llama_server(settings, list_devices=True)
    except ForgeError as exc:
        return [Check("llama-server", "fail", exc.message, exc.hint or BUILD_HINT)], None
    listed = ", ".join(f"{d.name} ({d.description})" for d in info.devices) or "none"
    message = (
        f"{info.path}: version {info.version}, commit {info.commit}; "
        f"accels {', '.join(info.accels)}; GPU devices it sees: {listed}"
    )
    return [Check("llama-server", "pass", message), _selftest_check(info), *_gpu_run_checks(info)], info


def _library_names(paths: Sequence[str]) -> str:
    """``libggml-hip.so, libggml-cpu-*.so (14 variants)``: a distribution ships one CPU library
    per instruction-set level."""
    names = [Path(p).name for p in paths]
    cpu = [n for n in names if n.startswith("libggml-cpu-")]
    rest = [n for n in names if n not in cpu]
    if len(cpu) > 1:
        rest.append(f"libggml-cpu-*.so ({len(cpu)} variants)")
    else:
        rest += cpu
    return ", ".join(rest) or "none found"


def _gpu_run_checks(info: Any) -> list[Check]:
    """A GPU build that has not computed on its GPU here is not called proven for it (compiled is
    not run), and a GPU backend that sees no device says why a load serves on the CPU. For a build
    whose backends are loadable libraries (a distribution's package): which are installed, which
    loaded, which failed to load."""
    checks: list[Check] = []
    ran = getattr(info, "gpu_run", None)
    if ran is not None:
        checks.append(
            Check("gpu run", "pass", ran.detail)
            if ran.ran
            else Check(
                "gpu run",
                "warn",
                f"not proven on a GPU: {ran.detail}",
                "on a machine with the GPU, `forge build --force` (or `forge doctor` there) runs its self-test on it",
            )
        )
    log = getattr(info, "backend_log", None)
    if log is not None and (log.loaded or log.failed or log.installed):
        loaded = ", ".join(f"{name} ({Path(path).name})" for name, path in log.loaded) or "none"
        installed = _library_names(log.installed)
        status: Status = "warn" if log.failed else "pass"
        failed = (
            "; failed to load: " + "; ".join(f"{Path(p).name}: {e}" for p, e in log.failed)
            if log.failed
            else ""
        )
        checks.append(
            Check(
                "backend libraries",
                status,
                f"installed: {installed}; loaded: {loaded}{failed}",
                "install the missing libraries the loader named" if log.failed else None,
            )
        )
    for why in getattr(info, "unused_gpu_backends", ()):
        checks.append(
            Check("backends", "pass", f"GPU backend present but unused, a load serves on the CPU: {why}")
        )
    return checks


def _selftest_check(info: Any) -> Check:
    """What the binary's self-test saw on this CPU (a failing one never gets this far: locate
    refuses it, and the llama-server check above fails with the self-test's reason)."""
    result = info.selftest
    if result is None:
        return Check(
            "self-test", "warn", "skipped (FORGE_SELFTEST=0)", "unset FORGE_SELFTEST to test the binary"
        )
    features = result.passing.cpu_features if result.passing else ()
    variant = f"; its CPU backend uses {' '.join(features)}" if features else ""
    status: Literal["pass", "warn"] = "warn" if result.child_args else "pass"
    fix = (
        "nothing to do: every child gets these flags; a llama.cpp with the AMX fix (PR #26954) needs none"
        if result.child_args
        else None
    )
    return Check("self-test", status, f"{result.detail} on {result.cpu_model}{variant}", fix)


def _accel_checks(inv: Inventory, info: Any) -> list[Check]:
    """A vendor's usable GPUs that the binary cannot compute on: not built for their accel, or
    built for it with a runtime that sees none of them."""
    accels = set(info.accels)
    checks: list[Check] = []
    for vendor, accel in _ACCEL_OF.items():
        usable = [d for d in inv.gpus if d.vendor == vendor]
        if usable and accel not in accels:
            built = getattr(info, "build_accel", None)
            why = (
                f"was built for {accel} but its runtime sees no {_PREFIX_OF[vendor]} device"
                if built == accel
                else f"was not built for {accel} (accels: {', '.join(sorted(accels))})"
            )
            fix = (
                "check the ROCm/CUDA runtime (rocminfo / nvidia-smi) and the device permissions"
                if built == accel
                else f"run `forge build --accel {accel}`"
            )
            checks.append(
                Check("accels", "warn", f"{len(usable)} usable {vendor} GPU(s), but llama-server {why}", fix)
            )
    return checks


def load_target(inventory: Inventory, accels: Sequence[str]) -> Device:
    """Where a load would go: the usable GPU with the most free memory that the binary has the
    accel for, else the CPU."""
    candidates = [d for d in inventory.gpus if _ACCEL_OF.get(d.vendor) in accels]
    if not candidates:
        return inventory.cpu
    return max(candidates, key=lambda d: (d.vram_free_bytes, -d.index))


def _placements(inventory: Inventory, accels: Sequence[str]) -> list[tuple[str, list[Device]]]:
    """Each usable GPU alone and all of a vendor's together, then the CPU. A vendor the binary has
    no accel for gets only the all-together run: alone, each would only repeat the same miss."""
    placements: list[tuple[str, list[Device]]] = []
    for vendor in ("amd", "nvidia"):
        gpus = [d for d in inventory.gpus if d.vendor == vendor]
        if not gpus:
            continue
        if _ACCEL_OF[vendor] in accels or len(gpus) == 1:
            placements.extend((d.key, [d]) for d in gpus[:8])
        if len(gpus) > 1:
            placements.append((",".join(d.key for d in gpus), gpus))
    placements.append(("cpu", [inventory.cpu]))
    return placements


def _full_env(overrides: Mapping[str, str | None], settings: ForgeSettings) -> dict[str, str]:
    """The environment the child would run with: ours, cleaned as the process layer cleans it,
    with the placement's variables applied."""
    return clean_child_env(os.environ, mask=overrides, config_home=settings.state_dir / "empty-config")


def compare_listing(expected: Sequence[Device], listed: Sequence[ListedLike]) -> str | None:
    """Why ``listed`` (``--list-devices`` under a placement's mask) is not what the placement
    expects, or None when it matches: the same number of devices of the placement's accel, in
    ordinal order, each with about the expected memory; no GPU device at all for the CPU."""
    gpus = [d for d in expected if d.vendor != "cpu"]
    gpu_lines = [line for line in listed if re.sub(r"\d+$", "", line.name) in GPU_PREFIXES]
    if not gpus:
        if gpu_lines:
            names = ", ".join(f"{line.name} ({line.description})" for line in gpu_lines)
            return f"a CPU placement still sees {names}"
        return None
    prefix = _PREFIX_OF[gpus[0].vendor]
    ours = [line for line in gpu_lines if re.sub(r"\d+$", "", line.name) == prefix]
    if len(ours) != len(gpus):
        seen = ", ".join(f"{line.name} ({line.description})" for line in gpu_lines) or "no GPU device"
        return f"expected {len(gpus)} {prefix} device(s), llama-server lists {seen}"
    for line, device in zip(ours, sorted(gpus, key=lambda d: d.index), strict=True):
        if device.integrated or device.vram_total_bytes <= 0:
            continue  # an APU's runtime total is its own mix of carve-out and GTT
        want = device.vram_total_bytes / MiB
        if abs(line.total_mib - want) > max(512.0, 0.1 * want):
            return (
                f"{line.name} has {line.total_mib} MiB, but {device.key} ({device.name}) has {want:.0f} MiB: "
                "the mask selects another GPU"
            )
    return None


def cross_check(
    binary: Path,
    inventory: Inventory,
    settings: ForgeSettings,
    accels: Sequence[str] = ("cpu", "hip", "cuda"),
) -> list[Check]:
    """Run ``--list-devices`` under each placement's mask (in parallel) and compare."""
    placements = _placements(inventory, accels)

    def one(item: tuple[str, list[Device]]) -> Check:
        label, devices = item
        env = child_env(devices, inventory, settings)
        shown = " ".join(f"{k}={v}" for k, v in env.items() if v is not None)
        try:
            info = probe_binary(binary, env=_full_env(env, settings))
        except ForgeError as exc:
            return Check("device masks", "warn", f"{label}: --list-devices failed under [{shown}]: {exc}")
        problem = compare_listing(devices, info.devices)
        if problem is None:
            listed = ", ".join(d.name for d in info.devices if d.name.startswith(GPU_PREFIXES)) or "no GPU"
            return Check("device masks", "pass", f"{label}: [{shown}] → llama-server sees {listed}")
        return Check(
            "device masks",
            "warn",
            f"{label}: {problem} (under [{shown}])",
            "check ROCR_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES inherited by forge, and `rocminfo`",
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, placements))
