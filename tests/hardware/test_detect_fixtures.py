"""detect() on fixture machines written in the kernel's sysfs format, and on the real machine."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import Device, Inventory, child_env, detect, refresh_usage
from rocmforge_supervisor.hardware._kfd import check_kfd

from .conftest import FIXTURES, MACHINES, machine_settings

Settings = Callable[..., ForgeSettings]
GiB = 1 << 30


def amd(inv: Inventory) -> list[Device]:
    return [d for d in inv.devices if d.vendor == "amd"]


@pytest.mark.parametrize("name", MACHINES)
def test_every_machine_has_the_cpu_last_and_never_raises(name: str, fixture_machine: Settings) -> None:
    inv = detect(fixture_machine(name))
    assert inv.devices[-1].vendor == "cpu"
    assert inv.cpu.index == 0
    assert inv.cpu.vram_total_bytes == psutil.virtual_memory().total
    for d in inv.devices:
        assert d.usable or d.skip_reason, d
    assert json.dumps([d.key for d in inv.devices])  # keys are unique, printable
    assert len({d.key for d in inv.devices}) == len(inv.devices)


def test_single_rx7900xtx(fixture_machine: Settings) -> None:
    s = fixture_machine("rx7900xtx")
    inv = detect(s)
    (gpu,) = amd(inv)
    assert inv.kfd.present and inv.kfd.accessible
    assert gpu.key == "amd:0" and gpu.usable
    assert gpu.name == "AMD Radeon RX 7900 XTX"  # from libdrm's amdgpu.ids: KFD says "ip discovery"
    assert gpu.gfx_target == "gfx1100"
    assert gpu.pci_bdf == "0000:0c:00.0"
    assert gpu.uuid == f"GPU-{11673270660693242239:016x}" == "GPU-a1ffc9d1799c317f"
    assert (gpu.vram_total_bytes, gpu.vram_used_bytes) == (25753026560, 536219648)
    assert (gpu.gtt_total_bytes, gpu.render_minor, gpu.kfd_node) == (33539522560, 128, 1)
    assert not gpu.integrated
    assert inv.gpus == (gpu,)
    env = child_env([gpu], inv, s)
    assert env["HIP_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] is None  # never on an AMD child
    assert env["ROCR_VISIBLE_DEVICES"] is None


def test_apu_plus_dgpu_excludes_the_igpu_and_keeps_hip_ordinals(fixture_machine: Settings) -> None:
    s = fixture_machine("apu780m_rx7800xt")
    inv = detect(s)
    dgpu, igpu = amd(inv)
    # card0 is simpledrm and the dGPU is card1: the join goes by render minor, not cardN.
    assert (dgpu.name, dgpu.gfx_target, dgpu.index, dgpu.render_minor) == (
        "AMD Radeon RX 7800 XT",
        "gfx1101",
        0,
        128,
    )
    assert dgpu.vram_total_bytes == 17163091968 and not dgpu.integrated
    assert (igpu.name, igpu.gfx_target, igpu.index) == ("AMD Radeon 780M Graphics", "gfx1103", 1)
    assert igpu.integrated and not igpu.usable
    assert igpu.skip_reason is not None and "FORGE_ENABLE_IGPU" in igpu.skip_reason
    assert igpu.uuid is None  # unique_id 0: ROCR cannot select it by UUID
    assert inv.gpus == (dgpu,)
    assert child_env([dgpu], inv, s)["HIP_VISIBLE_DEVICES"] == "0"

    s_on = fixture_machine("apu780m_rx7800xt", enable_igpu=True)
    inv_on = detect(s_on)
    dgpu, igpu = amd(inv_on)
    assert igpu.usable
    # an APU's memory is its carve-out plus GTT
    assert igpu.vram_total_bytes == 536870912 + 33285996544
    assert child_env([igpu], inv_on, s_on)["HIP_VISIBLE_DEVICES"] == "1"
    assert child_env([igpu, dgpu], inv_on, s_on)["HIP_VISIBLE_DEVICES"] == "0,1"
    # by UUID: the iGPU has none, so the ordinals stay in charge
    s_uuid = fixture_machine("apu780m_rx7800xt", enable_igpu=True, rocr_mask_by_uuid=True)
    env = child_env([igpu, dgpu], inv_on, s_uuid)
    assert env["HIP_VISIBLE_DEVICES"] == "0,1" and env["ROCR_VISIBLE_DEVICES"] is None


def test_inherited_rocr_mask_renumbers(fixture_machine: Settings) -> None:
    s = fixture_machine("apu780m_rx7800xt", enable_igpu=True, inherited_rocr_visible_devices="1")
    inv = detect(s)
    by_bdf = {d.pci_bdf: d for d in amd(inv)}
    igpu, dgpu = by_bdf["0000:0f:00.0"], by_bdf["0000:03:00.0"]
    assert igpu.index == 0 and igpu.usable
    assert dgpu.index == -1 and not dgpu.usable and dgpu.key == "amd:0000:03:00.0"
    assert dgpu.skip_reason is not None and "ROCR_VISIBLE_DEVICES" in dgpu.skip_reason
    env = child_env([igpu], inv, s)
    assert env == {
        "CUDA_VISIBLE_DEVICES": None,
        "GPU_DEVICE_ORDINAL": None,
        "HSA_OVERRIDE_GFX_VERSION": None,
        "ROCR_VISIBLE_DEVICES": "1",  # kept: the ordinal was counted after it
        "HIP_VISIBLE_DEVICES": "0",
    }


def test_eight_mi300x(fixture_machine: Settings) -> None:
    s = fixture_machine("mi300x_8")
    inv = detect(s)
    gpus = amd(inv)
    assert [d.index for d in gpus] == list(range(8))
    assert [d.kfd_node for d in gpus] == list(range(2, 10))  # two CPU nodes first
    assert [d.pci_bdf for d in gpus] == [
        f"0000:{b:02x}:00.0" for b in (0x05, 0x26, 0x46, 0x65, 0x85, 0xA6, 0xC6, 0xE5)
    ]
    assert {d.gfx_target for d in gpus} == {"gfx942"}
    assert {d.name for d in gpus} == {"AMD Instinct MI300X"}
    assert all(d.usable and d.vram_total_bytes == 206141652992 and not d.integrated for d in gpus)
    assert gpus[0].extra["compute_units"] == 304
    assert child_env([gpus[5], gpus[2]], inv, s)["HIP_VISIBLE_DEVICES"] == "2,5"

    s_uuid = fixture_machine("mi300x_8", rocr_mask_by_uuid=True)
    env = child_env([gpus[5], gpus[2]], inv, s_uuid)
    assert env["ROCR_VISIBLE_DEVICES"] == f"{gpus[2].uuid},{gpus[5].uuid}"
    assert env["HIP_VISIBLE_DEVICES"] == "0,1"  # HIP numbers what ROCr surfaced


def test_mi300x_rocr_uuid_and_ordinal_mix(fixture_machine: Settings) -> None:
    # ROCr surfaces devices in the order the variable names them: GPU 6 first, then GPU 3.
    s = fixture_machine("mi300x_8", inherited_rocr_visible_devices="GPU-4d5e6f70,3")
    inv = detect(s)
    visible = [d for d in amd(inv) if d.index >= 0]
    assert [(d.index, d.pci_bdf) for d in visible] == [(0, "0000:c6:00.0"), (1, "0000:65:00.0")]
    assert sum(1 for d in amd(inv) if d.index < 0) == 6
    assert child_env([visible[1]], inv, s)["HIP_VISIBLE_DEVICES"] == "1"


def test_mi300x_container_given_some_render_nodes(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("mi300x_8")
    (root / "dev/dri/renderD129").unlink()  # the thunk skips a GPU whose render node is missing
    s = machine_settings(root)
    inv = detect(s)
    gpus = amd(inv)
    skipped = [d for d in gpus if d.render_minor == 129]
    assert len(skipped) == 1 and skipped[0].index == -1 and not skipped[0].usable
    assert "renderD129" in (skipped[0].skip_reason or "")
    after = [d for d in gpus if d.render_minor == 130]
    assert after[0].index == 1  # the next GPU moves up
    assert [d.index for d in inv.gpus] == list(range(7))


def test_mi300x_cpx_partitions(fixture_machine: Settings) -> None:
    s = fixture_machine("mi300x_cpx")
    inv = detect(s)
    parts = amd(inv)
    assert len(parts) == 8
    assert {d.pci_bdf for d in parts} == {"0000:05:00.0"}  # partition bits 31:28 masked off
    assert [d.extra.get("partition", 0) for d in parts] == list(range(8))
    assert [d.index for d in parts] == list(range(8))
    # each partition's own share, from KFD mem_banks (DRM's numbers describe the whole device)
    assert {d.vram_total_bytes for d in parts} == {206141652992 // 8}
    assert [d.vram_used_bytes for d in parts] == [293601280 + p * 1048576 for p in range(8)]
    assert parts[3].name == "AMD Instinct MI300X [partition 3]"
    # The partitions share one unique_id, which ROCr refuses as ambiguous: masks stay ordinal.
    s_uuid = fixture_machine("mi300x_cpx", rocr_mask_by_uuid=True)
    env = child_env([parts[3]], inv, s_uuid)
    assert env["HIP_VISIBLE_DEVICES"] == "3" and env["ROCR_VISIBLE_DEVICES"] is None


def test_strix_halo_is_integrated_and_opt_in(
    fixture_machine: Settings, copy_machine: Callable[[str], Path]
) -> None:
    inv = detect(fixture_machine("strix_halo"))
    (gpu,) = amd(inv)
    assert (gpu.gfx_target, gpu.name, gpu.integrated, gpu.usable) == (
        "gfx1151",
        "AMD Radeon 8060S Graphics",
        True,
        False,
    )
    s_on = fixture_machine("strix_halo", enable_igpu=True)
    (gpu,) = amd(detect(s_on))
    assert gpu.usable and gpu.vram_total_bytes == 536870912 + 120259084288  # the big GTT counts
    assert child_env([gpu], detect(s_on), s_on)["HIP_VISIBLE_DEVICES"] == "0"

    # A BIOS that gives the GPU a 64 GiB carve-out defeats the "small VRAM, big GTT" rule;
    # the target still says APU.
    root = copy_machine("strix_halo")
    dev = Path(os.path.realpath(root / "sys/class/drm/renderD128/device"))
    (dev / "mem_info_vram_total").write_text(f"{64 * GiB}\n")
    (dev / "mem_info_gtt_total").write_text(f"{62 * GiB}\n")
    (gpu,) = amd(detect(machine_settings(root)))
    assert gpu.integrated and not gpu.usable


def test_corrupted_properties_file(fixture_machine: Settings) -> None:
    inv = detect(fixture_machine("corrupted"))
    good, bad = amd(inv)
    assert good.usable and good.index == 0 and good.name == "AMD Radeon RX 7900 XTX"
    assert not bad.usable and bad.index == 1
    assert bad.skip_reason is not None and "corrupted KFD properties" in bad.skip_reason
    assert "nodes/2/properties" in bad.skip_reason
    # paired with the render node no readable node claims, instead of listed twice
    assert bad.pci_bdf == "0000:83:00.0" and "KFD node 2" in bad.name
    assert inv.gpus == (good,)


def test_no_gpu_machine(fixture_machine: Settings) -> None:
    inv = detect(fixture_machine("no_gpu"))
    assert [d.vendor for d in inv.devices] == ["cpu"]
    assert not inv.kfd.present and not inv.kfd.accessible
    assert inv.kfd.hint is not None and "amdgpu" in inv.kfd.hint
    topo = inv.probe("kfd-topology")
    assert topo is not None and not topo.available


def test_the_real_machine_is_cpu_only() -> None:
    """No GPU and no amdsmi/NVML library here: that is detected for real, not simulated."""
    settings = machine_settings(
        Path("/"), sysfs_root=Path("/sys"), dev_root=Path("/dev"), use_amdsmi=True, use_nvml=True
    )
    inv = detect(settings)
    assert [d.vendor for d in inv.devices] == ["cpu"]
    assert inv.gpus == ()
    assert inv.cpu.cores and inv.cpu.cores >= 1
    smi, nvml = inv.probe("amdsmi"), inv.probe("nvml")
    assert smi is not None and not smi.available and "amdsmi" in smi.detail
    assert nvml is not None and not nvml.available and "NVML" in nvml.detail
    assert child_env([inv.cpu], inv, settings) == {
        "HIP_VISIBLE_DEVICES": "-1",
        "CUDA_VISIBLE_DEVICES": "-1",
        "GGML_VK_VISIBLE_DEVICES": "",
        "GPU_DEVICE_ORDINAL": None,
    }


def test_hsa_override_is_honoured(fixture_machine: Settings) -> None:
    s = fixture_machine("rx7900xtx", hsa_override_gfx_version="10.3.0")
    inv = detect(s)
    (gpu,) = amd(inv)
    assert gpu.gfx_target == "gfx1030" and gpu.extra["gfx_target_native"] == "gfx1100"
    assert child_env([gpu], inv, s)["HSA_OVERRIDE_GFX_VERSION"] == "10.3.0"

    bad = detect(fixture_machine("rx7900xtx", hsa_override_gfx_version="11.0"))
    (gpu,) = amd(bad)
    assert not gpu.usable and "HSA_OVERRIDE_GFX_VERSION" in (gpu.skip_reason or "")
    assert any("HSA_OVERRIDE_GFX_VERSION" in n for n in bad.notes)


def test_container_without_device_passthrough(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("rx7900xtx")
    shutil.rmtree(root / "dev")
    (root / "dev").mkdir()
    (root / ".dockerenv").write_text("")
    inv = detect(machine_settings(root))
    assert not inv.kfd.present
    assert "--device /dev/kfd --device /dev/dri" in (inv.kfd.hint or "")
    (gpu,) = amd(inv)
    assert not gpu.usable and "--device /dev/kfd" in (gpu.skip_reason or "")


def test_amdgpu_without_kfd_lists_the_gpu_as_unusable(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("rx7900xtx")
    shutil.rmtree(root / "sys/class/kfd")
    (gpu,) = amd(detect(machine_settings(root)))
    assert gpu.name == "AMD Radeon RX 7900 XTX" and gpu.index == -1 and not gpu.usable
    assert "KFD" in (gpu.skip_reason or "")


def _as_nobody(fn: Callable[[], str]) -> str:
    """Run ``fn`` in a forked child with root's rights dropped (uid/gid 65534): root bypasses file
    permissions, so a real EACCES needs a real unprivileged process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, fn().encode())
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        out = f.read()
    assert os.WIFEXITED(status)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another uid")
def test_kfd_permission_denied() -> None:
    root = Path(tempfile.mkdtemp(prefix="forge-kfd-"))  # /tmp itself is walkable by uid 65534
    try:
        root.chmod(0o755)
        shutil.copytree(FIXTURES / "rx7900xtx", root / "m", symlinks=True)
        (root / "m/dev/kfd").chmod(0o600)  # root's, as /dev/kfd is root:render 0660
        settings = machine_settings(root / "m")

        def probe() -> str:
            inv = detect(settings)
            (gpu,) = amd(inv)
            return json.dumps(
                [inv.kfd.present, inv.kfd.accessible, inv.kfd.hint, gpu.usable, gpu.skip_reason]
            )

        present, accessible, hint, usable, reason = json.loads(_as_nobody(probe))
        assert present and not accessible
        assert "render and video groups" in hint and "permission denied" in hint
        assert not usable and "render" in reason
        # the same tree, as root: accessible
        assert check_kfd(settings.dev_root, root / "m", settings.sysfs_root).accessible
    finally:
        shutil.rmtree(root)


def test_refresh_usage_rereads_only_usage(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("rx7900xtx")
    s = machine_settings(root)
    inv = detect(s)
    dev = Path(os.path.realpath(root / "sys/class/drm/renderD128/device"))
    (dev / "mem_info_vram_used").write_text("8589934592\n")
    (dev / "mem_info_gtt_used").write_text("4096\n")
    (dev / "mem_info_vram_total").write_text("1\n")  # not re-read: totals do not change
    fresh = refresh_usage(inv, s)
    (gpu,) = amd(fresh)
    assert gpu.vram_used_bytes == 8589934592 and gpu.gtt_used_bytes == 4096
    assert gpu.vram_total_bytes == 25753026560
    assert fresh.cpu.vram_total_bytes == psutil.virtual_memory().total
    assert fresh.kfd == inv.kfd and [d.key for d in fresh.devices] == [d.key for d in inv.devices]


def test_refresh_usage_of_a_partition(copy_machine: Callable[[str], Path]) -> None:
    root = copy_machine("mi300x_cpx")
    s = machine_settings(root)
    inv = detect(s)
    (root / "sys/class/kfd/kfd/topology/nodes/4/mem_banks/0/used_memory").write_text("1234567\n")
    parts = amd(refresh_usage(inv, s))
    assert parts[3].vram_used_bytes == 1234567
    assert parts[2].vram_used_bytes == amd(inv)[2].vram_used_bytes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    junk=st.binary(max_size=600),
    node_file=st.sampled_from(["properties", "gpu_id", "mem_banks/0/properties"]),
)
def test_detect_never_raises_on_garbage(
    junk: bytes, node_file: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = Path(tmp_path_factory.mktemp("junk"))
    shutil.copytree(FIXTURES / "apu780m_rx7800xt", root / "m", symlinks=True)
    (root / "m/sys/class/kfd/kfd/topology/nodes/1" / node_file).write_bytes(junk)
    inv = detect(machine_settings(root / "m"))
    assert inv.devices[-1].vendor == "cpu"
    for d in inv.devices:
        assert d.usable or d.skip_reason
