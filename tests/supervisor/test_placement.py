"""Placement on the fixture machines: 1 × RX 7900 XTX, 780M iGPU + RX 7800 XT, 8 × MI300X, no GPU.

``place`` is pure, so the inventories are built by hand (the shapes the sysfs fixtures describe)
and every case is a plain call; a property test then checks the invariants over random loaded
sets and requests.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmforge_supervisor._errors import PlacementError
from rocmforge_supervisor.config import parse_gpu
from rocmforge_supervisor.hardware._types import Device, Inventory, KfdStatus
from rocmforge_supervisor.models import inspect_gguf
from rocmforge_supervisor.models._gguf import GGUFInfo
from rocmforge_supervisor.supervisor.placement._placement import (
    LoadedModel,
    PlacementDecision,
    PlacementPolicy,
    PlacementRequest,
    free_memory,
    place,
)
from tests.models.conftest import GIB, LLAMA_8B, LLAMA_70B, LLAMA_405B, MIB, model_like

KFD = KfdStatus(present=True, accessible=True)


def cpu(total_gib: float = 64, used_gib: float = 4) -> Device:
    return Device("cpu", 0, "AMD EPYC", int(total_gib * GIB), int(used_gib * GIB), cores=32)


def amd(index: int, name: str, total_gib: float, used_gib: float = 0.5, **kw: object) -> Device:
    return Device("amd", index, name, int(total_gib * GIB), int(used_gib * GIB), gfx_target="gfx1100", **kw)  # type: ignore[arg-type]


def one_7900xtx(used_gib: float = 0.5) -> Inventory:
    return Inventory((amd(0, "AMD Radeon RX 7900 XTX", 24, used_gib), cpu()), KFD)


def apu_and_7800xt(enable_igpu: bool = False) -> Inventory:
    igpu = amd(
        1,
        "AMD Radeon 780M Graphics",
        31.5,
        0.1,
        integrated=True,
        usable=enable_igpu,
        skip_reason=None
        if enable_igpu
        else "integrated GPU: excluded by default (set FORGE_ENABLE_IGPU=1 to use it)",
    )
    return Inventory((amd(0, "AMD Radeon RX 7800 XT", 16, 0.3), igpu, cpu(32, 2)), KFD)


def mi300x_8(used: dict[int, float] | None = None) -> Inventory:
    used = used or {}
    gpus = tuple(amd(i, "AMD Instinct MI300X", 192, used.get(i, 0.3)) for i in range(8))
    return Inventory((*gpus, cpu(1536, 20)), KFD)


def no_gpu(ram_gib: float = 32) -> Inventory:
    return Inventory((cpu(ram_gib, 2),), KfdStatus(present=False, accessible=False))


def req(info: GGUFInfo, name: str | None = None, **kw: object) -> PlacementRequest:
    kw.setdefault("ctx_size", 8192)
    kw.setdefault("parallel", 1)
    if "gpu" in kw:  # as config load, a --gpu flag or load_model(gpu=…) hand it over: parsed once
        kw["gpu"] = parse_gpu(kw["gpu"])
    return PlacementRequest(name=name or info.name or "model", info=info, **kw)  # type: ignore[arg-type]


def loaded(
    name: str, gib: float, device: str = "amd:0", *, last_used: float = 0.0, in_flight: int = 0
) -> LoadedModel:
    return LoadedModel(
        name=name,
        bytes_by_device={device: int(gib * GIB)},
        devices=(device,),
        in_flight=in_flight,
        last_used=last_used,
        counted=True,
    )


def with_used(inv: Inventory, extra: dict[str, float]) -> Inventory:
    """The inventory as discovery would report it with our children's memory in the counters."""
    devices = tuple(
        replace(d, vram_used_bytes=d.vram_used_bytes + int(extra.get(d.key, 0) * GIB)) for d in inv.devices
    )
    return replace(inv, devices=devices)


def assert_fits(
    inv: Inventory, decision: PlacementDecision, remaining: list[LoadedModel], evicted: list[LoadedModel]
) -> None:
    free = free_memory(inv, remaining, evicted)
    for dev, need in decision.need_bytes.items():
        assert need <= free[dev], (dev, need, free[dev])


# -- one RX 7900 XTX -------------------------------------------------------------------------------


def test_8b_on_one_gpu() -> None:
    d = place(one_7900xtx(), req(LLAMA_8B), [])
    assert d.devices == ("amd:0",) and d.n_gpu_layers == 33 and d.tensor_split is None and d.evict == []
    assert "one GPU" in d.reason and "RX 7900 XTX" in d.reason
    assert 5 * GIB < d.estimated_bytes["amd:0"] < 7 * GIB
    assert_fits(one_7900xtx(), d, [], [])


def test_70b_refused_with_need_free_and_advice() -> None:
    with pytest.raises(PlacementError) as err:
        place(one_7900xtx(), req(LLAMA_70B), [])
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("llama-3.1-70b (Q4_K_M, ctx 8192) does not fit: it needs 4")
    assert "on amd:0" in msg and "weights 3" in msg and "KV cache 2.5 GiB" in msg
    assert "amd:0 (AMD Radeon RX 7900 XTX) 23.5 GiB of 24.0 GiB" in msg
    hint = err.value.hint or ""
    assert "--n-gpu-layers" in hint and "a smaller quantization than Q4_K_M" in hint
    assert "--ctx-size" not in hint and "q8_0" not in hint  # neither would make it fit: not offered


def test_70b_partial_offload_when_allowed() -> None:
    d = place(one_7900xtx(), req(LLAMA_70B), [], PlacementPolicy(allow_partial_offload=True))
    assert d.devices == ("amd:0",) and 20 < d.n_gpu_layers < 81
    assert "partial offload" in d.reason
    assert d.estimate.device("cpu").layers == 81 - d.n_gpu_layers
    assert_fits(one_7900xtx(), d, [], [])
    # one more layer would not fit
    with pytest.raises(PlacementError):
        place(one_7900xtx(), req(LLAMA_70B, n_gpu_layers=d.n_gpu_layers + 1), [])


def test_long_context_refusal_suggests_a_context_that_fits() -> None:
    with pytest.raises(PlacementError) as err:
        place(apu_and_7800xt(), req(LLAMA_8B, ctx_size=131072), [])
    assert "ctx 131072" in str(err.value)
    assert "--ctx-size 65536" in (err.value.hint or "")
    assert "--cache-type-k q8_0 --cache-type-v q8_0" in (err.value.hint or "")


def test_explicit_layers_and_cpu() -> None:
    d = place(one_7900xtx(), req(LLAMA_8B, n_gpu_layers=10), [])
    assert d.n_gpu_layers == 10 and d.devices == ("amd:0",)
    assert d.estimate.device("amd:0").layers == 9  # 9 blocks + the output layer
    c = place(one_7900xtx(), req(LLAMA_8B, gpu="cpu"), [])
    assert c.devices == ("cpu",) and c.n_gpu_layers == 0 and c.on_cpu
    z = place(one_7900xtx(), req(LLAMA_8B, n_gpu_layers=0), [])
    assert z.on_cpu


def test_extra_args_change_the_size() -> None:
    base = place(
        one_7900xtx(), req(LLAMA_8B, ctx_size=None, parallel=None, extra_args=("-c", "4096", "-np", "2")), []
    )
    assert base.estimate.ctx_size == 4096 and base.estimate.parallel == 2
    q8 = place(
        one_7900xtx(), req(LLAMA_8B, extra_args=("--cache-type-k=q8_0", "-ctv", "q8_0", "-fa", "on")), []
    )
    assert q8.estimate.cache_type_k == "q8_0" and q8.estimate.kv_bytes < base.estimate.kv_bytes * 2


@pytest.mark.parametrize(
    "flags",
    [("--embeddings", "--pooling", "mean"), ("--embedding",), ("--pooling=cls",), ("--reranking",)],
)
def test_embeddings_flags_count_a_ubatch_of_logits_on_the_gpu(flags: tuple[str, ...]) -> None:
    """--embeddings (or a pooling) makes every token an output: the output layer's device (the GPU
    here) holds a ubatch of logits in its compute buffer, and placement must see it."""
    plain = place(one_7900xtx(), req(LLAMA_8B, extra_args=("-c", "4096")), [])
    emb = place(one_7900xtx(), req(LLAMA_8B, extra_args=("-c", "4096", *flags)), [])
    assert emb.estimate.embeddings and not plain.estimate.embeddings
    logits = 512 * LLAMA_8B.vocab_size * 4  # 250 MiB for a 128256-token vocabulary
    assert emb.estimate.device("amd:0").compute_bytes >= logits > plain.estimate.device("amd:0").compute_bytes
    assert emb.need_bytes["amd:0"] > plain.need_bytes["amd:0"] + logits // 2
    none = place(one_7900xtx(), req(LLAMA_8B, extra_args=("-c", "4096", "--pooling", "none")), [])
    assert not none.estimate.embeddings


def test_decide_counts_the_flags_of_embeddings_true() -> None:
    """``embeddings = true`` in forge.toml adds --embeddings --pooling mean at launch: decide()
    must estimate with them (the issue: 196 MiB estimated, 283 MiB allocated)."""
    from rocmforge_supervisor.supervisor.launch._launch import ModelSpec, ResolvedModel, decide

    model = ResolvedModel(Path("/models/llama-8b.gguf"), LLAMA_8B)
    plain = decide(ModelSpec(path="x", ctx_size=4096), "m", model, one_7900xtx())
    emb = decide(ModelSpec(path="x", ctx_size=4096, embeddings=True), "m", model, one_7900xtx())
    assert emb.estimate.embeddings and not plain.estimate.embeddings
    assert emb.estimate.compute_bytes >= 512 * LLAMA_8B.vocab_size * 4 > plain.estimate.compute_bytes


def test_unknown_gpu_refused() -> None:
    with pytest.raises(PlacementError) as err:
        place(one_7900xtx(), req(LLAMA_8B, gpu=7), [])
    assert "no GPU 7" in str(err.value) and "amd:0 (AMD Radeon RX 7900 XTX)" in str(err.value)
    with pytest.raises(PlacementError, match="no GPU 'nvidia:0'"):
        place(one_7900xtx(), req(LLAMA_8B, gpu="nvidia:0"), [])
    with pytest.raises(PlacementError, match="names a GPU twice"):
        place(mi300x_8(), req(LLAMA_8B, gpu=[1, "amd:1"]), [])


# -- 780M iGPU + RX 7800 XT ------------------------------------------------------------------------


def test_igpu_is_never_chosen_unless_enabled() -> None:
    d = place(apu_and_7800xt(), req(LLAMA_8B), [])
    assert d.devices == ("amd:0",)
    # 70B fits neither: the iGPU's 31.5 GiB of shared memory is not offered
    with pytest.raises(PlacementError) as err:
        place(apu_and_7800xt(), req(LLAMA_70B), [])
    assert "780M" not in str(err.value)
    with pytest.raises(PlacementError) as err:
        place(apu_and_7800xt(), req(LLAMA_8B, gpu=1), [])
    assert "780M" in str(err.value) and "FORGE_ENABLE_IGPU=1" in str(err.value)
    with pytest.raises(PlacementError, match="not usable"):
        place(apu_and_7800xt(), req(LLAMA_8B, gpu=[0, 1]), [])


def test_enabled_igpu_takes_what_the_dgpu_cannot() -> None:
    inv = apu_and_7800xt(enable_igpu=True)
    d = place(inv, req(LLAMA_8B, gpu="amd:1"), [])
    assert d.devices == ("amd:1",)
    # 8B fits the dGPU; a model the dGPU can't hold goes to the (bigger) iGPU in auto
    big = model_like(
        "qwen-32b",
        n_layer=64,
        layer_bytes=290 * MIB,
        embd_bytes=400 * MIB,
        n_embd=5120,
        n_head=40,
        n_head_kv=8,
    )
    auto = place(inv, req(big), [])
    assert auto.devices == ("amd:1",)


# -- 8 × MI300X ------------------------------------------------------------------------------------


def test_405b_splits_over_the_fewest_gpus() -> None:
    d = place(mi300x_8(), req(LLAMA_405B), [])
    assert d.devices == ("amd:0", "amd:1")
    assert d.tensor_split is not None and len(d.tensor_split) == 2
    assert d.tensor_split[0] == pytest.approx(0.5, abs=0.1)
    assert "split over 2 GPUs" in d.reason
    assert_fits(mi300x_8(), d, [], [])


def test_405b_f16_needs_five() -> None:
    f16 = replace(
        LLAMA_405B,
        name="llama-3.1-405b-f16",
        file_type="F16",
        layer_bytes=(6300 * MIB,) * 126,
        input_bytes=4000 * MIB,
        embedding_bytes=4000 * MIB,
        output_bytes=4000 * MIB,
    )
    d = place(mi300x_8(), req(f16), [])
    assert len(d.devices) == 5 and sum(d.tensor_split or []) == pytest.approx(1.0, abs=0.01)
    assert_fits(mi300x_8(), d, [], [])


def test_small_model_goes_to_the_gpu_with_most_free() -> None:
    inv = mi300x_8({0: 150, 1: 100, 2: 20, 3: 5, 4: 5, 5: 170, 6: 3, 7: 150})
    d = place(inv, req(LLAMA_70B), [])
    assert d.devices == ("amd:6",)


def test_busy_gpus_shape_the_split() -> None:
    inv = mi300x_8({0: 150, 1: 150, 2: 150, 3: 150})
    d = place(inv, req(LLAMA_405B), [])
    assert set(d.devices) <= {"amd:4", "amd:5", "amd:6", "amd:7"} and len(d.devices) == 2


def test_explicit_gpu_list() -> None:
    d = place(mi300x_8(), req(LLAMA_405B, gpu=[5, 2]), [])
    assert d.devices == ("amd:2", "amd:5")  # the child's order is ordinal order
    e = place(mi300x_8(), req(LLAMA_405B, gpu="2,5,6", tensor_split=(1.0, 1.0, 2.0)), [])
    assert e.devices == ("amd:2", "amd:5", "amd:6") and e.tensor_split == pytest.approx([0.25, 0.25, 0.5])
    with pytest.raises(PlacementError):
        place(mi300x_8(), req(LLAMA_405B, gpu=3), [])  # one MI300X can't hold 227 GiB
    # a listed set is used whole, even when fewer GPUs would do
    three = place(mi300x_8(), req(LLAMA_70B, gpu=[1, 2, 3]), [])
    assert three.devices == ("amd:1", "amd:2", "amd:3") and three.tensor_split is not None
    assert all(three.estimate.device(k).layers > 0 for k in three.devices)


def test_mixed_vendors_refused() -> None:
    nv = Device("nvidia", 0, "NVIDIA H100", 80 * GIB, 1 * GIB, compute_capability="9.0")
    inv = Inventory((amd(0, "AMD Instinct MI300X", 192), nv, cpu()), KFD)
    with pytest.raises(PlacementError, match="mixes vendors"):
        place(inv, req(LLAMA_8B, gpu=["amd:0", "nvidia:0"]), [])
    with pytest.raises(PlacementError, match="ambiguous"):
        place(inv, req(LLAMA_8B, gpu=0), [])
    assert place(inv, req(LLAMA_8B, gpu="nvidia:0"), []).devices == ("nvidia:0",)


# -- no GPU ----------------------------------------------------------------------------------------


def test_cpu_only_machine() -> None:
    d = place(no_gpu(), req(LLAMA_8B), [])
    assert d.devices == ("cpu",) and d.n_gpu_layers == 0 and d.reason == "on the CPU"
    with pytest.raises(PlacementError) as err:
        place(no_gpu(), req(LLAMA_70B), [])
    msg = str(err.value)
    assert "on system RAM" in msg and "cpu (AMD EPYC) 30.0 GiB of 32.0 GiB" in msg
    with pytest.raises(PlacementError, match="no GPU 0"):
        place(no_gpu(), req(LLAMA_8B, gpu=0), [])


def test_real_gemma_placed_on_this_machines_shape(gemma_path: Path) -> None:
    gemma = inspect_gguf(gemma_path)
    d = place(no_gpu(4), PlacementRequest(name="gemma-3-270m", info=gemma, ctx_size=4096, parallel=1), [])
    assert d.on_cpu and 250 * MIB < d.estimated_bytes["cpu"] < 350 * MIB


# -- eviction --------------------------------------------------------------------------------------


def _full_gpu() -> tuple[Inventory, list[LoadedModel]]:
    models = [
        loaded("a", 9, last_used=10.0),
        loaded("b", 9, last_used=5.0),
        loaded("busy", 5, last_used=1.0, in_flight=2),
    ]
    return with_used(one_7900xtx(), {"amd:0": 23}), models


def test_evicts_least_recently_used_idle_model() -> None:
    inv, models = _full_gpu()
    d = place(inv, req(LLAMA_8B), models)
    assert d.evict == ["b"] and d.devices == ("amd:0",)
    assert_fits(inv, d, [m for m in models if m.name != "b"], [m for m in models if m.name == "b"])


def test_evicts_several_in_lru_order_never_a_busy_one() -> None:
    inv, models = _full_gpu()
    mid = model_like(
        "mid", n_layer=40, layer_bytes=350 * MIB, embd_bytes=300 * MIB, n_embd=5120, n_head=40, n_head_kv=8
    )
    d = place(inv, req(mid), models)
    assert d.evict == ["b", "a"]
    with pytest.raises(PlacementError) as err:
        place(inv, req(LLAMA_70B), models)
    assert "busy, not evicted: busy" in str(err.value)


def test_no_eviction_when_the_policy_forbids_it() -> None:
    inv, models = _full_gpu()
    with pytest.raises(PlacementError, match="eviction is off"):
        place(inv, req(LLAMA_8B), models[:2], PlacementPolicy(allow_evict=False))


def test_evicts_only_what_the_layout_needs() -> None:
    """LRU would take x first (it is oldest) but freeing x does not make room; y alone does."""
    inv = with_used(
        Inventory((amd(0, "RX 7900 XTX", 24), amd(1, "RX 7900 XTX", 24), cpu()), KFD),
        {"amd:0": 23, "amd:1": 21},
    )
    models = [
        loaded("x", 2, "amd:1", last_used=1.0),
        loaded("z", 19, "amd:1", last_used=9.0, in_flight=1),
        loaded("y", 23, "amd:0", last_used=5.0),
    ]
    d = place(inv, req(LLAMA_8B), models)
    assert d.evict == ["y"] and d.devices == ("amd:0",)


def test_max_loaded_evicts_even_when_memory_fits() -> None:
    models = [loaded("a", 1, last_used=3.0), loaded("b", 1, last_used=1.0)]
    inv = with_used(one_7900xtx(), {"amd:0": 2})
    d = place(inv, req(LLAMA_8B), models, PlacementPolicy(max_loaded=2))
    assert d.evict == ["b"]
    busy = [replace(m, in_flight=1) for m in models]
    with pytest.raises(PlacementError, match="too few are idle"):
        place(inv, req(LLAMA_8B), busy, PlacementPolicy(max_loaded=2))


def test_reloading_the_same_name_does_not_count_itself() -> None:
    inv, models = _full_gpu()
    d = place(inv, req(LLAMA_8B, name="a"), models)
    assert "a" not in d.evict


# -- free memory: what our children hold but the counters don't show -------------------------------


def test_uncounted_child_memory_is_subtracted() -> None:
    inv = one_7900xtx(used_gib=0.5)
    loading = LoadedModel("loading", {"amd:0": 20 * GIB}, in_flight=1, counted=False)
    assert free_memory(inv, [loading])["amd:0"] == int(23.5 * GIB) - 20 * GIB
    half = replace(loading, visible_bytes={"amd:0": 12 * GIB})
    # 12 GiB of it already in the counters: only 8 GiB still to subtract
    assert free_memory(with_used(inv, {"amd:0": 12}), [half])["amd:0"] == int(11.5 * GIB) - 8 * GIB
    with pytest.raises(PlacementError):
        place(inv, req(LLAMA_8B), [loading])
    # never more than the total minus what our children hold, even if the counters lag
    counted_but_not_shown = replace(loading, counted=True)
    assert free_memory(inv, [counted_but_not_shown])["amd:0"] == 4 * GIB


def test_eviction_gives_back_what_the_counters_show() -> None:
    inv = with_used(one_7900xtx(), {"amd:0": 10})
    m = loaded("m", 10)
    assert free_memory(inv, [], [m])["amd:0"] == int(23.5 * GIB)


# -- invariants over random situations --------------------------------------------------------------

INVENTORIES = {"7900xtx": one_7900xtx(), "apu": apu_and_7800xt(), "mi300x": mi300x_8(), "cpu": no_gpu()}
MODELS = [LLAMA_8B, LLAMA_70B, LLAMA_405B]


@st.composite
def situations(draw: st.DrawFn) -> tuple[Inventory, PlacementRequest, list[LoadedModel], PlacementPolicy]:
    inv = INVENTORIES[draw(st.sampled_from(sorted(INVENTORIES)))]
    usable = [d for d in inv.devices if d.usable]
    models = []
    extra: dict[str, float] = {}
    for i in range(draw(st.integers(0, 5))):
        dev = draw(st.sampled_from(usable))
        gib = draw(st.floats(0.5, max(0.6, dev.vram_free_bytes / GIB / 2)))
        extra[dev.key] = extra.get(dev.key, 0) + gib
        models.append(
            loaded(
                f"m{i}",
                gib,
                dev.key,
                last_used=draw(st.floats(0, 100)),
                in_flight=draw(st.sampled_from([0, 0, 1])),
            )
        )
    inv = with_used(inv, extra)
    request = req(
        draw(st.sampled_from(MODELS)),
        name="new",
        ctx_size=draw(st.sampled_from([2048, 8192, 32768])),
        parallel=draw(st.sampled_from([1, 4])),
    )
    policy = PlacementPolicy(
        allow_evict=draw(st.booleans()),
        allow_partial_offload=draw(st.booleans()),
        max_loaded=draw(st.sampled_from([None, 3])),
    )
    return inv, request, models, policy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(situations())
def test_placement_invariants(
    case: tuple[Inventory, PlacementRequest, list[LoadedModel], PlacementPolicy],
) -> None:
    inv, request, models, policy = case
    try:
        d = place(inv, request, models, policy)
    except PlacementError as exc:
        assert "\n" not in str(exc) and exc.hint
        if policy.allow_evict and policy.max_loaded is None:
            # refused: then even with every idle model gone it does not fit
            idle = [m for m in models if m.in_flight == 0]
            busy = [m for m in models if m.in_flight]
            emptied = with_used(inv, {})
            for m in idle:
                emptied = with_used(emptied, {k: -v / GIB for k, v in m.bytes_by_device.items()})
            with pytest.raises(PlacementError):
                place(emptied, request, busy, replace(policy, allow_evict=False))
        return
    by_name = {m.name: m for m in models}
    evicted = [by_name[n] for n in d.evict]
    remaining = [m for m in models if m.name not in d.evict]
    assert all(m.in_flight == 0 for m in evicted), "a busy model was evicted"
    assert policy.allow_evict or not d.evict
    assert_fits(inv, d, remaining, evicted)
    usable = {dev.key for dev in inv.devices if dev.usable}
    assert set(d.devices) <= usable
    if inv.gpus:
        assert not d.on_cpu or request.gpu == "cpu"
    if len(d.devices) > 1:
        assert d.tensor_split is not None and len(d.tensor_split) == len(d.devices)
        assert len({inv.by_key(k).vendor for k in d.devices}) == 1
    # only as many evictions as needed: keeping any one of them back does not fit
    if policy.max_loaded is None:
        for m in evicted:
            others = [x for x in evicted if x is not m]
            after = with_used(inv, {})
            for x in others:
                after = with_used(after, {k: -v / GIB for k, v in x.bytes_by_device.items()})
            with pytest.raises(PlacementError):
                place(after, request, [*remaining, m], replace(policy, allow_evict=False))


# -- the committed sysfs fixture machines, as discovery reads them ----------------------------------


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("rx7900xtx", ("amd:0",)),
        ("apu780m_rx7800xt", ("amd:0",)),  # the 7800 XT; the 780M is excluded by default
        ("mi300x_8", ("amd:0",)),
        ("no_gpu", ("cpu",)),
    ],
)
def test_fixture_machines(machine: str, expected: tuple[str, ...]) -> None:
    from rocmforge_supervisor.hardware import detect
    from tests.hardware.conftest import FIXTURES, machine_settings

    inv = detect(machine_settings(FIXTURES / machine))
    # the CPU row reads this test machine's RAM: pin it so the result does not depend on it
    inv = replace(inv, devices=tuple(cpu(64, 4) if d.vendor == "cpu" else d for d in inv.devices))
    d = place(inv, req(LLAMA_8B), [])
    assert d.devices == expected
    if machine == "mi300x_8":
        assert place(inv, req(LLAMA_405B), []).devices == ("amd:0", "amd:1")
    if machine == "rx7900xtx":
        with pytest.raises(PlacementError, match="RX 7900 XTX"):
            place(inv, req(LLAMA_70B), [])
