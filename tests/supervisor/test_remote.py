"""Planning a model onto RPC workers, from what the workers reported (the real gemma GGUF's size)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor.config import ForgeConfig
from rocmforge_supervisor.hardware import WorkerDevice, WorkerReport, detect
from rocmforge_supervisor.models._gguf import inspect_gguf
from rocmforge_supervisor.supervisor.launch._launch import (
    ModelSpec,
    ResolvedModel,
    build_plan,
    decide_on_workers,
)
from rocmforge_supervisor.supervisor.placement._remote import WorkersUnavailable, plan_on_workers

GIB = 1 << 30


def _worker(port: int, free_gib: float) -> WorkerReport:
    addr = f"10.0.0.{port % 250}:{port}"
    return WorkerReport(addr, "ok", (WorkerDevice(addr, 0, addr, 64 * GIB, int(free_gib * GIB)),))


def test_fewest_workers_unless_spread(gemma_path: Path) -> None:
    info = inspect_gguf(gemma_path)
    reports = [_worker(50052, 8), _worker(50053, 16)]
    one = plan_on_workers(info, reports, ctx_size=4096, parallel=1)
    assert one.addresses == ("10.0.0.53:50053",)  # the one with more room
    assert one.child_args() == ["--rpc", "10.0.0.53:50053", "--tensor-split", "1"]
    both = plan_on_workers(info, reports, ctx_size=4096, parallel=1, spread=True)
    assert both.addresses == ("10.0.0.52:50052", "10.0.0.53:50053")  # configured order
    assert both.tensor_split == pytest.approx((1 / 3, 2 / 3), abs=0.01)
    shares = both.shares()
    assert [s["worker"] for s in shares] == list(both.addresses)
    assert sum(int(s["layers"]) for s in shares) == info.block_count


def test_down_busy_and_held_workers_are_left_out_and_named(gemma_path: Path) -> None:
    info = inspect_gguf(gemma_path)
    reports = [
        WorkerReport("10.0.0.1:1", "unreachable", detail="nothing answers on 10.0.0.1:1"),
        _worker(50052, 8),
        _worker(50053, 8),
    ]
    plan = plan_on_workers(info, reports, ctx_size=2048, parallel=1, held={"10.0.0.53:50053"}, spread=True)
    assert plan.addresses == ("10.0.0.52:50052",)
    assert plan.skipped == {
        "10.0.0.1:1": "nothing answers on 10.0.0.1:1",
        "10.0.0.53:50053": "in use by another model",
    }


def test_too_little_room_is_retryable_and_says_how_much(gemma_path: Path) -> None:
    info = inspect_gguf(gemma_path)
    with pytest.raises(WorkersUnavailable, match=r"lack .* GiB on rpc:10\.0\.0\.52:50052#0.*nothing answers"):
        plan_on_workers(
            info,
            [_worker(50052, 0.1), WorkerReport("10.0.0.9:9", "unreachable", detail="nothing answers")],
            ctx_size=4096,
            parallel=1,
        )


def test_the_launch_pipeline_starts_a_worker_plan_with_rpc_and_split(
    gemma_path: Path, make_config: Callable[..., ForgeConfig], tmp_path: Path
) -> None:
    """decide_on_workers → build_plan: every layer on the workers, no local device, no --device none."""
    spec = ModelSpec(path=str(gemma_path), ctx_size=2048, parallel=1, workers="all")
    model = ResolvedModel(gemma_path, inspect_gguf(gemma_path))
    decision = decide_on_workers(spec, "big", model, [_worker(50052, 8), _worker(50053, 16)])
    settings = make_config({}).settings
    plan = build_plan(
        spec,
        "big",
        model,
        decision,
        detect(settings),
        settings,
        binary=Path("llama-server"),
        log_path=tmp_path / "big.log",
        state_dir=tmp_path,
    )
    argv = plan.spec.args(8080, tmp_path / "key")
    assert argv[argv.index("--rpc") + 1] == "10.0.0.52:50052,10.0.0.53:50053"
    split = [float(x) for x in argv[argv.index("--tensor-split") + 1].split(",")]
    assert split == pytest.approx([1 / 3, 2 / 3], abs=0.01)
    assert argv[argv.index("--n-gpu-layers") + 1] == "all" and "--device" not in argv
    assert [w.worker for w in plan.workers] == ["10.0.0.52:50052", "10.0.0.53:50053"]
    assert plan.devices == ["rpc:10.0.0.52:50052#0", "rpc:10.0.0.53:50053#0"]


def test_without_workers_configured_a_spec_never_uses_them(make_config: Callable[..., ForgeConfig]) -> None:
    mc = make_config({"m": {"workers": "only"}}).models["m"]
    assert ModelSpec.from_config(mc).workers == "never"
    assert ModelSpec.from_config(mc, workers_configured=True).workers == "only"


def test_spread_with_no_usable_worker_is_unavailable_not_a_local_cpu_plan(gemma_path: Path) -> None:
    """`workers = "all"` with every worker down: no plan at all (an empty one would put the whole
    model on this machine's CPU, which a model bigger than the box is not meant to try)."""
    info = inspect_gguf(gemma_path)
    down = [WorkerReport("10.0.0.2:50052", "unreachable", detail="nothing answers")]
    with pytest.raises(WorkersUnavailable, match="no worker is usable"):
        plan_on_workers(info, down, ctx_size=2048, parallel=1, spread=True)
    with pytest.raises(WorkersUnavailable, match="no worker is usable"):
        plan_on_workers(info, [], ctx_size=2048, parallel=1, spread=True)


def test_a_worker_reported_twice_is_planned_once(gemma_path: Path) -> None:
    info = inspect_gguf(gemma_path)
    a = _worker(50052, 8)
    plan = plan_on_workers(info, [a, _worker(50053, 4), a], ctx_size=2048, parallel=1, spread=True)
    assert plan.addresses == ("10.0.0.52:50052", "10.0.0.53:50053")
    assert len(plan.tensor_split) == 2  # one value per device llama-server numbers
    assert sum(int(s["layers"]) for s in plan.shares()) == info.block_count


def test_a_nearly_full_device_gets_no_share_and_does_not_block_its_worker(gemma_path: Path) -> None:
    """A worker with two devices, one nearly full: the split gives that one 0 and uses the other."""
    info = inspect_gguf(gemma_path)
    addr = "10.0.0.3:50052"
    two = WorkerReport(
        addr,
        "ok",
        (
            WorkerDevice(addr, 0, addr, 64 * GIB, 8 * GIB),
            WorkerDevice(addr, 1, addr, 64 * GIB, 100 << 20),
        ),
    )
    plan = plan_on_workers(info, [two], ctx_size=2048, parallel=1)
    assert plan.addresses == (addr,)
    assert plan.tensor_split[1] == 0
