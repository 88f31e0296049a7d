"""The inputs and the output of placement: request, loaded models, policy, decision, free memory.

Kept apart from the planner so that the planner, the refusal text and :func:`~._placement.place`
can all use them without importing each other in a circle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..._argv import SIZE_FLAGS, kv_unified_in_args, normalise_flag, outputs_every_token
from ...config import GpuChoice
from ...hardware import Device, Inventory
from ...models import GGUFInfo, MemoryEstimate, ProjectorInfo
from ._ctx_auto import ContextChoice
from ._residency import GroupRule, Residency

__all__ = [
    "LoadedModel",
    "PlacementDecision",
    "PlacementPolicy",
    "PlacementRequest",
    "SizedRequest",
    "WorkerShare",
    "describe_device",
    "free_memory",
]

_GIB = 1024**3
_MIB = 1024**2


@dataclass(frozen=True)
class PlacementRequest:
    """What is to be loaded, and the load settings that decide its size."""

    name: str
    info: GGUFInfo
    ctx_size: int | None = None
    """None or 0: the trained context (what llama-server allocates without ``-c``)."""
    ctx_min: int | None = None
    """Set: ``ctx_size = "auto"``: placement chooses the context (the largest that fits beside
    what stays loaded, capped by the trained context), and at least this many tokens per request
    must fit (``ctx_size`` is then ignored). None: ``ctx_size`` as given."""
    parallel: int | None = None
    """Slots (``--parallel``); None: llama-server's auto (4)."""
    kv_unified: bool | None = None
    """One KV cache shared by the slots (``--kv-unified``); None: forge's default, yes."""
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: bool | None = None
    gpu: GpuChoice = "auto"
    """``"auto"``, ``"cpu"``, a GPU (ordinal ``1`` or key ``"amd:1"``) or a list of them."""
    n_gpu_layers: int | None = None
    """None: all layers (fewer only where the policy allows partial offload); explicit: exactly."""
    tensor_split: tuple[float, ...] | None = None
    """Explicit proportions for an explicit GPU list; otherwise by free memory."""
    n_ubatch: int = 512
    embeddings: bool = False
    """The child outputs every token (``--embeddings``, ``--pooling``): a ubatch of logits."""
    repack: bool = True
    """False with ``--no-repack`` (the self-test's AMX workaround): no CPU_REPACK copy of weights."""
    projector: ProjectorInfo | None = None
    """The model's multimodal projector (``--mmproj``): its weights and compute buffer count too."""
    projector_offload: bool | None = None
    """False: the projector stays in system RAM (``--no-mmproj-offload``)."""
    draft: GGUFInfo | None = None
    """A speculative-decoding draft model: its weights and KV cache count where it goes."""
    draft_on_gpu: bool = True
    """False (``draft_gpu = "cpu"``): the draft stays in system RAM."""
    adapter_bytes: int = 0
    """LoRA adapters' files: weights beside the layers they adapt (``[models.X.adapters.*]``)."""
    extra_args: tuple[str, ...] = ()
    """The child's extra llama-server arguments: the ones that change its size (``-c``, ``-np``,
    ``-ctk``, ``-ctv``, ``-fa``, ``-ub``, ``-ngl``, ``-ts``, ``--embeddings``, ``--pooling``) are
    read by :meth:`effective`."""

    def effective(self) -> PlacementRequest:
        """This request with the size-changing flags of ``extra_args`` applied (they win, as
        they come last on the child's command line)."""
        return _apply_args(self)


@dataclass(frozen=True)
class SizedRequest:
    """A model placed by a size it is given whole, not estimated layer by layer from a GGUF: a
    whisper model (its file plus whisper.cpp's state), a ``backend = "command"`` model (its
    ``memory``). It needs the same bytes on each device it goes to and has no layers to split or
    offload; everything else (evictions, the residency rules, the refusals) is placed as a
    :class:`PlacementRequest` is, by the same :func:`~._placement.place`."""

    name: str
    what: str
    """How a message names its kind: ``whisper model``, ``command model``."""
    gpu: GpuChoice = "auto"
    """As for any model; ``auto``: the GPU with the most free memory that holds it, else the CPU."""
    weights_bytes: int = 0
    compute_bytes: int = 0
    """Beside the weights (whisper.cpp's state): counted as the estimate's compute buffers."""
    gpu_layers: int = 0
    """The layers it reports once on a GPU (whisper's blocks; a command's are unknown: 0)."""
    flash_attn: bool = False
    one_device: bool = False
    """An explicit GPU list places it on the first GPU only (a whisper model loads whole on one);
    otherwise on every GPU of the list, with the same bytes on each."""
    size_note: str = ""
    """Where the size comes from, for the decision's reason and a refusal: ``its memory, as
    configured``."""
    advice: str = ""
    """What makes it smaller, for a refusal's hint."""

    @property
    def need_bytes(self) -> int:
        """Per device it is placed on: what must be free."""
        return self.weights_bytes + self.compute_bytes


@dataclass(frozen=True)
class LoadedModel:
    """A model we run (or are starting), as placement needs to know it."""

    name: str
    bytes_by_device: Mapping[str, int]
    """What it holds per device key: the child's logged actuals once ready, the estimate before."""
    devices: tuple[str, ...] = ()
    """The devices it was placed on (informational: the bytes above are what count)."""
    in_flight: int = 0
    last_used: float = 0.0
    """A monotonic timestamp of its last request's end (or of its load)."""
    counted: bool = True
    """Whether the inventory's used-memory counters already include everything it holds: true for
    a model that was ready before the inventory was read. Set False for one still loading (or an
    inventory read before it loaded): its bytes are then subtracted from the reported free memory.
    Either way free memory never exceeds the total minus everything our children hold."""
    visible_bytes: Mapping[str, int] = field(default_factory=dict)
    """When not ``counted``: per device, the part the counters already show."""
    residency: Residency = field(default_factory=Residency)
    """Its rules: pinned, never-swap, evict_cost, group (``_residency``)."""

    def held(self, device: str) -> int:
        return self.bytes_by_device.get(device, 0)

    def in_counters(self, device: str) -> int:
        held = self.held(device)
        return held if self.counted else min(held, self.visible_bytes.get(device, 0))


@dataclass(frozen=True)
class PlacementPolicy:
    allow_evict: bool = True
    allow_partial_offload: bool = False
    allow_cpu_fallback: bool = False
    """Run on the CPU when GPUs exist but the model fits none (slow: off unless asked)."""
    estimate_margin: float = 0.05
    """Extra fraction of the estimate to require free (the estimate is within ~10 %)."""
    gpu_reserve_bytes: int = 256 * _MIB
    """Left free on every GPU (driver, other users, fragmentation)."""
    cpu_reserve_bytes: int = 1 * _GIB
    """Left free in system RAM."""
    max_loaded: int | None = None
    """At most this many models loaded at once (the LRU idle one makes room)."""
    device_context: Mapping[str, int] = field(default_factory=dict)
    """GPU key → the per-process device context forge measured there (``_device_context``); a GPU
    not in it gets its backend's default (:data:`~..models.DEVICE_CONTEXT_BYTES`)."""
    groups: Mapping[str, GroupRule] = field(default_factory=dict)
    """``[groups.*]``: their max_loaded / exclusive rules apply to a member's load."""
    now: float | None = None
    """The monotonic time the eviction score measures idleness against; None: the latest
    ``last_used`` among the loaded models (a pure caller's stand-in for the clock)."""


@dataclass(frozen=True)
class WorkerShare:
    """One RPC worker device's part of a model (``forge ps``, ``/api/models``' ``workers``)."""

    worker: str
    """The worker's ``HOST:PORT``."""
    device: int
    """The device's index on that worker."""
    share: float
    layers: int
    estimated_bytes: int

    def to_json(self) -> dict[str, object]:
        return {
            "worker": self.worker,
            "device": self.device,
            "share": self.share,
            "layers": self.layers,
            "estimated_bytes": self.estimated_bytes,
        }


@dataclass(frozen=True)
class PlacementDecision:
    devices: tuple[str, ...]
    """GPU keys in the child's device order, or ``("cpu",)``."""
    n_gpu_layers: int
    tensor_split: list[float] | None
    evict: list[str]
    """Loaded models to unload, in this order, before spawning."""
    estimate: MemoryEstimate
    need_bytes: dict[str, int]
    """Per device: what must be free before the spawn (estimate plus margin plus reserve)."""
    reason: str
    workers: tuple[WorkerShare, ...] = ()
    """Set when every layer goes to RPC workers (``devices`` are then their devices' keys)."""
    evict_rules: Mapping[str, str] = field(default_factory=dict)
    """Per model in ``evict``: the rule that chose it (the ``evict`` event names it)."""
    context: ContextChoice | None = None
    """``ctx_size = "auto"``: the context placement chose (the estimate is at it)."""

    @property
    def on_cpu(self) -> bool:
        return self.devices == ("cpu",)

    @property
    def rpc_servers(self) -> tuple[str, ...]:
        """``--rpc``'s list, in the order llama-server numbers the devices."""
        return tuple(dict.fromkeys(w.worker for w in self.workers))

    @property
    def estimated_bytes(self) -> dict[str, int]:
        """The estimate's total per device key (what the child is expected to hold)."""
        return {k: v for k, v in self.estimate.by_device.items() if v > 0}

    def to_json(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": self.tensor_split,
            "evict": list(self.evict),
            "need_bytes": dict(self.need_bytes),
            "reason": self.reason,
            "estimate": self.estimate.to_json(),
            "workers": [w.to_json() for w in self.workers],
            **({"context": self.context.to_json()} if self.context is not None else {}),
        }


def _apply_args(request: PlacementRequest) -> PlacementRequest:
    changes: dict[str, object] = {}
    args = list(request.extra_args)
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        name = SIZE_FLAGS.get(flag)
        if name is None:
            continue
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        try:
            if name in ("ctx_size", "parallel", "n_ubatch"):
                changes[name] = int(value)
            elif name == "n_gpu_layers":
                changes[name] = None if value in ("auto", "all") else int(value)
            elif name == "flash_attn":
                changes[name] = {"on": True, "off": False}.get(value.lower())
            elif name == "tensor_split":
                changes[name] = tuple(float(x) for x in value.replace("/", ",").split(",") if x)
            else:
                changes[name] = value.lower()
        except ValueError:
            continue  # llama-server will refuse it itself, with its own message
    if "ctx_size" in changes:
        changes["ctx_min"] = None  # args' own -c wins over ctx_size = "auto", as over any ctx_size
    if outputs_every_token(args):
        changes["embeddings"] = True
    unified = kv_unified_in_args(args)
    if unified is not None:
        changes["kv_unified"] = unified
    if any(normalise_flag(a) in ("-nr", "--no-repack") for a in args):
        changes["repack"] = False
    return replace(request, **changes) if changes else request  # type: ignore[arg-type]


# -- free memory -----------------------------------------------------------------------------------


def free_memory(
    inventory: Inventory, loaded: Sequence[LoadedModel], evicted: Sequence[LoadedModel] = ()
) -> dict[str, int]:
    """Free bytes per device key (usable devices only), as if ``evicted`` were already gone."""
    out: dict[str, int] = {}
    for dev in inventory.devices:
        if not dev.usable:
            continue
        k = dev.key
        pending = sum(m.held(k) - m.in_counters(k) for m in loaded)
        released = sum(m.in_counters(k) for m in evicted)
        held = sum(m.held(k) for m in loaded)
        free = dev.vram_total_bytes - dev.vram_used_bytes - pending + released
        out[k] = max(0, min(free, dev.vram_total_bytes - held))
    return out


def describe_device(dev: Device) -> str:
    return f"{dev.key} ({dev.name})"
