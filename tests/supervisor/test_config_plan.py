"""The plan of a whole config (pure): where each model goes from the service's start, what it
unloads, which models cannot be loaded together and why, and for one that fits nowhere the
smallest changes that would make it fit — each checked by placing the changed model again."""

from __future__ import annotations

from dataclasses import replace

from rocmforge_supervisor.supervisor.placement._config_plan import PlanEntry, plan_config
from rocmforge_supervisor.supervisor.placement._fit_advice import fit_advice
from rocmforge_supervisor.supervisor.placement._placement import (
    PlacementPolicy,
    PlacementRequest,
    free_memory,
    place,
)
from rocmforge_supervisor.supervisor.placement._residency import GroupRule, Residency
from tests.models.conftest import LLAMA_8B, LLAMA_70B
from tests.supervisor.test_placement import one_7900xtx

INV = one_7900xtx()  # 23.5 GiB free


def _req(name: str, ctx: int | None = 65536, **kw: object) -> PlacementRequest:
    info = kw.pop("info", LLAMA_8B)
    return PlacementRequest(name=name, info=info, ctx_size=ctx, parallel=1, **kw)  # type: ignore[arg-type]


def _entries() -> list[PlanEntry]:
    return [
        PlanEntry("big", request=_req("big"), preload=True),
        PlanEntry("other", request=_req("other")),
        PlanEntry("small", request=_req("small", ctx=4096), residency=Residency(pinned=True)),
        PlanEntry("auto", request=_req("auto", ctx=None, ctx_min=2048)),
        PlanEntry("huge", request=_req("huge", ctx=8192, info=LLAMA_70B)),
        PlanEntry("gone", problem="hf:org/repo:Q4_K_M is not in the Hugging Face cache", hint="forge pull"),
    ]


def test_the_plan_of_a_config() -> None:
    policy = PlacementPolicy(groups={"g": GroupRule("g", frozenset({"big", "auto"}), max_loaded=1)})
    plan = plan_config(INV, _entries(), policy)
    rows = {m.name: m for m in plan.models}
    assert plan.start == ("big",) and rows["big"].state == "at start"
    assert rows["other"].state == "on request" and rows["other"].evict == ("big",)
    assert rows["small"].evict == ()  # fits beside big
    auto = rows["auto"]
    assert auto.context is not None and auto.evict == ("big",)  # its group, and all the room
    assert auto.estimate is not None and auto.estimate.ctx_size == auto.context.ctx_size
    assert rows["gone"].state == "not planned" and rows["gone"].hint == "forge pull"
    huge = rows["huge"]
    assert huge.state == "does not fit" and not huge.fits_alone and huge.error
    assert {a.key for a in huge.advice} >= {"gpu_layers", "path"}
    kinds = {(t.kind, t.models) for t in plan.together}
    assert ("group", ("big", "auto")) in kinds
    assert ("memory", ("big", "other")) in kinds  # 2 × 13 GiB on 23.5 GiB
    assert ("group", ("big", "auto")) in kinds and ("memory", ("big", "auto")) not in kinds  # said once
    body = plan.to_json()
    assert body["start_from"] == "start" and body["loaded"] == ["big"]
    assert [m["name"] for m in body["models"]] == ["big", "other", "small", "auto", "huge", "gone"]  # type: ignore[index]


def test_a_pinned_model_leaves_no_room_for_another() -> None:
    entries = [
        PlanEntry("kept", request=_req("kept", ctx=131072), residency=Residency(pinned=True)),
        PlanEntry("next", request=_req("next")),
    ]
    plan = plan_config(INV, entries, PlacementPolicy())
    (t,) = [t for t in plan.together if t.kind == "kept"]
    assert (
        t.models == ("next", "kept") and "next cannot load while kept (pinned) stays loaded by rule" in t.text
    )


def test_each_change_of_the_advice_makes_it_fit() -> None:
    """Every change the advice names, applied alone, fits: placed again with it."""
    request = _req("huge", ctx=32768, info=LLAMA_70B)
    policy = PlacementPolicy()
    free = free_memory(INV, [])
    advice = {a.key: a for a in fit_advice(INV, request, policy, free)}
    assert {"gpu_layers", "path"} <= set(advice) <= {"ctx_size", "args", "gpu_layers", "path"}
    if "ctx_size" in advice:
        place(INV, replace(request, ctx_size=int(advice["ctx_size"].value)), [])  # type: ignore[call-overload]
    place(INV, replace(request, n_gpu_layers=int(advice["gpu_layers"].value)), [])  # type: ignore[call-overload]
    ratio = int(advice["path"].value) / (  # type: ignore[call-overload]
        sum(LLAMA_70B.layer_bytes) + LLAMA_70B.input_bytes + LLAMA_70B.output_bytes
    )
    assert 0 < ratio < 0.6  # a 70B at Q4_K_M on a 24 GiB card: well under half its weights


def test_a_preload_that_a_later_one_unloads_is_planned_on_request() -> None:
    """At the start an ``auto`` preload takes the whole GPU; a never-swap preload after it needs
    room and unloads it: its row is then where its next request puts it, beside the one that stays."""
    entries = [
        PlanEntry("chat", request=_req("chat", ctx=None, ctx_min=2048), preload=True),
        PlanEntry(
            "embed", request=_req("embed", ctx=8192), residency=Residency(never_swap=True), preload=True
        ),
    ]
    rows = {m.name: m for m in plan_config(INV, entries, PlacementPolicy()).models}
    assert rows["embed"].state == "at start" and rows["embed"].evict == ("chat",)
    chat = rows["chat"]
    assert chat.state == "on request" and chat.note == "preloaded, then unloaded at the start by embed"
    assert chat.context is not None and chat.context.limit == "memory" and chat.evict == ()


def test_the_advice_is_for_a_load_beside_what_the_rules_keep() -> None:
    """A pinned preload never makes room: the layers that fit are counted beside it."""
    big = PlanEntry("big", request=_req("big", ctx=8192, info=LLAMA_70B))
    kept = PlanEntry("kept", request=_req("kept", ctx=32768), residency=Residency(pinned=True), preload=True)

    def layers(entries: list[PlanEntry]) -> int:
        row = next(m for m in plan_config(INV, entries, PlacementPolicy()).models if m.name == "big")
        assert row.state == "does not fit" and not row.fits_alone
        return int({a.key: a.value for a in row.advice}["gpu_layers"])  # type: ignore[call-overload]

    assert 0 < layers([kept, big]) < layers([big])
