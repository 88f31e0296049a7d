"""``forge plan``: the whole config placed on this machine's devices, without starting anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from .._errors import BinaryNotFound, ForgeError
from .._units import format_bytes
from ._common import console, err_console, get_settings

if TYPE_CHECKING:
    from ..config import ForgeSettings

__all__ = ["register", "render_plan"]

#: The estimate's parts, as columns (in MiB); a part no model has is left out.
_PARTS = (
    ("weights", "weights_bytes"),
    ("KV", "kv_bytes"),
    ("compute", "compute_bytes"),
    ("output", "output_bytes"),
    ("projector", "projector_bytes"),
    ("draft", "draft_bytes"),
    ("device ctx", "context_bytes"),
)
_MIB = 1024 * 1024


def _mib(n: object) -> str:
    return f"{n / _MIB:,.0f}" if isinstance(n, int) and n else "-"


def _ctx(row: dict[str, Any]) -> str:
    """Tokens one request can use, ``auto`` when ``ctx_size = "auto"`` chose it."""
    per = row.get("ctx_per_request")
    if per is None:
        return "-"
    auto = row.get("context") is not None
    return f"{per} auto" if auto else str(per)


def _unloads(row: dict[str, Any]) -> str:
    return ", ".join(row.get("evict") or []) or "-"


def render_plan(plan: dict[str, Any], source: str) -> None:
    """The plan as a table, then what cannot be loaded together, then the refusals with the
    changes that would make each model fit."""
    from rich.table import Table  # start-up time: commands import what they use

    devices = "; ".join(
        f"{d['key']} ({d['name']}) {format_bytes(int(d['free_bytes']))} free of {format_bytes(int(d['total_bytes']))}"
        for d in plan["devices"]
    )
    console.print(f"{source} on {devices}", markup=False, highlight=False)
    loaded = plan.get("loaded") or []
    if plan.get("start_from") == "running":
        console.print(f"loaded now: {', '.join(loaded) or 'none'}", markup=False, highlight=False)
    else:
        console.print(
            f"loaded at the start: {', '.join(loaded) or 'none'} (preload, default); "
            "every other model is placed as its first request would load it",
            markup=False,
            highlight=False,
        )
    rows = plan["models"]
    shown = [(label, key) for label, key in _PARTS if any((r.get("estimate") or {}).get(key) for r in rows)]
    table = Table(
        "model",
        "state",
        "on",
        "ctx/request",
        *(label for label, _ in shown),
        "total",
        "unloads",
        title="memory estimate in MiB",
        title_justify="left",
    )
    for r in rows:
        est = r.get("estimate") or {}
        where = ",".join(r.get("devices") or []) or "-"
        table.add_row(
            *(
                escape(c)
                for c in (
                    str(r["name"]),
                    str(r["state"]),
                    where,
                    _ctx(r),
                    *(_mib(est.get(key)) for _, key in shown),
                    _mib(est.get("total_bytes")),
                    _unloads(r),
                )
            )
        )
    console.print(table)
    together = plan.get("cannot_load_together") or []
    if together:
        console.print("cannot be loaded together:", markup=False, highlight=False)
        for t in together:
            console.print(f"  {t['text']}", markup=False, highlight=False)
    for r in rows:
        if r.get("note"):
            console.print(f"{r['name']}: {r['note']}", markup=False, highlight=False)
    for r in rows:
        auto = r.get("context")
        if auto is not None and r["state"] in ("at start", "on request", "loaded"):
            console.print(f"{r['name']}: {_auto_line(auto)}", markup=False, highlight=False)
    for r in rows:
        if not r.get("error"):
            continue
        advice = r.get("advice") or []
        # The changes computed here replace the refusal's own hint where there are some.
        hint = f" — {r['hint']}" if r.get("hint") and not advice else ""
        console.print(f"{r['name']}: {r['error']}{hint}", markup=False, highlight=False)
        if advice:
            tips = "; or ".join(a["text"] for a in advice)
            console.print(f"  it would fit with: {tips}", markup=False, highlight=False)
        elif r.get("state") == "does not fit" and r.get("backend") == "llama":
            console.print(
                "  no single change (context, KV cache, GPU layers, quantization) makes it fit here",
                markup=False,
                highlight=False,
            )


def _auto_line(auto: dict[str, Any]) -> str:
    """``ctx_size auto: 40960 tokens per request, the most that fits (ctx_min 2048)``."""
    limit = "its trained context" if auto["limit"] == "trained" else "the most that fits"
    split = not auto["kv_unified"] and auto["parallel"] > 1
    slots = f" ({auto['ctx_size']} for its {auto['parallel']} slots)" if split else ""
    return (
        f"ctx_size auto: {auto['per_request']} tokens per request{slots}, {limit} (ctx_min {auto['ctx_min']})"
    )


def _binary_args(settings: ForgeSettings) -> tuple[tuple[str, ...], str | None]:
    """The flags every llama-server child gets on this CPU (its self-test's, as the service's
    children get them), and a note when there is no llama-server to ask yet."""
    from ..binaries import locate_llama_server

    try:
        return tuple(locate_llama_server(settings).child_args), None
    except BinaryNotFound as exc:
        return (), f"note: {exc.message}: estimated without its flags on this CPU"


def plan(
    config: Path | None = typer.Option(
        None, "--config", help="The forge.toml (default: XDG config, then /etc/rocmforge)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Place every model of the config on this machine's devices, without starting anything.

    For each model: where it would go, its memory estimate by part, the context ctx_size = "auto"
    would choose, and which models its load would unload, from the state the service starts in
    (its preload models and the warm default). Then which models cannot be loaded together
    (groups, pinned and never-swap models, memory), and for a model that fits nowhere the
    smallest changes that would make it fit. A running service answers the same for its own
    state at GET /api/plan."""
    from ..config import load_config
    from ..hardware import detect
    from ..supervisor import dry_run
    from ..supervisor.placement._device_context import CONTEXT_FILE, DeviceContexts

    settings = get_settings()
    cfg = load_config(config, settings)
    settings = cfg.settings
    inventory = detect(settings)
    binary_args, note = _binary_args(settings)
    contexts = DeviceContexts(settings.cache_dir / CONTEXT_FILE).for_devices(inventory.devices)
    result = dry_run(cfg, settings, inventory, binary_args=binary_args, device_context=contexts)
    body = result.to_json()
    if as_json:
        console.print_json(json.dumps({"config": str(cfg.source) if cfg.source else None, **body}))
    else:
        render_plan(body, f"config {cfg.source}" if cfg.source else "config from the FORGE_* environment")
    if note:
        err_console.print(note, markup=False)
    if _service_runs(config):
        err_console.print(
            "note: a forge service runs with this config: its models' memory counts as used here "
            "(GET /api/plan asks the service, which plans beside them)",
            markup=False,
        )


def _service_runs(config: Path | None) -> bool:
    """Whether a forge service answers for this config's state directory."""
    from ._serve import connect_service

    try:
        client = connect_service(config, required=False)
    except ForgeError:
        return False
    if client is None:
        return False
    client.close()
    return True


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
