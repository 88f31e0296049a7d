"""The launch pipeline, written once: model spec → resolve, inspect → place → launch plan → child.

``load_model`` (one model in this process) and the :class:`~._supervisor.Supervisor` (many, under
``forge serve``) both go through these three steps; the supervisor only adds what sits between
placing and launching (unloading the models placement chose to evict, waiting for their memory):

1. :func:`resolve` — the model reference to a GGUF file, inspected (a bad file is refused before
   any spawn). Blocking: may download (``hf:``) and reads the file.
2. :func:`decide` — the pure placement decision (:func:`~._placement.place`).
   With ``[[workers]]``, :func:`decide_on_workers` is this step for a model that goes to llama.cpp
   RPC workers (``workers = "only"``/``"all"``, or ``"auto"`` when it does not fit here): pure
   too, from what the workers reported (the supervisor probes them; :mod:`._remote` plans).
3. :func:`build_plan` — the device mask, the chat-template fallback, the tensor split, the
   allocation ledger and the :class:`~..process.InstanceSpec`: a :class:`LaunchPlan`.

The context and slot count the estimate assumed go to the child, so that llama-server's own
``--fit`` cannot pick other ones and the estimate and the child agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ..._argv import (
    embedding_args,
    fallback_chat_template_args,
    kv_unified_in_args,
    lora_args,
    mmproj_args,
    normalise_flag,
    outputs_every_token,
    rerank_args,
    resolve_kv_unified,
    rpc_args,
    speculative_args,
)
from ...config import (
    CtxSize,
    ForgeSettings,
    GpuChoice,
    GpuLayers,
    ModelConfig,
    SupervisorConfig,
    gpu_layers_for_placement,
)
from ...config._speculative import spec_types
from ...hardware import Inventory, WorkerReport, child_env, cpu_flags
from ...models import (
    REQUIRED_VERBOSITY,
    AllocationLedger,
    GGUFInfo,
    MemoryEstimate,
    ProjectorInfo,
    check_adapter,
    check_draft_vocab,
    declares_spec_type,
    inspect_gguf,
    inspect_projector,
    resolve_hf_file,
    resolve_model_path,
    resolve_projector_path,
)
from ...models._catalog import default_args
from ...process import InstanceSpec
from ..placement._ctx_auto import DEFAULT_CTX_MIN, choose_context, context_floor, slots_of
from ..placement._placement import LoadedModel, PlacementDecision, PlacementPolicy, PlacementRequest, place
from ..placement._placement_types import WorkerShare
from ..placement._remote import RemotePlan, WorkersUnavailable, plan_on_workers
from ..placement._residency import GroupRule

__all__ = [
    "LaunchPlan",
    "ModelSpec",
    "ResolvedDraft",
    "ResolvedModel",
    "WorkerMode",
    "build_plan",
    "decide",
    "decide_on_workers",
    "placement_request",
    "resolve",
]

#: ``[models.NAME] workers``: ``never`` (also whenever no ``[[workers]]`` are configured), ``auto``
#: (workers only when it does not fit here), ``only`` (the fewest workers), ``all`` (every one).
WorkerMode = Literal["auto", "never", "only", "all"]


@dataclass(frozen=True)
class ModelSpec:
    """What the user asked for, named the llama-server way: the one shape of "run this model"."""

    path: str
    """A GGUF path, an embedded default's name or ``hf:org/repo:QUANT``."""
    ctx_size: CtxSize = None
    """Tokens of context; ``"auto"``: the largest that fits where it is placed (chosen at load)."""
    ctx_min: int = DEFAULT_CTX_MIN
    """With ``ctx_size = "auto"``: the fewest tokens per request; below it the load is refused."""
    n_gpu_layers: GpuLayers = None
    parallel: int | None = None
    kv_unified: bool | None = None
    """One KV cache shared by the slots (``--kv-unified``); None: forge's default, yes."""
    gpu: GpuChoice = "auto"
    args: tuple[str, ...] = ()
    embeddings: bool = False
    workers: WorkerMode = "never"
    sleep_idle: int | None = None
    """``--sleep-idle-seconds``: the child frees the model after this many idle seconds."""
    mmproj: str | None = None
    """A multimodal projector: a path, ``hf:org/repo:FILE`` or ``auto`` (beside the model)."""
    mmproj_offload: bool | None = None
    """None: the projector on the GPU when the model is on one (llama-server's default), else RAM."""
    draft: str | None = None
    """A speculative-decoding draft model (a path, an embedded name or ``hf:``)."""
    draft_max: int | None = None
    draft_min: int | None = None
    draft_gpu: Literal["auto", "cpu"] = "auto"
    speculative: tuple[str, ...] = ()
    """``--spec-type`` values; empty: ``draft-simple`` with a draft, else none."""
    rerank: bool = False
    adapters: tuple[str, ...] = ()
    """LoRA adapter files (a path or ``hf:``), in the order requests name them by id."""

    @classmethod
    def from_config(
        cls, mc: ModelConfig, *, workers_configured: bool = False, defaults: SupervisorConfig | None = None
    ) -> ModelSpec:
        """``defaults``: the ``[supervisor]`` section whose ``ctx_size``/``ctx_min`` a model that
        sets none takes."""
        return cls(
            workers=mc.workers if workers_configured else "never",
            path=mc.path,
            ctx_size=defaults.ctx_size_of(mc) if defaults is not None else mc.ctx_size,
            ctx_min=defaults.ctx_min_of(mc) if defaults is not None else (mc.ctx_min or DEFAULT_CTX_MIN),
            n_gpu_layers=mc.gpu_layers,
            parallel=mc.parallel,
            kv_unified=mc.kv_unified,
            gpu=mc.gpu,
            args=tuple(mc.args),
            embeddings=mc.embeddings,
            sleep_idle=mc.sleep_idle,
            mmproj=mc.mmproj,
            mmproj_offload=mc.mmproj_offload,
            draft=mc.draft,
            draft_max=mc.draft_max,
            draft_min=mc.draft_min,
            draft_gpu=mc.draft_gpu,
            speculative=tuple(spec_types(mc.speculative)),
            rerank=mc.rerank,
            adapters=tuple(a.path for a in mc.adapters.values()),
        )


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    info: GGUFInfo
    projector: ProjectorInfo | None = None
    draft: ResolvedDraft | None = None
    adapters: tuple[Path, ...] = ()
    """LoRA adapters, checked against the model (their files count as weights)."""

    @property
    def adapter_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.adapters)


@dataclass(frozen=True)
class ResolvedDraft:
    """A speculative-decoding draft model, checked against its model's vocabulary."""

    path: Path
    info: GGUFInfo
    declares_type: bool = False
    """Its GGUF names its own speculative type (an MTP head, DFlash): forge names none."""


@dataclass
class LaunchPlan:
    """Everything decided before the spawn (``forge load`` prints it; the supervisor keeps it)."""

    spec: InstanceSpec
    decision: PlacementDecision
    model_path: Path
    info: GGUFInfo
    actual: AllocationLedger
    """What the child really allocated, per device, fed by its log lines."""
    slot_save_dir: Path | None = None
    """``keep_context``: the child's ``--slot-save-path`` (its saved slots); None: not kept."""
    projector: ProjectorInfo | None = None
    """The model's ``--mmproj`` projector, when it has one."""

    @property
    def devices(self) -> list[str]:
        return list(self.decision.devices)

    @property
    def estimate(self) -> MemoryEstimate:
        return self.decision.estimate

    @property
    def estimated_bytes(self) -> dict[str, int]:
        return self.decision.estimated_bytes

    @property
    def context_bytes(self) -> dict[str, int]:
        """GPU key → the backend's per-process device context counted for this child."""
        return {d.device: d.context_bytes for d in self.estimate.devices if d.context_bytes > 0}

    def held_bytes(self) -> dict[str, int]:
        """Per device, what the child holds once ready: its logged allocations plus, on a GPU, the
        device context (no log line reports it); the estimate where the log said nothing."""
        held = dict(self.estimated_bytes)
        for key, n in self.actual.device_totals().items():
            held[key] = n + self.estimate.device(key).context_bytes
        return held

    @property
    def workers(self) -> list[WorkerShare]:
        """The RPC workers' shares when the layers went there; else empty."""
        return list(self.decision.workers)


def resolve(spec: ModelSpec, settings: ForgeSettings) -> ResolvedModel:
    """Step 1 (blocking). A bad magic, a truncated file or a wrong version is refused here, and
    so is an ``mmproj`` that is missing or not a projector."""
    path = resolve_model_path(spec.path, settings)
    info = inspect_gguf(path)
    projector = None
    if spec.mmproj:
        projector = inspect_projector(resolve_projector_path(spec.mmproj, spec.path, path, settings))
    return ResolvedModel(
        path=path,
        info=info,
        projector=projector,
        draft=_resolve_draft(spec, path, settings),
        adapters=_resolve_adapters(spec, path, settings),
    )


def _resolve_adapters(spec: ModelSpec, model_path: Path, settings: ForgeSettings) -> tuple[Path, ...]:
    """The LoRA files, each refused (``ConfigError``) when it does not fit the model: llama-server
    would not start with it (a local one is also checked by ``forge serve --check-config``)."""
    out = []
    for ref in spec.adapters:
        # hf:org/repo:FILE names one file of the repo (an adapter is no model to pick a quant of)
        path = (
            resolve_hf_file(ref[3:], settings) if ref.startswith("hf:") else resolve_model_path(ref, settings)
        )
        check_adapter(model_path, path, key=f"adapter {ref}")
        out.append(path)
    return tuple(out)


def _resolve_draft(spec: ModelSpec, model_path: Path, settings: ForgeSettings) -> ResolvedDraft | None:
    """The draft, refused (``ConfigError``) when its vocabulary is not the model's: an ``hf:``
    draft is only known here, after its download (a local one is also checked by
    ``forge serve --check-config``)."""
    if spec.draft is None:
        return None
    path = resolve_model_path(spec.draft, settings)
    check_draft_vocab(model_path, path)
    return ResolvedDraft(path, inspect_gguf(path), declares_spec_type(path))


def placement_request(
    spec: ModelSpec, name: str, model: ResolvedModel, binary_args: Sequence[str] = ()
) -> PlacementRequest:
    """What placement sizes: the model, its load settings, and every flag the child gets that
    changes its size. ``binary_args``: the flags every child of the binary gets (the self-test's
    ``--no-repack``)."""
    return PlacementRequest(
        name=name,
        info=model.info,
        gpu=spec.gpu,
        ctx_size=None if spec.ctx_size == "auto" else spec.ctx_size,
        ctx_min=spec.ctx_min if spec.ctx_size == "auto" else None,
        parallel=spec.parallel,
        kv_unified=spec.kv_unified,
        n_gpu_layers=gpu_layers_for_placement(spec.n_gpu_layers),
        # The flags build_plan adds for ``embeddings = true`` change the size too.
        extra_args=(
            *embedding_args(spec.embeddings, spec.args, str(model.info.architecture)),
            *rerank_args(spec.rerank),
            *binary_args,
            *spec.args,
        ),
        projector=model.projector,
        projector_offload=spec.mmproj_offload,
        draft=model.draft.info if model.draft is not None else None,
        draft_on_gpu=spec.draft_gpu != "cpu",
        adapter_bytes=model.adapter_bytes,
    )


def decide(
    spec: ModelSpec,
    name: str,
    model: ResolvedModel,
    inventory: Inventory,
    loaded: Sequence[LoadedModel] = (),
    *,
    allow_evict: bool = False,
    binary_args: Sequence[str] = (),
    device_context: Mapping[str, int] | None = None,
    groups: Mapping[str, GroupRule] | None = None,
    now: float | None = None,
) -> PlacementDecision:
    """Step 2 (pure): where it goes, and which idle models must make room. ``binary_args``: the
    flags every child of the binary gets (the self-test's ``--no-repack``): they change its size.
    ``device_context``: the per-process device context measured per GPU key (``_device_context``).
    The supervisor places through :func:`~._evicting.place_here` with the same request."""
    policy = PlacementPolicy(
        allow_evict=allow_evict, device_context=dict(device_context or {}), groups=dict(groups or {}), now=now
    )
    return place(inventory, placement_request(spec, name, model, binary_args), loaded, policy)


def decide_on_workers(
    spec: ModelSpec,
    name: str,
    model: ResolvedModel,
    reports: Sequence[WorkerReport],
    held: Collection[str] = (),
) -> PlacementDecision:
    """Step 2 for RPC workers (pure): every layer on the fewest usable workers (``all``: on each),
    split by their free memory. ``held``: workers another model uses (one client per worker).
    Raises :class:`~._remote.WorkersUnavailable` (retryable) when they cannot hold it now."""
    unified = resolve_kv_unified(spec.kv_unified, spec.args)

    def plan(ctx_size: int | None) -> RemotePlan:
        return plan_on_workers(
            model.info,
            reports,
            ctx_size=ctx_size,
            parallel=spec.parallel,
            kv_unified=unified,
            held=held,
            name=name,
            spread=spec.workers == "all",
            embeddings=spec.embeddings or spec.rerank or outputs_every_token(spec.args),
            draft=model.draft.info if model.draft is not None else None,
            draft_on_gpu=spec.draft_gpu != "cpu",
        )

    if spec.ctx_size != "auto":
        return plan(spec.ctx_size).as_decision()
    # ``auto`` on workers: the largest context the workers' free memory takes (their own check).
    parallel = spec.parallel or 4
    plan(context_floor(spec.ctx_min, model.info.context_length) * slots_of(parallel, unified))  # or retried

    def fits(ctx_size: int) -> dict[str, int] | None:
        try:
            plan(ctx_size)
        except WorkersUnavailable:
            return None
        return {}

    choice = choose_context(
        fits, {}, trained=model.info.context_length, ctx_min=spec.ctx_min, parallel=parallel, unified=unified
    )
    return replace(plan(choice.ctx_size).as_decision(), context=choice)


def _names_flag(args: Sequence[str], name: str) -> bool:
    """Whether ``args`` set ``--NAME`` or ``--no-NAME`` themselves (then forge adds neither)."""
    flags = {normalise_flag(a) for a in args}
    return f"--{name}" in flags or f"--no-{name}" in flags


def build_plan(
    spec: ModelSpec,
    name: str,
    model: ResolvedModel,
    decision: PlacementDecision,
    inventory: Inventory,
    settings: ForgeSettings,
    *,
    binary: Path,
    binary_args: Sequence[str] = (),
    log_path: Path,
    state_dir: Path,
    port: int | None = None,
    api_key: str | None = None,
    stall_timeout: float = 300.0,
    ready_timeout: float | None = None,
    stop_timeout: float = 10.0,
    verbosity: int | None = None,
    line_listeners: Sequence[Callable[[str], object]] = (),
    slot_save_dir: Path | None = None,
) -> LaunchPlan:
    """Step 3: the child's mask, flags and ledger, from a decision already carried out."""
    remote = decision.rpc_servers
    # On workers, this machine's GPUs stay out (a mixed local + remote split is not done yet).
    devices = [] if remote else [inventory.by_key(k) for k in decision.devices]
    info = model.info
    extra = [*fallback_chat_template_args(info.has_chat_template, str(info.architecture), spec.args)]
    extra += default_args(spec.path, spec.args)  # an embedded model's own defaults, before the user's
    extra += embedding_args(spec.embeddings, spec.args, str(info.architecture))
    on_gpu = not remote and not decision.on_cpu
    offload = on_gpu if spec.mmproj_offload is None else spec.mmproj_offload and on_gpu
    extra += mmproj_args(model.projector.path if model.projector else None, offload)
    extra += rerank_args(spec.rerank)
    extra += _draft_args(spec, model.draft, on_gpu=on_gpu or bool(remote))
    extra += lora_args(model.adapters)
    # The binary's own needs on this CPU (its self-test's workaround: --no-repack on an AMX CPU at
    # the pinned llama.cpp) come before the user's args, so a user's --repack still wins.
    extra += binary_args
    est = decision.estimate
    if est.kv_unified and est.parallel > 1 and kv_unified_in_args(spec.args) is None:
        # An explicit --parallel turns llama-server's unified cache off: forge asks for it, so
        # that one request can use the whole context (what the estimate counted).
        extra += ["--kv-unified"]
    if spec.sleep_idle:
        extra += ["--sleep-idle-seconds", str(spec.sleep_idle)]
    extra += spec.args
    if slot_save_dir is not None:  # keep_context: the /slots save and restore actions, in this dir
        extra += ["--slot-save-path", str(slot_save_dir)]
        if est.kv_unified and est.parallel > 1 and not _names_flag(spec.args, "cache-idle-slots"):
            # With one shared cache llama-server moves an idle slot to its RAM prompt cache (and
            # clears it) whenever another task starts, where a slot save cannot see it: the
            # conversations of the other slots would not be kept.
            extra += ["--no-cache-idle-slots"]
    split = decision.tensor_split if remote or len(decision.devices) > 1 else ()
    extra += rpc_args(remote, split or ())
    # The ledger maps the child's own device names (ROCm0, CUDA0: its *visible* devices, after
    # the mask) back to our keys.
    gpus = [d for d in decision.devices if d != "cpu" and not remote]
    ledger = AllocationLedger(gpu_keys=gpus or None)
    # Unset: the layers placement decided. Set (a count, "auto", "all"): the user's, as given.
    ngl = spec.n_gpu_layers if spec.n_gpu_layers is not None or not remote else "all"
    instance = InstanceSpec(
        binary=binary,
        model_path=model.path,
        alias=name,
        # ``auto`` (and unset): the context placement sized, as the estimate has it.
        ctx_size=spec.ctx_size if isinstance(spec.ctx_size, int) and spec.ctx_size else est.ctx_size,
        n_gpu_layers=(None if decision.on_cpu else decision.n_gpu_layers) if ngl is None else ngl,
        parallel=spec.parallel or est.parallel,
        extra_args=extra,
        port=port,
        api_key=api_key,
        mask=child_env(devices, inventory, settings),
        cpu_only=not remote and all(d.vendor == "cpu" for d in devices),
        log_path=log_path,
        state_dir=state_dir,
        stall_timeout=stall_timeout,
        ready_timeout=ready_timeout,
        stop_timeout=stop_timeout,
        # llama-server prints its per-device buffer sizes (what it really allocated) only at -lv 4.
        verbosity=REQUIRED_VERBOSITY if verbosity is None else verbosity,
        line_listeners=[ledger.feed, *line_listeners],
        amx="amx_int8" in cpu_flags(),
    )
    return LaunchPlan(
        spec=instance,
        decision=decision,
        model_path=model.path,
        info=info,
        actual=ledger,
        slot_save_dir=slot_save_dir,
        projector=model.projector,
    )


def _draft_args(spec: ModelSpec, draft: ResolvedDraft | None, *, on_gpu: bool) -> list[str]:
    """The speculative-decoding flags: the draft where the estimate put it (the model's GPUs,
    else system RAM), its type, its sizes."""
    return speculative_args(
        draft.path if draft is not None else None,
        spec.speculative,
        n_max=spec.draft_max,
        n_min=spec.draft_min,
        draft_on_gpu=on_gpu and spec.draft_gpu != "cpu",
        name_type=draft is None or not draft.declares_type,
    )
