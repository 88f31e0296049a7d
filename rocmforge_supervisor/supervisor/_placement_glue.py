"""From a load request to a placement decision: the bridge between callers and the pure placer.

Placement itself (``_placement.place``) is a pure function of (inventory, request, loaded set).
This module builds those inputs from a model's GGUF metadata, its load options and what the
supervisor has running, and turns the answer into what the spawn needs: the devices, the layer
count, the split, and the context/slot numbers the estimate assumed (passed to the child, so that
llama-server's own ``--fit`` does not silently pick other ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..hardware import Inventory
from ..settings import ForgeSettings
from ._placement import LoadedModel, PlacementPolicy, PlacementRequest, place

__all__ = [
    "CHILD_VERBOSITY",
    "DeviceDecision",
    "decide_devices",
    "decide_for_service",
    "embedding_args",
    "free_by_device",
    "new_allocation_tracker",
]

#: llama-server prints its per-device buffer sizes (what it really allocated) only at -lv 4.
CHILD_VERBOSITY = 4


@dataclass
class DeviceDecision:
    devices: list[str]
    n_gpu_layers: int | str | None = None
    tensor_split: list[float] | None = None
    evict: list[str] = field(default_factory=list)
    estimate: Any = None
    estimated_bytes: dict[str, int] = field(default_factory=dict)
    need_bytes: dict[str, int] = field(default_factory=dict)
    ctx_size: int | None = None
    parallel: int | None = None
    reason: str = ""


def _gpu_request(gpu: Any) -> Any:
    if isinstance(gpu, str):
        g = gpu.strip().lower()
        if g.isdigit():
            return int(g)
        return g
    if isinstance(gpu, (list, tuple)):
        return list(gpu)
    return gpu


def _ngl(value: Any) -> int | None:
    """llama-server's spellings → the placer's: None = all layers where they fit."""
    if value is None or value in ("auto", "all"):
        return None
    return int(value)


def decide_devices(
    info: Any,
    options: Any,
    inventory: Inventory,
    settings: ForgeSettings,
    loaded: Iterable[LoadedModel] = (),
    *,
    name: str = "",
    allow_evict: bool = False,
) -> DeviceDecision:
    request = PlacementRequest(
        name=name or "model",
        info=info,
        gpu=_gpu_request(getattr(options, "gpu", "auto")),
        ctx_size=getattr(options, "ctx_size", None),
        parallel=getattr(options, "parallel", None),
        n_gpu_layers=_ngl(getattr(options, "n_gpu_layers", None)),
        extra_args=tuple(getattr(options, "args", ()) or ()),
    )
    decision = place(inventory, request, list(loaded), PlacementPolicy(allow_evict=allow_evict))
    est = decision.estimate
    return DeviceDecision(
        devices=list(decision.devices),
        n_gpu_layers=None if decision.on_cpu else decision.n_gpu_layers,
        tensor_split=list(decision.tensor_split) if decision.tensor_split else None,
        evict=list(decision.evict),
        estimate=est,
        estimated_bytes=dict(decision.estimated_bytes),
        need_bytes=dict(decision.need_bytes),
        ctx_size=getattr(est, "ctx_size", None),
        parallel=getattr(est, "parallel", None),
        reason=decision.reason,
    )


def decide_for_service(
    model: Any, info: Any, inventory: Inventory, settings: ForgeSettings, models: Iterable[Any]
) -> DeviceDecision:
    """Placement for a supervised model, counting what the other running models hold."""
    loaded = []
    for other in models:
        if other is model or other.prepared is None or not other.running:
            continue
        held = dict(other.prepared.estimated_bytes)
        actual = other.prepared.actual
        ready = other.state == "ready"
        if actual and ready:
            held = {**held, **actual.device_totals()}
        loaded.append(
            LoadedModel(
                name=other.name,
                devices=tuple(other.prepared.devices),
                bytes_by_device=held,
                # A model still loading is busy: never evicted, and not yet in the counters.
                in_flight=other.in_flight + other.waiting + (0 if ready else 1),
                last_used=other.last_used,
                counted=ready,
            )
        )

    class _Opts:
        gpu = getattr(model.config, "gpu", "auto")
        ctx_size = getattr(model.config, "ctx_size", None)
        parallel = getattr(model.config, "parallel", None)
        n_gpu_layers = getattr(model.config, "gpu_layers", None)
        args = getattr(model.config, "args", ())

    return decide_devices(info, _Opts(), inventory, settings, loaded, name=model.name, allow_evict=True)


def free_by_device(inventory: Inventory) -> Mapping[str, int]:
    return {d.key: d.vram_free_bytes for d in inventory.devices if d.usable}


def new_allocation_tracker(devices: Iterable[str] = ()) -> Any:
    """A ledger fed with every log line of the child: what it really allocated, per device.

    ``devices`` maps the child's own names (ROCm0, CUDA0: its *visible* devices, after the mask)
    back to our keys.
    """
    from ..models._allocations import AllocationLedger

    gpus = [d for d in devices if d != "cpu"]
    return AllocationLedger(gpu_keys=gpus or None)


#: Architectures whose GGUF names its own pooling (embedding models): forge leaves it alone.
_POOLED_ARCHITECTURES = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "modern-bert", "neo-bert",
     "t5encoder", "gemma-embedding"}
)  # fmt: skip


def embedding_args(model_config: Any, user_args: Sequence[str], architecture: str = "") -> list[str]:
    """``embeddings = true``: what llama-server needs for OpenAI-shaped ``/v1/embeddings`` at the
    pinned commit: ``--embeddings``, and a pooled vector. A chat model's default pooling is
    ``none`` (answered 400 "Pooling type 'none' is not OAI compatible"), so ``--pooling mean``;
    an embedding model's GGUF carries its own (cls, mean, last), which is kept."""
    if not getattr(model_config, "embeddings", False):
        return []
    flags = {a.split("=", 1)[0] for a in user_args}
    out = [] if flags & {"--embeddings", "--embedding"} else ["--embeddings"]
    if "--pooling" not in flags and architecture not in _POOLED_ARCHITECTURES:
        out += ["--pooling", "mean"]
    return out
