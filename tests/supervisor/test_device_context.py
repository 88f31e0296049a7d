"""The GPU backend's per-process device context as a named part of the estimate: a measured
default per backend, learned from a ready child's per-process device memory (fake KFD files in
the kernel's format, on a copy of the rx7900xtx fixture), kept in forge's cache dir, and used by
the next placements — so that many small models on one GPU are placed right."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from rocmforge_supervisor._errors import PlacementError
from rocmforge_supervisor.config import load_config
from rocmforge_supervisor.hardware import Device, Inventory, detect
from rocmforge_supervisor.models import DEVICE_CONTEXT_BYTES, estimate_memory
from rocmforge_supervisor.supervisor.placement._device_context import (
    CONTEXT_FILE,
    DeviceContexts,
    learn_from_child,
    measured_context,
)
from rocmforge_supervisor.supervisor.placement._placement import (
    LoadedModel,
    PlacementPolicy,
    PlacementRequest,
    place,
)
from tests.hardware.conftest import FIXTURES, machine_settings
from tests.models.conftest import GIB, MIB, model_like
from tests.support.gpu_procs import write_kfd
from tests.support.supervised import running

#: A Qwen2.5-0.5B-like shape at Q4_K_M (tied embedding): ~0.4 GiB of allocations at ctx 4096.
SMALL = model_like(
    "small-0.5b",
    n_layer=24,
    layer_bytes=14 * MIB,
    embd_bytes=130 * MIB,
    n_embd=896,
    n_head=14,
    n_head_kv=2,
    head_dim=64,
    n_ff=4864,
    vocab=151936,
    tied=True,
)
H100 = "NVIDIA H100 80GB HBM3"
GPU_ID = 45700  # the rx7900xtx fixture's KFD gpu_id


def test_the_context_is_a_named_part_of_the_estimate_per_backend() -> None:
    assert DEVICE_CONTEXT_BYTES["cuda"] == 645 * MIB  # measured on an H100 (issue 21)
    assert DEVICE_CONTEXT_BYTES["cpu"] == 0
    est = estimate_memory(SMALL, n_gpu_layers=None, ctx_size=4096, parallel=1, devices=("nvidia:0",))
    gpu = est.device("nvidia:0")
    assert gpu.context_bytes == 645 * MIB and gpu.total_bytes == gpu.allocated_bytes + 645 * MIB
    assert est.device("cpu").context_bytes == 0
    assert est.to_json()["context_bytes"] == 645 * MIB
    assert est.device("amd:0").context_bytes == 0  # not one of its devices
    on_amd = estimate_memory(SMALL, n_gpu_layers=None, ctx_size=4096, parallel=1, devices=("amd:0",))
    assert on_amd.device("amd:0").context_bytes == DEVICE_CONTEXT_BYTES["hip"]
    learned = estimate_memory(
        SMALL,
        n_gpu_layers=None,
        ctx_size=4096,
        parallel=1,
        devices=("nvidia:0",),
        device_context={"nvidia:0": 0},
    )
    assert learned.device("nvidia:0").context_bytes == 0
    on_cpu = estimate_memory(SMALL, n_gpu_layers=0, ctx_size=4096, parallel=1)
    assert (
        on_cpu.context_bytes == 0 and "context_bytes" not in on_cpu.to_json()
    )  # a CPU child's JSON as before


def _place_ten(inventory: Inventory, policy: PlacementPolicy) -> tuple[list[str], str | None]:
    """Place ten small models one after the other (none evicted); the names placed, and the
    first refusal's message."""
    loaded: list[LoadedModel] = []
    for i in range(10):
        request = PlacementRequest(name=f"m{i}", info=SMALL, ctx_size=4096, parallel=1)
        try:
            d = place(inventory, request, loaded, policy)
        except PlacementError as exc:
            return [m.name for m in loaded], exc.message
        # Loading (not yet in the device counters): placement subtracts what it will hold.
        loaded.append(LoadedModel(f"m{i}", d.estimated_bytes, d.devices, counted=False))
    return [m.name for m in loaded], None


def test_ten_small_models_on_one_gpu_are_placed_with_their_contexts() -> None:
    """A GPU whose free memory holds ten small models' allocations but not their ten CUDA
    contexts: without the context all ten would be started and the last ones fail to allocate."""
    one = estimate_memory(SMALL, n_gpu_layers=None, ctx_size=4096, parallel=1, devices=("nvidia:0",))
    allocated = one.device("nvidia:0").allocated_bytes
    policy = PlacementPolicy(allow_evict=False)
    # Room for ten models' allocations (with the margin and reserve placement asks for), no more.
    free = 9 * allocated + int(allocated * (1 + policy.estimate_margin)) + policy.gpu_reserve_bytes + 64 * MIB
    gpu = Device("nvidia", 0, H100, free + 1 * GIB, 1 * GIB, uuid="GPU-0", compute_capability="9.0")
    inventory = Inventory((gpu, Device("cpu", 0, "CPU", 64 * GIB, 4 * GIB, cores=16)), None)

    without, _ = _place_ten(inventory, PlacementPolicy(allow_evict=False, device_context={"nvidia:0": 0}))
    assert len(without) == 10  # the allocations alone fit: the sum fits only without the context

    placed, refusal = _place_ten(inventory, policy)
    assert 0 < len(placed) < 10
    held = len(placed) * (allocated + 645 * MIB)  # what nvidia-smi would show for them
    assert held <= free
    assert refusal is not None and "device context 645 MiB" in refusal


@pytest.fixture
def amd_gpu(tmp_path: Path) -> tuple[Path, Device]:
    """A writable copy of the rx7900xtx fixture machine, and its GPU."""
    root = tmp_path / "rx7900xtx"
    shutil.copytree(FIXTURES / "rx7900xtx", root, symlinks=True)
    return root, detect(machine_settings(root)).by_key("amd:0")


def test_measured_context_is_the_difference_when_plausible() -> None:
    assert measured_context(1414 * MIB, 771 * MIB) == 643 * MIB
    assert measured_context(500 * MIB, 0) is None  # no allocations logged: nothing to subtract
    assert measured_context(771 * MIB, 771 * MIB) is None
    assert measured_context(20 * GIB, 1 * GIB) is None  # no context is that large


@pytest.mark.anyio
async def test_a_ready_child_teaches_the_context_and_placement_uses_it(
    amd_gpu: tuple[Path, Device], tmp_path: Path
) -> None:
    root, gpu = amd_gpu
    pid = 4321
    write_kfd(root, pid, GPU_ID, 771 * MIB + 300 * MIB)  # what KFD shows the child holding
    settings = machine_settings(root, cache_dir=tmp_path / "cache")
    contexts = DeviceContexts(settings.cache_dir / CONTEXT_FILE)
    assert contexts.for_devices([gpu]) == {}  # nothing measured yet: the default applies

    learned = await learn_from_child(contexts, [gpu], pid, {"amd:0": 771 * MIB}, settings)
    assert learned == {"amd:0": 300 * MIB}
    stored = json.loads((tmp_path / "cache" / CONTEXT_FILE).read_text())
    assert stored[f"hip/{gpu.name}"]["bytes"] == 300 * MIB
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [CONTEXT_FILE]  # no temp file left

    # A later service (a new reader of the same file) places with the measured figure.
    again = DeviceContexts(settings.cache_dir / CONTEXT_FILE).for_devices(detect(settings).devices)
    assert again == {"amd:0": 300 * MIB}
    inventory = detect(settings)
    request = PlacementRequest(name="m", info=SMALL, ctx_size=4096, parallel=1)
    d = place(inventory, request, [], PlacementPolicy(device_context=again))
    assert d.estimate.device("amd:0").context_bytes == 300 * MIB

    # A child the per-process files do not show (another pid) teaches nothing.
    assert await learn_from_child(contexts, [gpu], pid + 1, {"amd:0": 771 * MIB}, settings) == {}


def test_an_unreadable_file_means_the_defaults(tmp_path: Path, amd_gpu: tuple[Path, Device]) -> None:
    _, gpu = amd_gpu
    path = tmp_path / CONTEXT_FILE
    path.write_text("{not json")
    assert DeviceContexts(path).for_devices([gpu]) == {}
    path.write_text(json.dumps({f"hip/{gpu.name}": {"bytes": "lots"}}))
    assert DeviceContexts(path).for_devices([gpu]) == {}
    DeviceContexts(path).record(gpu, 200 * MIB)  # the next measurement rewrites it whole
    assert DeviceContexts(path).for_devices([gpu]) == {"amd:0": 200 * MIB}


@pytest.mark.anyio
async def test_the_service_learns_the_context_of_its_ready_child(
    amd_gpu: tuple[Path, Device],
    tmp_path: Path,
    tiny_gguf: Path,
    fake_bin: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """End to end with the fake llama-server (a FAKE: it prints the allocation line a ROCm build
    prints, and writes its own KFD per-process file) on a copy of the rx7900xtx machine."""
    root, gpu = amd_gpu
    monkeypatch.setenv("FAKE_LLAMA_LOG", "load_tensors:        ROCm0 model buffer size =   771.00 MiB")
    kfd_file = root / "sys" / "class" / "kfd" / "kfd" / "proc" / "{pid}" / f"vram_{GPU_ID}"
    toml = tmp_path / "forge.toml"
    toml.write_text(
        f'[server]\nstate_dir = "{tmp_path / "state"}"\n\n[models.a]\npath = "{tiny_gguf}"\n'
        f'gpu = 0\nctx_size = 1024\nparallel = 1\nargs = ["--fake-device-memory", "{kfd_file}={1071 * MIB}"]\n'
    )
    settings = machine_settings(root, state_dir=tmp_path / "state", cache_dir=tmp_path / "cache")
    stored = tmp_path / "cache" / CONTEXT_FILE
    async with running(load_config(toml, settings, env={}), fake_bin) as sup:
        await sup.load("a")
        assert sup.get("a").status().context_bytes == {"amd:0": DEVICE_CONTEXT_BYTES["hip"]}  # the default
        with anyio.fail_after(10):  # measured in the background once the child is ready
            while not stored.exists():  # noqa: ASYNC110 (a file, no event to wait on)
                await anyio.sleep(0.02)
        assert DeviceContexts(stored).for_devices([gpu]) == {"amd:0": 300 * MIB}
        await sup.unload("a")
        await sup.load("a")  # the next placement counts the measured figure
        assert sup.get("a").status().context_bytes == {"amd:0": 300 * MIB}
        assert sup.get("a").status().to_json()["memory"]["context_bytes"] == {"amd:0": 300 * MIB}
