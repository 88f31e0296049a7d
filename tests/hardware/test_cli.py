"""``forge gpus`` and ``forge doctor``, through typer's runner and through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rocmforge_supervisor.binaries import ListedDevice
from rocmforge_supervisor.cli import _hardware
from rocmforge_supervisor.config import get_settings
from rocmforge_supervisor.doctor import compare_listing, load_target
from rocmforge_supervisor.hardware import detect

from .conftest import FIXTURES, machine_settings

STABLE_DEVICE_KEYS = {
    "vendor", "index", "name", "gfx_target", "pci_bdf", "uuid", "vram_total_bytes", "vram_used_bytes",
    "integrated", "usable", "skip_reason", "env",
}  # fmt: skip
MiB = 1 << 20


@pytest.fixture
def forge() -> Iterator[typer.Typer]:
    """An app with just these commands; settings re-read from the environment on every test."""
    app = typer.Typer()
    _hardware.register(app)
    get_settings.cache_clear()
    yield app
    get_settings.cache_clear()


def machine_env(name: str, **extra: str | None) -> dict[str, str | None]:
    env: dict[str, str | None] = {
        "FORGE_SYSFS_ROOT": str(FIXTURES / name / "sys"),
        "FORGE_DEV_ROOT": str(FIXTURES / name / "dev"),
        "FORGE_USE_AMDSMI": "0",
        "FORGE_USE_NVML": "0",
        "FORGE_ENABLE_IGPU": None,
        "ROCR_VISIBLE_DEVICES": None,
        "CUDA_VISIBLE_DEVICES": None,
        "HSA_OVERRIDE_GFX_VERSION": None,
        "FORGE_HSA_OVERRIDE_GFX_VERSION": None,
        "COLUMNS": "250",
    }
    env.update(extra)
    return env


def invoke(app: typer.Typer, args: list[str], env: dict[str, str | None] | None = None) -> tuple[int, str]:
    get_settings.cache_clear()  # the commands read settings from the environment given here
    result = CliRunner().invoke(app, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stdout


def test_gpus_json_on_the_real_machine(forge: typer.Typer) -> None:
    code, out = invoke(forge, ["gpus", "--json"], {"FORGE_SYSFS_ROOT": None, "FORGE_DEV_ROOT": None})
    assert code == 0
    data = json.loads(out)
    (cpu,) = data["devices"]
    assert set(cpu) >= STABLE_DEVICE_KEYS
    assert (cpu["vendor"], cpu["index"], cpu["usable"]) == ("cpu", 0, True)
    assert cpu["env"]["HIP_VISIBLE_DEVICES"] == "-1" and cpu["env"]["CUDA_VISIBLE_DEVICES"] == "-1"
    assert data["kfd"] == {"present": False, "accessible": False, "hint": data["kfd"]["hint"]}
    assert {p["name"]: p["available"] for p in data["probes"]} == {
        "kfd-topology": False,
        "amdsmi": False,
        "nvml": False,
    }


def test_gpus_json_on_an_apu_machine(forge: typer.Typer) -> None:
    code, out = invoke(forge, ["gpus", "--json"], machine_env("apu780m_rx7800xt"))
    assert code == 0
    dgpu, igpu, cpu = json.loads(out)["devices"]
    assert (dgpu["vendor"], dgpu["index"], dgpu["gfx_target"], dgpu["pci_bdf"]) == (
        "amd",
        0,
        "gfx1101",
        "0000:03:00.0",
    )
    assert dgpu["env"]["HIP_VISIBLE_DEVICES"] == "0" and dgpu["env"]["CUDA_VISIBLE_DEVICES"] is None
    assert dgpu["uuid"] == f"GPU-{7283207964119141687:016x}"
    assert (igpu["integrated"], igpu["usable"], igpu["env"]) == (True, False, {})
    assert "FORGE_ENABLE_IGPU" in igpu["skip_reason"]
    assert cpu["vendor"] == "cpu"

    code, out = invoke(forge, ["gpus", "--json"], machine_env("apu780m_rx7800xt", FORGE_ENABLE_IGPU="1"))
    igpu = json.loads(out)["devices"][1]
    assert igpu["usable"] and igpu["env"]["HIP_VISIBLE_DEVICES"] == "1"


def test_gpus_table(forge: typer.Typer) -> None:
    code, out = invoke(forge, ["gpus"], machine_env("apu780m_rx7800xt"))
    assert code == 0
    assert "AMD Radeon RX 7800 XT" in out and "gfx1101" in out
    assert "HIP_VISIBLE_DEVICES=0" in out
    assert "amd:1 not used: integrated GPU" in out
    assert "/dev/kfd: accessible" in out
    # Each device's memory says what it is: the CPU's is RAM, not "VRAM" (as the header said).
    (cpu,) = [line for line in out.splitlines() if "│ cpu " in line]
    (dgpu,) = [line for line in out.splitlines() if "RX 7800 XT" in line]
    (apu,) = [line for line in out.splitlines() if "780M" in line]
    assert "GiB RAM " in cpu and "VRAM" not in cpu, cpu
    assert "GiB VRAM " in dgpu and "GiB VRAM+GTT " in apu, (dgpu, apu)
    assert "VRAM (GiB)" not in out


def test_gpus_json_through_the_entry_point() -> None:
    """The real `forge gpus --json`: stdout is JSON and nothing else (no library loader noise)."""
    proc = subprocess.run(
        [sys.executable, "-c", "from rocmforge_supervisor.cli.main import main; main()", "gpus", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["devices"][-1]["vendor"] == "cpu"


def _checks(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [c for c in data["checks"] if c["name"] == name]


def test_doctor_cpu_machine_with_llama_server(forge: typer.Typer, llama_server_bin: Path) -> None:
    env = {"FORGE_LLAMA_SERVER": str(llama_server_bin), "FORGE_SYSFS_ROOT": None, "FORGE_DEV_ROOT": None}
    code, out = invoke(forge, ["doctor", "--json"], env)
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["exit_code"] == 0
    assert {c["status"] for c in data["checks"]} <= {"pass", "warn", "fail"}
    assert all(c["message"] for c in data["checks"])
    (binary,) = _checks(data, "llama-server")
    assert binary["status"] == "pass" and str(llama_server_bin) in binary["message"]
    (masks,) = _checks(data, "device masks")  # the CPU placement only: there is no GPU
    assert masks["status"] == "pass" and masks["message"].startswith("cpu: [HIP_VISIBLE_DEVICES=-1")
    assert data["load_target"] == "cpu"
    assert _checks(data, "/dev/kfd")[0]["status"] == "pass"  # absent, and not needed


def test_doctor_without_llama_server_fails(forge: typer.Typer, tmp_path: Path) -> None:
    env = {"FORGE_LLAMA_SERVER": str(tmp_path / "no-such-llama-server"), "FORGE_SYSFS_ROOT": None}
    code, out = invoke(forge, ["doctor", "--json"], env)
    data = json.loads(out)
    assert code == 1 and not data["ok"]
    (binary,) = _checks(data, "llama-server")
    assert binary["status"] == "fail" and "forge build" in binary["fix"]
    assert _checks(data, "load target")[0]["status"] == "fail"

    code, out = invoke(forge, ["doctor"], env)
    assert code == 1
    assert "fail llama-server" in out and "fix:" in out and "no model can be served" in out


def test_doctor_cross_check_catches_a_cpu_build_on_an_amd_machine(
    forge: typer.Typer, llama_server_bin: Path
) -> None:
    """The fixture machine has an RX 7900 XTX; the real llama-server here is a CPU build, so under
    HIP_VISIBLE_DEVICES=0 it lists no ROCm device: the cross-check must say so (a warning)."""
    env = machine_env("rx7900xtx", FORGE_LLAMA_SERVER=str(llama_server_bin))
    code, out = invoke(forge, ["doctor", "--json"], env)
    data = json.loads(out)
    assert code == 0  # the CPU can still serve
    masks = {c["message"].split(": ")[0]: c for c in _checks(data, "device masks")}
    assert masks["amd:0"]["status"] == "warn"
    assert "expected 1 ROCm device(s), llama-server lists no GPU device" in masks["amd:0"]["message"]
    assert masks["cpu"]["status"] == "pass"
    (accels,) = _checks(data, "accels")
    assert accels["status"] == "warn" and "forge build --accel hip" in accels["fix"]
    assert data["load_target"] == "cpu"
    gpu = [c for c in _checks(data, "gpu") if "amd:0" in c["message"]]
    assert gpu[0]["status"] == "pass" and "gfx1100" in gpu[0]["message"]


def test_doctor_reports_kfd_permission_and_igpu(forge: typer.Typer) -> None:
    env = machine_env("apu780m_rx7800xt", FORGE_LLAMA_SERVER="/nonexistent/llama-server")
    code, out = invoke(forge, ["doctor", "--json", "--no-cross-check"], env)
    data = json.loads(out)
    igpu = [c for c in _checks(data, "gpu") if "amd:1" in c["message"]]
    assert igpu[0]["status"] == "warn" and "FORGE_ENABLE_IGPU=1" in igpu[0]["fix"]
    assert code == 1


def test_compare_listing() -> None:
    s = machine_settings(FIXTURES / "mi300x_8")
    inv = detect(s)
    gpu2, gpu5 = inv.by_key("amd:2"), inv.by_key("amd:5")
    total = gpu2.vram_total_bytes // MiB
    right = ListedDevice("ROCm0", "AMD Instinct MI300X", total - 300, total - 600)
    assert compare_listing([gpu2], [right]) is None
    two = [right, ListedDevice("ROCm1", "AMD Instinct MI300X", total, total)]
    assert compare_listing([gpu5, gpu2], two) is None
    problem = compare_listing([gpu2, gpu5], [right])
    assert problem is not None and "expected 2 ROCm device(s)" in problem
    wrong = ListedDevice("ROCm0", "AMD Radeon RX 7900 XTX", 24560, 24000)
    problem = compare_listing([gpu2], [wrong])
    assert problem is not None and "selects another GPU" in problem
    leak = compare_listing([inv.cpu], [ListedDevice("ROCm0", "AMD Instinct MI300X", total, total)])
    assert leak is not None and "CPU placement still sees ROCm0" in leak
    assert compare_listing([inv.cpu], [ListedDevice("BLAS", "OpenBLAS", 0, 0)]) is None


def test_load_target_prefers_most_free_gpu_with_a_backend() -> None:
    inv = detect(machine_settings(FIXTURES / "mi300x_8"))
    assert load_target(inv, ("cpu",)).vendor == "cpu"
    assert load_target(inv, ("cpu", "hip")).key == "amd:0"  # the least used of equals


def test_doctor_names_the_fix_for_a_damaged_activity_log(forge: typer.Typer, tmp_path: Path) -> None:
    (tmp_path / "activity.db").write_bytes(b"not a database " * 100)
    env = machine_env("no_gpu", FORGE_STATE_DIR=str(tmp_path), FORGE_LLAMA_SERVER=str(tmp_path / "none"))
    _, out = invoke(forge, ["doctor", "--json", "--no-cross-check"], env)
    (check,) = _checks(json.loads(out), "activity log")
    assert check["status"] == "warn" and "damaged" in check["message"] and ".broken" in check["fix"]
