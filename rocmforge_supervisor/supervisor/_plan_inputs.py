"""What the plan reads (blocking: GGUF headers): each configured model's placement request, built
as a load builds it, without downloading anything — an ``hf:`` file is taken from the Hugging Face
cache only, an embedded model only once fetched; a model that is not there yet is planned as
"not downloaded", naming the command that fetches it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from .._errors import ForgeError, HubError
from ..binaries import locate_whisper_server
from ..binaries._locate import build_info_of
from ..config import ForgeConfig, ForgeSettings, ModelConfig
from ..config._backends import CONFIGURABLE, BackendName
from ..hardware import Inventory
from ..models import embedded_models, inspect_whisper, resolve_hf_file, resolve_model_path
from .backends.command import command_request
from .backends.whisper import whisper_request
from .launch._launch import ModelSpec, placement_request, resolve
from .placement._config_plan import ConfigPlan, PlanEntry, plan_config
from .placement._placement_types import PlacementPolicy, PlacementRequest, SizedRequest
from .placement._residency import GroupRule, Residency

__all__ = ["dry_run", "group_rules", "plan_entries", "residency_of"]


def group_rules(config: ForgeConfig) -> dict[str, GroupRule]:
    """``[groups.*]`` as placement reads them."""
    return {
        name: GroupRule(name, frozenset(g.members), max_loaded=g.max_loaded, exclusive=g.exclusive)
        for name, g in config.groups.items()
    }


def dry_run(
    config: ForgeConfig,
    settings: ForgeSettings,
    inventory: Inventory,
    *,
    binary_args: Sequence[str] = (),
    device_context: Mapping[str, int] | None = None,
) -> ConfigPlan:
    """``forge plan``: the whole config on ``inventory``, from the service's start (blocking)."""
    entries = plan_entries(config, settings, binary_args)
    policy = PlacementPolicy(device_context=dict(device_context or {}), groups=group_rules(config))
    return plan_config(inventory, entries, policy)


def residency_of(config: ForgeConfig, name: str, mc: ModelConfig | None = None) -> Residency:
    """``mc``: a model added at run time (``POST /api/models``) is not in ``config.models``."""
    mc = config.models[name] if mc is None else mc
    return Residency(
        pinned=mc.pinned,
        never_swap=mc.swap == "never",
        evict_cost=mc.evict_cost,
        group=config.group_of(name),
        default=mc.default,
    )


def _not_fetched(refs: Sequence[str | None], settings: ForgeSettings) -> str | None:
    """An embedded model's name whose file is not fetched yet (resolving it would fetch it)."""
    known = embedded_models()
    for ref in refs:
        if ref in known and not (settings.models_dir / known[ref].filename).exists():
            return ref
    return None


def plan_entries(
    config: ForgeConfig, settings: ForgeSettings, binary_args: Sequence[str] = ()
) -> list[PlanEntry]:
    """Every configured model's :class:`PlanEntry`, in config order. ``binary_args``: the flags
    every llama-server child gets on this CPU (``--no-repack``): they change its size."""
    offline = settings.model_copy(update={"hf_offline": True})  # never a download from a plan
    out = []
    for name, mc in config.models.items():
        base = PlanEntry(
            name=name,
            backend=mc.backend,
            residency=residency_of(config, name),
            preload=mc.preload,
        )
        try:
            out.append(_entry(config, name, mc, base, offline, binary_args))
        except HubError as exc:  # not in the cache: the plan does not download it
            text = exc.message.replace(", and offline mode is on", "").replace(" and offline mode is on", "")
            pull = re.search(r"`(forge pull [^`]+)`", exc.hint or "")
            hint = f"{pull.group(1)} downloads it" if pull else exc.hint
            out.append(_problem(base, f"{text} (a plan never downloads)", hint))
        except ForgeError as exc:
            out.append(_problem(base, exc.message, exc.hint))
    return out


def _problem(base: PlanEntry, problem: str, hint: str | None) -> PlanEntry:
    return replace(base, problem=problem, hint=hint)


def _entry(
    config: ForgeConfig,
    name: str,
    mc: ModelConfig,
    base: PlanEntry,
    settings: ForgeSettings,
    binary_args: Sequence[str],
) -> PlanEntry:
    return _REQUEST_OF[mc.backend](config, name, mc, base, settings, binary_args)


def _command(
    config: ForgeConfig,
    name: str,
    mc: ModelConfig,
    base: PlanEntry,
    settings: ForgeSettings,
    binary_args: Sequence[str],
) -> PlanEntry:
    return _with(base, command_request(name, mc))


def _whisper(
    config: ForgeConfig,
    name: str,
    mc: ModelConfig,
    base: PlanEntry,
    settings: ForgeSettings,
    binary_args: Sequence[str],
) -> PlanEntry:
    ref = mc.path
    path = resolve_hf_file(ref[3:], settings) if ref.startswith("hf:") else resolve_model_path(ref, settings)
    try:
        meta = build_info_of(locate_whisper_server(settings))
        gpu_capable = meta is None or meta.get("backend") not in ("cpu", None)
    except ForgeError:
        gpu_capable = True  # no whisper-server built yet: placed as a GPU build would be
    return _with(base, whisper_request(name, inspect_whisper(path), mc.gpu, gpu_capable=gpu_capable))


def _llama(
    config: ForgeConfig,
    name: str,
    mc: ModelConfig,
    base: PlanEntry,
    settings: ForgeSettings,
    binary_args: Sequence[str],
) -> PlanEntry:
    spec = ModelSpec.from_config(mc, workers_configured=bool(config.workers), defaults=config.supervisor)
    if spec.workers in ("only", "all"):
        return _problem(
            base,
            f'{name} goes to RPC workers (workers = "{spec.workers}"): they are not probed by a plan',
            "forge ps shows their shares once it is loaded",
        )
    missing = _not_fetched([spec.path, spec.draft], settings)
    if missing is not None:
        return _problem(base, f"{missing} is not fetched yet", f"forge pull {missing} fetches it")
    model = resolve(spec, settings)
    return _with(base, placement_request(spec, name, model, binary_args))


#: How the plan builds each backend's placement request, as its launch pipeline does (the
#: backends table's ``plan`` functions, without the placing and the spawning).
_REQUEST_OF: Mapping[BackendName, Callable[..., PlanEntry]] = {
    "llama": _llama,
    "whisper": _whisper,
    "command": _command,
}
assert tuple(_REQUEST_OF) == CONFIGURABLE, "one way to plan each backend a [models.*] entry may name"


def _with(base: PlanEntry, request: PlacementRequest | SizedRequest) -> PlanEntry:
    return replace(base, request=request)
