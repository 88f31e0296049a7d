"""Issue 37 item 10: a model's slots share one KV cache by default, so that one request can use the
whole context (`ctx_size = 4096, parallel = 4` refused a 1,500-token prompt: 1024 per slot).

The estimate, the child's command line and what the model says one request can use must agree:
these are the pure parts (decide → build_plan, the config's own arithmetic); the real child is in
tests/gateway/test_kv_unified_real.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rocmforge_supervisor._argv import kv_unified_in_args
from rocmforge_supervisor.config import ForgeConfig, ModelConfig
from rocmforge_supervisor.hardware import detect
from rocmforge_supervisor.models import inspect_gguf
from rocmforge_supervisor.supervisor.launch._launch import ModelSpec, ResolvedModel, build_plan, decide


@pytest.mark.parametrize(
    ("parallel", "kv_unified", "args", "unified"),
    [
        (4, None, (), True),  # forge's default with slots
        (None, None, (), True),  # llama-server's auto slots: forge passes --parallel 4, and -kvu
        (4, True, (), True),
        (4, False, (), False),  # the per-slot split, kept as an option
        (4, None, ("-no-kvu",), False),  # a user's own flag wins over the default
        (4, False, ("--kv-unified",), True),
    ],
)
def test_the_child_the_estimate_and_the_context_agree(
    tiny_gguf: Path,
    make_config: Callable[..., ForgeConfig],
    tmp_path: Path,
    parallel: int | None,
    kv_unified: bool | None,
    args: tuple[str, ...],
    unified: bool,
) -> None:
    spec = ModelSpec(
        path=str(tiny_gguf), ctx_size=4096, parallel=parallel, kv_unified=kv_unified, gpu="cpu", args=args
    )
    model = ResolvedModel(tiny_gguf, inspect_gguf(tiny_gguf))
    settings = make_config({}).settings
    inventory = detect(settings)
    decision = decide(spec, "m", model, inventory)
    plan = build_plan(
        spec,
        "m",
        model,
        decision,
        inventory,
        settings,
        binary=Path("llama-server"),
        log_path=tmp_path / "m.log",
        state_dir=tmp_path,
    )
    argv = plan.spec.args(8080, tmp_path / "key")
    est = decision.estimate
    assert est.kv_unified is unified and est.parallel == 4
    assert argv[argv.index("--parallel") + 1] == "4"
    # llama-server turns the unified cache off for an explicit --parallel: the child must be told
    assert bool(kv_unified_in_args(argv)) is unified
    assert est.ctx_per_request == (4096 if unified else 1024)
    assert est.to_json()["ctx_per_request"] == est.ctx_per_request
    mc = ModelConfig(path="x", ctx_size=4096, parallel=parallel, kv_unified=kv_unified, args=list(args))
    assert mc.unified_kv is unified and mc.context_per_request == est.ctx_per_request


def test_one_slot_gets_no_flag(
    tiny_gguf: Path, make_config: Callable[..., ForgeConfig], tmp_path: Path
) -> None:
    """With one slot there is nothing to share: no -kvu, and the whole context either way."""
    spec = ModelSpec(path=str(tiny_gguf), ctx_size=2048, parallel=1, gpu="cpu")
    model = ResolvedModel(tiny_gguf, inspect_gguf(tiny_gguf))
    settings = make_config({}).settings
    inventory = detect(settings)
    decision = decide(spec, "m", model, inventory)
    plan = build_plan(
        spec,
        "m",
        model,
        decision,
        inventory,
        settings,
        binary=Path("x"),
        log_path=tmp_path / "l",
        state_dir=tmp_path,
    )
    assert kv_unified_in_args(plan.spec.args(8080, tmp_path / "key")) is None
    assert decision.estimate.ctx_per_request == 2048


def test_shared_cache_holds_the_same_cells_for_full_attention(tiny_gguf: Path) -> None:
    """Without sliding-window layers a unified cache of ctx_size cells is as big as P slots of
    ctx_size / P: the default changes what one request may use, not the memory placement needs."""
    from rocmforge_supervisor.models import estimate_memory

    info = inspect_gguf(tiny_gguf)
    assert not any(info.swa_layers)
    split = estimate_memory(info, n_gpu_layers=0, ctx_size=4096, parallel=4, kv_unified=False)
    shared = estimate_memory(info, n_gpu_layers=0, ctx_size=4096, parallel=4, kv_unified=True)
    assert shared.kv_bytes == split.kv_bytes and shared.ctx_size == split.ctx_size == 4096


@pytest.mark.parametrize(
    ("kv_unified", "args", "added"),
    [(None, (), True), (False, (), False), (None, ("--cache-idle-slots",), False)],
)
def test_keep_context_keeps_idle_slots_in_the_shared_cache(
    tiny_gguf: Path,
    make_config: Callable[..., ForgeConfig],
    tmp_path: Path,
    kv_unified: bool | None,
    args: tuple[str, ...],
    added: bool,
) -> None:
    """With one shared cache llama-server moves an idle slot to its RAM prompt cache at the next
    task, out of a slot save's reach (a keep_context model kept one of two conversations): such a
    child gets --no-cache-idle-slots, unless the user's args choose."""
    spec = ModelSpec(
        path=str(tiny_gguf), ctx_size=2048, parallel=2, kv_unified=kv_unified, gpu="cpu", args=args
    )
    model = ResolvedModel(tiny_gguf, inspect_gguf(tiny_gguf))
    settings = make_config({}).settings
    inventory = detect(settings)
    decision = decide(spec, "m", model, inventory)
    plan = build_plan(
        spec,
        "m",
        model,
        decision,
        inventory,
        settings,
        binary=Path("x"),
        log_path=tmp_path / "l",
        state_dir=tmp_path,
        slot_save_dir=tmp_path / "slots",
    )
    assert ("--no-cache-idle-slots" in plan.spec.args(8080, tmp_path / "key")) is added
