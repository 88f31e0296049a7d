"""child_env: what a child's environment says about which GPUs it may see."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from rocmforge_supervisor._errors import UsageError
from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import MASK_VARIABLES, child_env, detect

Settings = Callable[..., ForgeSettings]

CPU_ENV = {
    "HIP_VISIBLE_DEVICES": "-1",
    "CUDA_VISIBLE_DEVICES": "-1",
    "GGML_VK_VISIBLE_DEVICES": "",
    "GPU_DEVICE_ORDINAL": None,
}


def test_cpu_placement_hides_every_gpu(fixture_machine: Settings) -> None:
    s = fixture_machine("mi300x_8")
    inv = detect(s)
    assert child_env([inv.cpu], inv, s) == CPU_ENV
    assert child_env([], inv, s) == CPU_ENV


def test_cpu_in_a_gpu_placement_is_ignored(fixture_machine: Settings) -> None:
    s = fixture_machine("mi300x_8")
    inv = detect(s)
    env = child_env([inv.cpu, inv.by_key("amd:3")], inv, s)
    assert env["HIP_VISIBLE_DEVICES"] == "3"


def test_only_known_variables(fixture_machine: Settings) -> None:
    s = fixture_machine(
        "apu780m_rx7800xt", enable_igpu=True, rocr_mask_by_uuid=True, hsa_override_gfx_version="11.0.0"
    )
    inv = detect(s)
    for d in inv.devices:
        if d.usable:
            assert set(child_env([d], inv, s)) <= set(MASK_VARIABLES)


def test_unusable_and_unknown_devices_are_refused(fixture_machine: Settings) -> None:
    s = fixture_machine("apu780m_rx7800xt")
    inv = detect(s)
    igpu = inv.by_key("amd:1")
    with pytest.raises(UsageError, match=r"amd:1.*not usable.*FORGE_ENABLE_IGPU"):
        child_env([igpu], inv, s)
    stranger = replace(inv.by_key("amd:0"), index=7)
    with pytest.raises(UsageError, match="amd:7 is not in this inventory"):
        child_env([stranger], inv, s)


def test_duplicate_devices_count_once(fixture_machine: Settings) -> None:
    s = fixture_machine("mi300x_8")
    inv = detect(s)
    d = inv.by_key("amd:4")
    assert child_env([d, d], inv, s)["HIP_VISIBLE_DEVICES"] == "4"


def test_override_removed_when_unset(fixture_machine: Settings) -> None:
    s = fixture_machine("rx7900xtx")
    inv = detect(s)
    env = child_env([inv.by_key("amd:0")], inv, s)
    assert "HSA_OVERRIDE_GFX_VERSION" in env and env["HSA_OVERRIDE_GFX_VERSION"] is None
