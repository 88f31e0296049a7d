"""Yielding device memory to another program, end to end through the real Supervisor.

On a copy of the rx7900xtx fixture (24 GiB, gpu_id 45700), with the fake llama-server as each child
(real processes with real pids). The GPU's counters are files in the kernel's format
(tests/support/gpu_procs.py) that a FAKE kernel (:class:`Kernel`) rewrites before each poll: 8 GiB in
``/sys/class/kfd/kfd/proc/<pid>/vram_45700`` for each live child, the other program's DRM fdinfo, and
``mem_info_vram_used`` as their sum. The polls are driven by the test (``pressure_interval = 0``: the
background loop idles), so "within 2 polls" is counted, not timed.

And on the CPU with real processes only: RAM is the device, the other program is a real process
that allocates memory, and the supervisor's own poll loop runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import psutil
import pytest

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import EventKind, ModelState, Supervisor
from tests.hardware.conftest import FIXTURES
from tests.support.gpu_procs import fdinfo_text, set_vram_used, write_comm, write_fdinfo, write_kfd
from tests.support.supervised import running

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]
GIB = 1024**3
BDF = "0000:0c:00.0"
GPU_ID = 45700
GAME = 4242  # the other program: a pid in the fixture's /proc only
SLOW = {
    "gpu": 0,
    "parallel": 1,
    "ctx_size": 4096,
    "args": ["--fake-load-seconds", "1"],
}  # score: slow to load
FAST = {"gpu": 0, "parallel": 1, "ctx_size": 4096}


class Kernel:
    """A FAKE amdgpu/KFD: per-process files and the device counter for what is running now."""

    def __init__(self, root: Path, sup: Supervisor, per_child: int = 8 * GIB) -> None:
        self.root, self.sup, self.others, self.per_child = root, sup, 0, per_child
        write_comm(root, GAME, "game")

    def sync(self) -> None:
        base = GIB // 2  # the driver's own
        ours = 0
        live = {m.status().pid for m in self.sup.models.values()} - {None}
        procs = self.root / "sys" / "class" / "kfd" / "kfd" / "proc"
        for gone in procs.glob("*") if procs.is_dir() else ():
            if int(gone.name) not in live:  # the kernel drops an exited process's entry
                shutil.rmtree(gone)
        for pid in live:
            assert pid is not None
            write_kfd(self.root, pid, GPU_ID, self.per_child)
            ours += self.per_child
        write_fdinfo(self.root, GAME, 7, fdinfo_text(BDF, 11, self.others))
        set_vram_used(self.root, BDF, base + ours + self.others)


@pytest.fixture
def gpu_machine(tmp_path: Path) -> Path:
    """A writable copy of the rx7900xtx fixture (symlinks kept relative, as in sysfs)."""
    root = tmp_path / "rx7900xtx"
    shutil.copytree(FIXTURES / "rx7900xtx", root, symlinks=True)
    return root


def pressure_events(sup: Supervisor) -> list[tuple[str, dict[str, object]]]:
    return [(e.model, e.data) for e in sup.events.history() if e.kind == EventKind.PRESSURE]


async def test_another_program_growing_evicts_within_two_polls_in_score_order_and_no_loop(
    make_config: MakeConfig, fake_bin: Path, gpu_machine: Path
) -> None:
    root = gpu_machine
    cfg = make_config({"a": SLOW, "b": FAST}, machine=root, vram_reserve="4GiB", pressure_interval=0)
    async with running(cfg, fake_bin) as sup:
        kernel = Kernel(root, sup)
        await sup.load("a")  # a: slow to load back (1 s)
        await sup.load("b")  # b: quick (the fake's ~0.1 s)
        # Idle times without sleeping: a idle 60 s (the least recently used), b 30 s.
        sup.get("a").last_used -= 60
        sup.get("b").last_used -= 30
        # 24 GiB: 0.5 driver + 16 ours; the other program grows 2 GiB a step
        for others in (0, 2 * GIB):  # 7.5 and 5.5 GiB free: the reserve (4 GiB) holds
            kernel.others = others
            kernel.sync()
            assert await sup.pressure.poll() == []
        kernel.others = 4 * GIB  # 3.5 GiB free
        kernel.sync()
        assert await sup.pressure.poll() == []  # first poll below the reserve: not yet
        [ev] = await sup.pressure.poll()  # the second: act
        # b goes, not the LRU a: b's score (idle / load seconds) is the higher; b alone covers it
        assert ev.models == ("b",)
        assert ev.other == (GAME, "game", 4 * GIB)
        assert sup.get("b").state == ModelState.STOPPED and sup.get("a").state == ModelState.READY
        [(model, data)] = pressure_events(sup)
        assert model == "b" and data["pid"] == GAME and data["process"] == "game"
        assert data["device"] == "amd:0" and "yield memory" in str(data["message"])
        assert sup.get("b").status().to_json()["pressure_evictions"] == 1
        # A request loads b again: 3.5 GiB free once more, but the growth is ours: never evicted again.
        await sup.load("b")
        for _ in range(8):
            kernel.sync()
            assert await sup.pressure.poll() == []
        assert sup.get("b").state == ModelState.READY and len(pressure_events(sup)) == 1


async def test_busy_and_pinned_models_stay(
    make_config: MakeConfig, fake_bin: Path, gpu_machine: Path
) -> None:
    root = gpu_machine
    models = {"a": SLOW, "b": {**FAST, "pinned": True}, "c": FAST}
    cfg = make_config(models, machine=root, vram_reserve="4GiB", pressure_interval=0)
    async with running(cfg, fake_bin) as sup:
        kernel = Kernel(root, sup, per_child=6 * GIB)
        for name in "abc":
            await sup.load(name)
        # by score alone c, then b, would go first: c busy and b pinned must leave only a
        for name, idle in (("a", 10), ("b", 60), ("c", 120)):
            sup.get(name).last_used -= idle
        kernel.sync()  # 24 GiB: 0.5 + 18 ours → 5.5 GiB free
        assert await sup.pressure.poll() == []
        kernel.others = 2 * GIB  # 3.5 GiB free: below the 4 GiB reserve
        async with sup.acquire("c"):  # c busy, b pinned: only a may go
            kernel.sync()
            assert await sup.pressure.poll() == []
            [ev] = await sup.pressure.poll()
            assert ev.models == ("a",)
        assert [sup.get(n).state for n in "abc"] == [ModelState.STOPPED, ModelState.READY, ModelState.READY]


async def test_real_processes_on_the_cpu(make_config: MakeConfig, fake_bin: Path) -> None:
    """RAM as the device: a real process allocates until less than the reserve is available; the
    supervisor's own poll loop (every 0.1 s) evicts the idle model and names that process."""
    available = psutil.virtual_memory().available
    hog_bytes = 1536 * 1024**2
    if available < 3 * hog_bytes:
        pytest.skip(f"needs {3 * hog_bytes >> 20} MiB of free RAM, {available >> 20} MiB available")
    # the reserve: 1 GiB below what is available now; the hog's 1.5 GiB breaks it
    reserve = available - 1024**3
    cfg = make_config({"m": {}}, vram_reserve=reserve, pressure_interval=0.1)
    code = "import sys; b = b'x' * int(sys.argv[1]); print('ok', flush=True); sys.stdin.read()"
    async with running(cfg, fake_bin) as sup, sup.events.subscribe() as events:
        await sup.load("m")
        hog = await anyio.open_process([sys.executable, "-c", code, str(hog_bytes)], stdin=subprocess.PIPE)
        try:
            assert hog.stdout is not None
            assert (await hog.stdout.receive()).startswith(b"ok")
            with anyio.fail_after(15):  # 2 polls (0.2 s) plus the reads, on a busy box
                ev = await events.receive()
                while ev.kind != EventKind.PRESSURE:
                    ev = await events.receive()
            assert ev.model == "m" and ev.data["device"] == "cpu"
            assert ev.data["pid"] == hog.pid, ev.data  # the biggest other process: the hog
            with anyio.fail_after(10):
                while sup.get("m").state != ModelState.STOPPED:
                    await sup.get("m").changed()
            assert len(pressure_events(sup)) == 1
        finally:
            hog.kill()
            await hog.aclose()
