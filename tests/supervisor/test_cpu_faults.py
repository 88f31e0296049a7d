"""A child that dies of a CPU fault says what happened and what to do (the FAKE llama-server dies
of the real signal at the moment a real build does: SIGILL while loading, SIGSEGV on the first
completion; tests/binaries/test_selftest.py has the same faults through the build self-test)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from rocmforge_supervisor._errors import ServiceError
from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.supervisor import ModelState
from tests.support.supervised import running, wait_state

pytestmark = pytest.mark.anyio

MakeConfig = Callable[..., ForgeConfig]


@pytest.mark.parametrize("amx", [False, True], ids=["no-amx", "amx"])
async def test_sigill_while_loading_fails_at_once_with_the_fix(
    make_config: MakeConfig, fake_bin: Path, monkeypatch: pytest.MonkeyPatch, amx: bool
) -> None:
    """The advice depends on the CPU: a rebuild where the build lacks an instruction, the
    ``--no-repack`` flag where an AMX CPU's ggml kernels are the cause (the child ran without it).
    Both CPUs are simulated, so the test means the same on every machine."""
    from rocmforge_supervisor.supervisor.launch import _launch
    from rocmforge_supervisor.supervisor.model import _child_run

    flags = frozenset({"avx2", *(["amx_int8", "amx_tile"] if amx else [])})
    monkeypatch.setattr(_launch, "cpu_flags", lambda: flags)
    monkeypatch.setattr(_child_run, "cpu_flags", lambda: flags)
    async with running(make_config({"m": {"args": ["--fake-die", "SIGILL"]}}), fake_bin) as sup:
        with pytest.raises(ServiceError, match="killed by SIGILL") as info:
            await sup.load("m")
        m = sup.get("m")
        assert m.restarts == 0  # a restart cannot help
        if amx:
            assert m.failure_kind == "amx_fault"
            assert "--no-repack" in info.value.message and "forge build --portable" not in info.value.message
        else:
            assert m.failure_kind == "illegal_instruction"
            assert (
                "lacks an instruction" in info.value.message
                and "forge build --portable" in info.value.message
            )
        assert m.status().state == ModelState.FAILED


async def test_a_crash_on_the_first_completion_names_the_cause(
    make_config: MakeConfig, fake_bin: Path
) -> None:
    cfg = make_config({"m": {"args": ["--fake-die-on-request", "SIGSEGV"]}}, crash_loop_max=1)
    async with running(cfg, fake_bin) as sup:
        m = sup.get("m")
        async with sup.acquire("m") as upstream:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": f"Bearer {upstream.api_key}"}
            async with httpx.AsyncClient(base_url=upstream.base_url, headers=headers) as c:
                with pytest.raises(httpx.HTTPError):
                    await c.post("/v1/chat/completions", json=body)
        await wait_state(m, ModelState.FAILED)
        assert m.last_error is not None
        assert "killed by SIGSEGV: it crashed in its first computation" in m.last_error
        assert "forge doctor" in m.last_error
        assert m.failure_kind == "crash_loop"


def test_no_repack_children_are_placed_without_the_repacked_copy(tmp_path: Path) -> None:
    """On a CPU where the self-test gives every child --no-repack, placement must not count the
    CPU_REPACK copy of the weights that such a child never makes."""
    from rocmforge_supervisor.binaries._tinymodel import write_selftest_gguf
    from rocmforge_supervisor.models import inspect_gguf
    from rocmforge_supervisor.supervisor.placement._placement_types import PlacementRequest, _apply_args

    info = inspect_gguf(write_selftest_gguf(tmp_path))
    repacked = sum(info.layer_repack_bytes) + info.output_repack_bytes
    if not repacked:
        pytest.skip("this CPU repacks none of a Q4_0 model's weights")
    request = PlacementRequest(name="m", info=info, gpu="cpu", ctx_size=256, parallel=1)
    plain = _apply_args(request)
    workaround = _apply_args(replace(request, extra_args=("--no-repack",)))
    assert plain.repack and not workaround.repack
    from rocmforge_supervisor.models import estimate_memory

    with_copy = estimate_memory(info, n_gpu_layers=0, ctx_size=256, parallel=1, repack=True)
    without = estimate_memory(info, n_gpu_layers=0, ctx_size=256, parallel=1, repack=False)
    assert with_copy.total_bytes - without.total_bytes == repacked


def _amx_like_fake(folder: Path) -> Path:
    """A FAKE llama-server that dies of SIGILL on its first completion unless ``--no-repack`` is on
    its command line: an AMX Xeon's child at the pinned llama.cpp (PR #26954), on any CPU."""
    fake = Path(__file__).resolve().parents[1] / "support" / "fake_llama_server.py"
    path = folder / "amx-bin" / "llama-server"
    path.parent.mkdir(parents=True)
    path.write_text(
        "#!/bin/bash\nexport FAKE_LLAMA_DIE_ON_REQUEST=SIGILL FAKE_LLAMA_WORKS_WITH=--no-repack\n"
        f'exec -a llama-server "{sys.executable}" "{fake}" "$@"\n'
    )
    path.chmod(0o755)
    return path


async def test_a_binary_given_by_path_gets_the_flags_its_self_test_found(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    """Round 3's ``make test`` on an AMX CPU: a Supervisor given a binary path started children
    without the self-test's ``--no-repack`` and each died of SIGILL at its first compute. The
    binary is now proven on this CPU (the self-test runs once, its record kept) like a located one,
    and every child gets the flags that passed."""
    binary = _amx_like_fake(tmp_path)
    async with running(make_config({"m": {}}), binary, timeout=60) as sup:
        assert sup.binary_args == ("--no-repack",)
        m = sup.get("m")
        async with sup.acquire("m") as upstream:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"Authorization": f"Bearer {upstream.api_key}"}
            async with httpx.AsyncClient(base_url=upstream.base_url, headers=headers) as c:
                r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert m.server is not None and m.server.pid is not None
        assert "--no-repack" in psutil.Process(m.server.pid).cmdline()
        assert m.restarts == 0
