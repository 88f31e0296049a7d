"""``ctx_size = "auto"``: the chooser (pure) and placement with it.

Over a table of (device free, KV layout unified/split, parallel 1/4, trained context), on a GPU
and on the CPU: the chosen context's estimate fits beside what stays loaded and the next step (256
tokens more per request) does not, unless the trained context capped it; a floor that does not fit
is refused with the numbers; the models that stay (pinned, never-swap, busy; all of them for the
warm default) count, the idle ones are unloaded for it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rocmforge_supervisor._errors import PlacementError, ResidencyConflict
from rocmforge_supervisor.config import ForgeConfig, ModelConfig, SupervisorConfig
from rocmforge_supervisor.hardware._types import Inventory
from rocmforge_supervisor.models import GGUFInfo, inspect_gguf
from rocmforge_supervisor.supervisor.launch._launch import ModelSpec, ResolvedModel, build_plan, decide
from rocmforge_supervisor.supervisor.placement._ctx_auto import CTX_STEP, choose_context, largest_fitting
from rocmforge_supervisor.supervisor.placement._placement import (
    LoadedModel,
    PlacementPolicy,
    PlacementRequest,
    free_memory,
    place,
)
from rocmforge_supervisor.supervisor.placement._residency import Residency
from tests.models.conftest import GIB, LLAMA_8B, MIB, model_like
from tests.supervisor.test_placement import KFD, amd, cpu, no_gpu, one_7900xtx

# -- the search itself -----------------------------------------------------------------------------


def test_largest_fitting_is_the_last_value_that_fits() -> None:
    for limit in (256, 257, 1000, 4096, 65535):
        assert largest_fitting(lambda n, limit=limit: n <= limit, 256, 131072) == limit // 256 * 256
    assert largest_fitting(lambda n: False, 256, 1024) is None
    assert largest_fitting(lambda n: True, 512, 512) == 512


@pytest.mark.parametrize("unified", [True, False])
@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("trained", [8192, 131072])
@pytest.mark.parametrize("free_mib", [300, 1000, 5000])
def test_a_linear_need_gets_exactly_the_most_that_fits(
    unified: bool, parallel: int, trained: int, free_mib: int
) -> None:
    """Need = 100 MiB + 64 KiB per token of the whole context (every slot's share together)."""

    def need(ctx_size: int) -> dict[str, int]:
        return {"cpu": 100 * MIB + ctx_size * 64 * 1024}

    free = {"cpu": free_mib * MIB}
    slots = 1 if unified else parallel
    most = (free_mib - 100) * MIB // (64 * 1024) // slots  # tokens per request the memory allows
    if min(most, trained) < 2048:
        with pytest.raises(PlacementError, match="for ctx_min = 2048"):
            choose_context(need, free, trained=trained, parallel=parallel, unified=unified)
        return
    c = choose_context(need, free, trained=trained, parallel=parallel, unified=unified)
    assert c.ctx_size == c.per_request * slots
    if most >= trained:
        assert (c.per_request, c.limit) == (trained, "trained")
    else:
        assert (c.per_request, c.limit) == (most // CTX_STEP * CTX_STEP, "memory")
        assert need((c.per_request + CTX_STEP) * slots)["cpu"] > free["cpu"]  # the next step does not
    assert need(c.ctx_size)["cpu"] <= free["cpu"]


def test_the_floor_is_the_trained_context_when_that_is_smaller() -> None:
    c = choose_context(lambda n: {"cpu": n}, {"cpu": 10**9}, trained=1000, ctx_min=2048)
    assert (c.per_request, c.ctx_min, c.limit) == (1000, 1000, "trained")
    with pytest.raises(
        PlacementError, match=r"needs 1000 MiB on cpu for ctx_min = 1000, and cpu has 999 MiB"
    ):
        choose_context(lambda n: {"cpu": n * MIB}, {"cpu": 999 * MIB}, trained=1000, ctx_min=2048)


# -- placement with auto ---------------------------------------------------------------------------

TINY_TRAINED = model_like(  # an 8B's shape with a short trained context: the cap binds
    "short-8b",
    n_layer=32,
    layer_bytes=124 * MIB,
    embd_bytes=282 * MIB,
    output_bytes=411 * MIB,
    n_embd=4096,
    n_head=32,
    n_head_kv=8,
    n_ff=14336,
    ctx=8192,
)


def _auto(
    info: GGUFInfo, *, parallel: int, unified: bool, ctx_min: int = 2048, **kw: object
) -> PlacementRequest:
    return PlacementRequest(
        name="m",
        info=info,
        ctx_min=ctx_min,
        parallel=parallel,
        kv_unified=unified,
        **kw,  # type: ignore[arg-type]
    )


def _gpu_inventory(free_gib: float) -> Inventory:
    return Inventory((amd(0, "AMD Radeon RX 7900 XTX", 24, 24 - free_gib), cpu()), KFD)


@pytest.mark.parametrize("unified", [True, False])
@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("info", [LLAMA_8B, TINY_TRAINED], ids=["trained-128k", "trained-8k"])
@pytest.mark.parametrize(
    "inventory",
    [_gpu_inventory(8), _gpu_inventory(12), _gpu_inventory(23.5), no_gpu(9), no_gpu(16)],
    ids=["gpu-8", "gpu-12", "gpu-23.5", "ram-9", "ram-16"],
)
def test_auto_fits_and_the_next_step_does_not(
    inventory: Inventory, info: GGUFInfo, parallel: int, unified: bool
) -> None:
    request = _auto(info, parallel=parallel, unified=unified)
    d = place(inventory, request, [])
    c = d.context
    assert c is not None and c.trained == info.context_length
    slots = 1 if unified else parallel
    assert d.estimate.ctx_size == c.ctx_size == c.per_request * slots
    assert d.estimate.ctx_per_request == c.per_request
    assert 2048 <= c.per_request <= (info.context_length or 0)
    free = free_memory(inventory, [])
    assert all(need <= free[k] for k, need in d.need_bytes.items()), (d.need_bytes, free)
    if c.limit == "trained":
        assert c.per_request == info.context_length
        return
    assert c.per_request % CTX_STEP == 0
    bigger = replace(request, ctx_min=None, ctx_size=(c.per_request + CTX_STEP) * slots)
    with pytest.raises(PlacementError):  # one step more does not fit these devices
        place(inventory, replace(bigger, gpu=d.devices[0] if d.devices != ("cpu",) else "cpu"), [])


def test_a_floor_that_does_not_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(PlacementError) as caught:
        place(no_gpu(4.5), _auto(LLAMA_8B, parallel=1, unified=True, ctx_min=8192), [])
    message = caught.value.message
    assert (
        message.startswith('m: ctx_size = "auto" needs ')
        and " on cpu for ctx_min = 8192, and cpu has " in message
    )
    assert "\n" not in message and "ctx_min" in (caught.value.hint or "")


def test_the_trained_context_caps_it_per_request() -> None:
    d = place(one_7900xtx(), _auto(TINY_TRAINED, parallel=4, unified=False), [])
    assert d.context is not None and d.context.limit == "trained"
    assert (d.context.per_request, d.context.ctx_size) == (8192, 4 * 8192)
    shared = place(one_7900xtx(), _auto(TINY_TRAINED, parallel=4, unified=True), [])
    assert shared.context is not None and (shared.context.per_request, shared.context.ctx_size) == (
        8192,
        8192,
    )


def _held(name: str, gib: float, **kw: object) -> LoadedModel:
    return LoadedModel(
        name=name,
        bytes_by_device={"amd:0": int(gib * GIB)},
        devices=("amd:0",),
        counted=True,
        **kw,  # type: ignore[arg-type]
    )


def _with_held(free_gib: float, *models: LoadedModel) -> Inventory:
    held = sum(m.bytes_by_device["amd:0"] for m in models) / GIB
    return _gpu_inventory(free_gib - held)


def test_idle_models_are_unloaded_for_it_and_those_that_stay_count() -> None:
    idle = _held("idle", 6, last_used=1.0)
    kept = _held("kept", 6, residency=Residency(pinned=True))
    busy = _held("busy", 6, in_flight=1)
    request = _auto(LLAMA_8B, parallel=1, unified=True)
    alone = place(_gpu_inventory(23.5), request, [])
    assert alone.context is not None
    for others in ([idle], [kept], [busy], [idle, kept]):
        d = place(_with_held(23.5, *others), request, others, PlacementPolicy(now=10.0))
        assert d.context is not None
        staying = [m for m in others if m.name != "idle"]
        assert d.evict == (["idle"] if idle in others else [])
        if staying:  # sized beside what stays: less than alone
            assert d.context.per_request < alone.context.per_request
            assert d.context.budget_bytes["amd:0"] < alone.context.budget_bytes["amd:0"]
        else:
            assert d.context.per_request == alone.context.per_request


def test_the_warm_default_sizes_itself_beside_every_loaded_model() -> None:
    idle = _held("idle", 6, last_used=1.0)
    request = _auto(LLAMA_8B, parallel=1, unified=True)
    d = place(_with_held(23.5, idle), request, [idle], PlacementPolicy(allow_evict=False))
    assert d.evict == [] and d.context is not None
    assert d.context.per_request < place(_gpu_inventory(23.5), request, []).context.per_request  # type: ignore[union-attr]


def test_only_a_pinned_model_in_the_way_is_the_rules_409() -> None:
    kept = _held("kept", 20, residency=Residency(pinned=True))
    with pytest.raises(ResidencyConflict, match="kept"):
        place(_with_held(23.5, kept), _auto(LLAMA_8B, parallel=1, unified=True), [kept])


def test_args_own_ctx_size_wins_over_auto() -> None:
    request = _auto(LLAMA_8B, parallel=1, unified=True, extra_args=("-c", "4096"))
    d = place(one_7900xtx(), request, [])
    assert d.context is None and d.estimate.ctx_size == 4096


# -- the config and the launch plan ------------------------------------------------------------------


def test_config_takes_auto_and_refuses_anything_else_in_one_line() -> None:
    assert ModelConfig(path="m.gguf", ctx_size="auto").ctx_size == "auto"  # type: ignore[arg-type]
    assert ModelConfig(path="m.gguf", ctx_size="AUTO ").ctx_size == "auto"  # type: ignore[arg-type]
    assert ModelConfig(path="m.gguf", ctx_size=4096).ctx_size == 4096
    with pytest.raises(ValueError, match=r'a number of tokens .* or "auto"') as caught:
        ModelConfig(path="m.gguf", ctx_size="big")  # type: ignore[arg-type]
    assert len(caught.value.errors()) == 1  # type: ignore[attr-defined]


def test_supervisor_default_and_ctx_min() -> None:
    sup = SupervisorConfig(ctx_size="auto", ctx_min=4096)  # type: ignore[arg-type]
    own = ModelConfig(path="m.gguf", ctx_size=8192)
    bare = ModelConfig(path="m.gguf")
    assert (sup.ctx_size_of(own), sup.ctx_size_of(bare), sup.ctx_min_of(bare)) == (8192, "auto", 4096)
    assert sup.ctx_min_of(ModelConfig(path="m.gguf", ctx_min=1024)) == 1024
    spec = ModelSpec.from_config(bare, defaults=sup)
    assert (spec.ctx_size, spec.ctx_min) == ("auto", 4096)
    with pytest.raises(ValueError, match='ctx_min applies only with ctx_size = "auto"'):
        ForgeConfig(models={"m": ModelConfig(path="m.gguf", ctx_size=4096, ctx_min=1024)})
    # ctx_min under a [supervisor] auto default is fine, and the default is part of the fingerprint
    a = ForgeConfig(supervisor=sup, models={"m": ModelConfig(path="m.gguf", ctx_min=1024)})
    b = ForgeConfig(models={"m": ModelConfig(path="m.gguf")})
    assert a.model_fingerprint("m") != b.model_fingerprint("m")
    with pytest.raises(ValueError, match="ctx_min does not apply"):
        ModelConfig(path="x.bin", backend="whisper", ctx_min=4096)


def test_the_child_gets_the_chosen_context(smollm2_path: Path, tmp_path: Path) -> None:
    """decide() → build_plan(): ``--ctx-size`` is the chosen one (the estimate's), and with a
    per-slot cache each slot gets its share."""
    from rocmforge_supervisor.config import ForgeSettings

    info = inspect_gguf(smollm2_path)
    spec = ModelSpec(path=str(smollm2_path), ctx_size="auto", parallel=2, kv_unified=False, ctx_min=1024)
    model = ResolvedModel(path=smollm2_path, info=info)
    small = Inventory((cpu(4, 4 - 1.3),), KFD)  # 1 GiB of the 1.3 free is the RAM reserve
    decision = decide(spec, "m", model, small)
    assert decision.context is not None and decision.context.limit == "memory"
    plan = build_plan(
        spec,
        "m",
        model,
        decision,
        small,
        ForgeSettings(state_dir=tmp_path),
        binary=Path("llama-server"),
        log_path=tmp_path / "m.log",
        state_dir=tmp_path,
    )
    assert plan.spec.ctx_size == decision.context.ctx_size == 2 * decision.context.per_request
    assert plan.spec.parallel == 2
