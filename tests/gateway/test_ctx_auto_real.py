"""``ctx_size = "auto"`` through the real llama-server (SmolLM2-135M, trained on 8192 tokens) on a
machine whose RAM is made small: the supervisor reads the CPU's free memory as 1 GiB (placement's
RAM reserve) + 240 MiB, so the context that fits is below the trained one. The chosen context is
what the child was started with, what ``/api/models`` and ``/v1/models`` report, and what the
child's own allocation lines add up to fits the budget the plan sized it against."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeSettings
from rocmforge_supervisor.hardware import Inventory
from rocmforge_supervisor.supervisor import _supervisor
from rocmforge_supervisor.supervisor.placement._placement import PlacementPolicy
from tests.support.gateway import serving
from tests.support.supervised import fake_config

pytestmark = pytest.mark.anyio

_MIB = 1024**2
RESERVE = PlacementPolicy().cpu_reserve_bytes
FREE = RESERVE + 240 * _MIB


@pytest.fixture
def small_ram(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The supervisor's fresh inventory says the CPU has :data:`FREE` bytes free."""
    real = _supervisor.refresh_usage

    def small(inventory: Inventory, settings: ForgeSettings) -> Inventory:
        fresh = real(inventory, settings)
        devices = tuple(
            replace(d, vram_used_bytes=d.vram_total_bytes - FREE) if d.vendor == "cpu" else d
            for d in fresh.devices
        )
        return replace(fresh, devices=devices)

    monkeypatch.setattr(_supervisor, "refresh_usage", small)
    yield


async def test_auto_context_under_a_small_budget(
    small_ram: None,
    tmp_path: Path,
    smollm2_path: Path,
    llama_server_bin: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = {"ctx_size": "auto", "preload": True, "gpu": "cpu", "args": ["--threads", "1"]}
    config = fake_config(tmp_path, smollm2_path, {"chat": model}, pressure_interval=0)
    caplog.set_level(logging.INFO, logger="rocmforge.supervisor")
    async with serving(config, llama_server_bin, timeout=120) as gw:
        m = gw.model("chat")
        plan = m.plan
        assert plan is not None and m.state.value == "ready"
        chosen = plan.decision.context
        assert chosen is not None and chosen.limit == "memory", chosen
        assert 2048 <= chosen.per_request < 8192 and chosen.per_request % 256 == 0
        assert chosen.budget_bytes["cpu"] == FREE
        assert plan.spec.ctx_size == chosen.ctx_size == chosen.per_request  # one shared KV cache
        assert f"model chat: ctx_size auto: {chosen.per_request} tokens per request, the most" in caplog.text

        # what the child logged it allocated fits what the plan gave it (the free RAM less the reserve)
        actual = plan.actual.device_totals()["cpu"]
        estimated = plan.estimate.device("cpu").allocated_bytes
        assert actual <= FREE - RESERVE, (actual, FREE - RESERVE)
        assert abs(actual - estimated) <= 0.03 * estimated, (actual, estimated)
        status = (await gw.client.get("/api/models")).json()["models"][0]
        assert status["memory"]["actual_bytes"]["cpu"] == actual

        # the chosen context, everywhere it is shown
        assert status["context"]["per_request"] == chosen.per_request
        assert status["context"]["auto"]["ctx_size"] == chosen.ctx_size
        listed = (await gw.client.get("/v1/models")).json()["data"][0]
        assert listed["context_length"] == chosen.per_request
